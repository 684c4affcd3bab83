"""A hidden-state draft head as a proposer (EAGLE, Li et al. 2024): one decoder layer that reads the
target's final hidden state with the next token and predicts the next hidden state.

Position j of the head's cache holds (token j+1, the target's feature after token j). Each round the
head first catches up on the committed positions with the target's real features (the target engine
keeps them per position, valid up to its cache's length, so rollback and prefix reuse hold for them
too), then drafts on its own predicted features. Positions computed on predicted features are rolled
back at commit: the next round recomputes them from the target's.
"""
from __future__ import annotations

import numpy as np

from .draft_model import DraftModel

FEATURES_IN = "target_hidden_states"


class HiddenStateHead(DraftModel):
    def __init__(self, engine, *, target, vocab_size: int, prefix):
        super().__init__(engine, vocab_size=vocab_size, prefix=prefix)
        self.target = target
        self._real = 0                  # head positions computed on real target features

    def begin(self, ids: list[int], cfg, stats) -> None:
        held = self.prefix.reusable(self.name, self.engine, ids, cfg, offset=1)
        self.engine.truncate(held)      # the rest is fed by the first propose, from the target's features
        self._real = held
        stats.draft_reused_tokens = held

    def _first(self, tokens: list[int]) -> np.ndarray:
        start, stop = self.engine.length, len(tokens) - 1   # the target holds features of tokens[:-1]
        feats = self.target.features[None, start:stop]
        logits = self.engine.run(np.asarray(tokens[start + 1:stop + 1]), keep=1, inputs={FEATURES_IN: feats})
        self._real = stop
        return logits

    def _next(self, token: int) -> np.ndarray:
        predicted = self.engine.features[None, self.engine.length - 1:self.engine.length]
        return self.engine.run(np.asarray([token]), keep=1, inputs={FEATURES_IN: predicted})

    def commit(self, tokens: list[int], new: int) -> None:
        self.engine.truncate(min(self.engine.length, self._real, len(tokens) - 2))
        self._real = self.engine.length

    def end(self, tokens: list[int]) -> None:
        self.prefix.record(self.name, self.engine, tokens, offset=1)
