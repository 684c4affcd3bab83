"""accept_greedy is accept() on point masses: same tokens, same count, for any draft and target."""
from __future__ import annotations

import numpy as np

from specedge.runtime.sampling import accept, accept_greedy


def test_accept_greedy_equals_accept_on_point_masses():
    rng = np.random.default_rng(0)
    vocab = 5
    for _ in range(2000):
        k = int(rng.integers(0, 6))
        drafts = list(rng.integers(0, vocab, size=k))
        target = rng.integers(0, vocab, size=k + 1)
        if rng.random() < 0.5:                # often agree, so long accepted runs are covered
            target[:k] = drafts
            target[int(rng.integers(0, k + 1))] = rng.integers(0, vocab)
        q = np.eye(vocab)[drafts].reshape(k, vocab)         # [k, vocab]
        p = np.eye(vocab)[target]                           # [k+1, vocab]
        assert accept_greedy(drafts, target) == accept(drafts, q, p, rng)
