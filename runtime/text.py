"""Incremental detokenization for streaming: UTF-8-safe and stop strings that never leak in part."""
from __future__ import annotations

REPLACEMENT = "\ufffd"   # what byte-level decoders emit for an incomplete UTF-8 sequence


class TextStream:
    """Feed committed token ids; get back the text that is safe to show.

    Decoding is incremental (as in HF's TextStreamer and vLLM): only the ids since the last
    complete character are decoded, together with the chunk before them as an anchor, so that
    tokenizers that treat a leading token specially (SentencePiece's leading space) still decode
    every token in context. A character split across tokens decodes to U+FFFD until its last byte
    arrives, so such a tail is not committed yet. The last (longest stop string - 1) characters are
    held back too: they may be the start of a stop string that the next tokens complete.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""           # decoded text of complete characters (cut at a stop string once found)
        self.emitted = 0         # characters of self.text already handed out
        self.stopped = False
        self._prefix = 0         # ids[_prefix:_read] is the anchor chunk; ids[:_read] make up self.text
        self._read = 0

    def push(self, ids) -> str:
        """Add committed ids; return newly safe text. Sets `stopped` when a stop string appears."""
        if self.stopped:
            return ""
        known = len(self.ids)
        self.ids.extend(int(i) for i in ids)
        text, complete = self._text_through(len(self.ids))
        start = max(0, self.emitted - self.hold)
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.ids = self.ids[:self._ids_through_stop(known, start)]
            self.text = text[:min(hits)]
            self.stopped = True
            return self._emit(len(self.text))
        if complete:
            self.text, self._prefix, self._read = text, self._read, len(self.ids)
        return self._emit(len(self.text) - self.hold)

    def flush(self) -> str:
        """At the end of generation: whatever is left (incomplete bytes stay as U+FFFD)."""
        if not self.stopped and self._read < len(self.ids):
            self.text, _ = self._text_through(len(self.ids))
        return self._emit(len(self.text))

    def _decode(self, a: int, b: int) -> str:
        return self.tokenizer.decode(self.ids[a:b], skip_special_tokens=True)

    def _text_through(self, end: int) -> tuple[str, bool]:
        """self.text extended by ids[_read:end], and whether it ends on a complete character."""
        anchor = self._decode(self._prefix, self._read)
        full = self._decode(self._prefix, end)
        return self.text + full[len(anchor):], not full.endswith(REPLACEMENT)

    def _ids_through_stop(self, known: int, start: int) -> int:
        """The fewest ids whose text holds a stop string (the first `known` ids do not)."""
        for j in range(known + 1, len(self.ids) + 1):
            text, _ = self._text_through(j)
            if any(text.find(s, start) >= 0 for s in self.stop):
                return j
        return len(self.ids)

    def _emit(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        piece = self.text[self.emitted:end]
        self.emitted = end
        return piece
