"""A draft model as a proposer: k one-token calls of a small graph sharing the target's vocabulary,
each token sampled from the draft's own (equally warped) law q."""
from __future__ import annotations

import time

import numpy as np

from ..prefix import PrefixCache
from ..sampling import confidence, greedy_tokens, probs, sample
from .base import Proposal


class DraftModel:
    name = "draft"

    def __init__(self, engine, *, vocab_size: int, prefix: PrefixCache):
        self.engine, self.vocab_size, self.prefix = engine, vocab_size, prefix

    def enabled(self, cfg) -> bool:
        return True

    def begin(self, ids: list[int], cfg, stats) -> None:
        stats.draft_reused_tokens = self.prefix.restore(self.name, self.engine, ids, cfg)

    def propose(self, tokens: list[int], k: int, *, cfg, rng: np.random.Generator, stats) -> Proposal | None:
        """Up to k tokens, one call each; stops early once the product of the draft's confidences (its
        own estimate that all of them are accepted) falls below cfg.draft_confidence."""
        params, greedy = cfg.sampling, cfg.sampling.greedy
        drafts: list[int] = []
        q = np.empty((0 if greedy else k, self.vocab_size), dtype=np.float32)   # [k, vocab]
        reach = 1.0
        for i in range(k):
            t0 = time.perf_counter()
            logits = self._next(drafts[-1]) if drafts else self._first(tokens)    # [1, vocab]
            stats.seconds_draft += time.perf_counter() - t0
            stats.draft_calls += 1
            if greedy:       # a point mass at the argmax: q is never materialised
                drafts.append(int(greedy_tokens(logits, params, history=tokens, drafts=drafts, first=i)[0]))
                if cfg.draft_confidence > 0:      # a softmax over the vocab: skipped when unused
                    reach *= confidence(logits[0])
            else:
                q[i] = probs(logits, params, history=tokens, drafts=drafts, first=i)[0]
                drafts.append(sample(q[i], rng))
                reach *= q[i].max()
            if reach < cfg.draft_confidence:
                break
        return Proposal(drafts, q[:len(drafts)], self.name) if drafts else None

    def _first(self, tokens: list[int]) -> np.ndarray:
        """The logits after the committed tokens: the cache catches up (1 token; more after a bonus
        token or rounds another proposer drafted)."""
        return self.engine.run(np.asarray(tokens[self.engine.length:]), keep=1)

    def _next(self, token: int) -> np.ndarray:
        return self.engine.run(np.asarray([token]), keep=1)

    def commit(self, tokens: list[int], new: int) -> None:
        self.engine.truncate(min(self.engine.length, len(tokens) - 1))

    def end(self, tokens: list[int]) -> None:
        self.prefix.record(self.name, self.engine, tokens)
