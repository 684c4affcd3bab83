"""Prompt-lookup drafting: draft the tokens that followed the latest earlier occurrence of the
context's last n tokens (Saxena 2023, "prompt lookup decoding"; vLLM's and transformers' n-gram
proposers work the same way). Pure numpy, no model and no I/O.

Code repeats itself -- identifiers, call patterns, the lines an edit keeps -- so a match often
predicts several tokens, for microseconds instead of a draft model's k calls. A lookup draft is a
point mass: its q is one-hot, and accept() keeps the output law exactly the target's (it accepts x
with probability p(x), and a rejection samples from p with x removed).
"""
from __future__ import annotations

import numpy as np


def lookup(history: np.ndarray, *, max_n: int, min_n: int, k: int) -> np.ndarray:
    """Up to k tokens [<= k] that followed the latest earlier occurrence of history's last n tokens,
    for the longest n in [min_n, max_n] that occurs; empty when none does.

    Candidates are the earlier positions e holding the last token; a candidate's match length is how
    far history[..e] agrees with history's end, backwards. The continuation starts at e + 1 < len."""
    h = history
    last = len(h) - 1
    if last < min_n or k < 1:          # an n-gram needs n tokens before it and one after its match
        return h[:0]
    ends = np.flatnonzero(h[:last] == h[last])                       # [m] candidate match ends
    if not len(ends):
        return h[:0]
    length = np.ones(len(ends), dtype=np.int64)                      # [m] match lengths so far
    for j in range(1, min(max_n, last)):     # j < last: e >= j and e < last
        ok = (length == j) & (ends >= j)
        ok[ok] = h[ends[ok] - j] == h[last - j]
        if not ok.any():
            break
        length += ok
    best = int(length.max())
    if best < min_n:
        return h[:0]
    e = int(ends[np.flatnonzero(length == best)[-1]])                # the latest of the longest
    return h[e + 1:e + 1 + k]


class NgramLookup:
    """The committed tokens of one request in a preallocated int32 buffer: a round's lookup reads
    a view, with no list -> array conversion of the whole context (a cost that grows with it)."""

    def __init__(self, ids, *, max_n: int, min_n: int, capacity: int):
        self.max_n, self.min_n = max_n, min_n
        self._buf = np.empty(max(capacity, len(ids)), dtype=np.int32)
        self._len = 0
        self.extend(ids)

    def extend(self, ids) -> None:
        n = len(ids)
        if self._len + n > len(self._buf):
            self._buf = np.concatenate([self._buf[:self._len], np.empty(self._len + 2 * n, dtype=np.int32)])
        self._buf[self._len:self._len + n] = ids
        self._len += n

    def propose(self, k: int) -> list[int]:
        return lookup(self._buf[:self._len], max_n=self.max_n, min_n=self.min_n, k=k).tolist()
