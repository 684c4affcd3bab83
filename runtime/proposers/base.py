"""The proposer protocol: propose k tokens with their q given the context; learn what was committed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Proposal:
    tokens: list[int]          # up to k draft tokens continuing the committed context
    q: np.ndarray              # [len(tokens), vocab]: the law each was drawn from ([0, vocab] when greedy:
                               # greedy acceptance never reads q)
    source: str                # the proposer's name, for the per-proposer statistics


class Proposer(Protocol):
    name: str

    def enabled(self, cfg) -> bool:
        """Whether this proposer drafts for a request with GenerationConfig `cfg`."""

    def begin(self, ids: list[int], cfg, stats) -> None:
        """A request starts from prompt `ids`: build per-request state (a model proposer prefills its
        cache with all of them but the last)."""

    def propose(self, tokens: list[int], k: int, *, cfg, rng: np.random.Generator, stats) -> Proposal | None:
        """Up to k tokens continuing `tokens` (committed), or None to let the next proposer try."""

    def commit(self, tokens: list[int], new: int) -> None:
        """The last `new` of the committed `tokens` are new this round: learn them and roll back any
        state beyond what was committed."""

    def end(self, tokens: list[int]) -> None:
        """The request finished with these committed tokens (not called for one abandoned or failed)."""
