"""Prompt lookup as a proposer: the tokens that followed the latest earlier occurrence of the
context's last n-gram (runtime/ngram.py), as point masses (q one-hot), with no model call."""
from __future__ import annotations

import numpy as np

from ..ngram import NgramLookup
from .base import Proposal


class PromptLookup:
    name = "lookup"

    def __init__(self, *, vocab_size: int, capacity: int):
        self.vocab_size, self.capacity = vocab_size, capacity
        self._table: NgramLookup | None = None

    def enabled(self, cfg) -> bool:
        return cfg.ngram > 0

    def begin(self, ids: list[int], cfg, stats) -> None:
        self._table = NgramLookup(ids, max_n=cfg.ngram, min_n=cfg.ngram_min, capacity=self.capacity)

    def propose(self, tokens: list[int], k: int, *, cfg, rng, stats) -> Proposal | None:
        drafts = self._table.propose(k)
        if not drafts:
            return None
        q = np.zeros((0 if cfg.sampling.greedy else len(drafts), self.vocab_size), dtype=np.float32)
        q[np.arange(len(q)), drafts[:len(q)]] = 1.0
        return Proposal(drafts, q, self.name)

    def commit(self, tokens: list[int], new: int) -> None:
        self._table.extend(tokens[len(tokens) - new:])

    def end(self, tokens: list[int]) -> None:
        self._table = None
