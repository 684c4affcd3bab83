"""Incremental detokenization for streaming: UTF-8-safe and stop strings that never leak in part."""
from __future__ import annotations

REPLACEMENT = "\ufffd"   # what byte-level decoders emit for an incomplete UTF-8 sequence


class TextStream:
    """Feed committed token ids; get back the text that is safe to show.

    A character split across tokens decodes to U+FFFD until its last byte arrives, so trailing
    U+FFFD is held back. The last (longest stop string - 1) characters are held back too, since
    they may be the start of a stop string that the next tokens complete.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""           # everything decoded so far (up to a stop string, once found)
        self.emitted = 0         # characters of self.text already handed out
        self.stopped = False

    def push(self, ids) -> str:
        """Add committed ids; return newly safe text. Sets `stopped` when a stop string appears."""
        self.ids.extend(int(i) for i in ids)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        start = max(0, self.emitted - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True
            self.ids = self._ids_through_stop(len(self.ids) - len(ids))
            return self._emit(len(self.text))
        safe = len(self.text.rstrip(REPLACEMENT)) - self.hold
        return self._emit(safe)

    def _ids_through_stop(self, known: int) -> list[int]:
        """The fewest ids whose text holds a stop string (the first `known` ids do not)."""
        for j in range(known + 1, len(self.ids) + 1):
            text = self.tokenizer.decode(self.ids[:j], skip_special_tokens=True)
            if any(s in text for s in self.stop):
                return self.ids[:j]
        return self.ids

    def flush(self) -> str:
        """At the end of generation: whatever is left (incomplete bytes stay as U+FFFD)."""
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        if end <= self.emitted:
            return ""
        piece = self.text[self.emitted:end]
        self.emitted = end
        return piece
