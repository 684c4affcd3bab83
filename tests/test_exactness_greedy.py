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


def test_top_p_matches_a_full_sort():
    """The candidate shortcut keeps exactly the tokens a full sort keeps, peaked or flat rows."""
    from specedge.runtime import SamplingParams, probs
    rng = np.random.default_rng(3)
    for scale in (0.1, 1.0, 4.0, 12.0):          # flat rows fall back to the full sort
        logits = (rng.normal(size=(3, 5000)) * scale).astype(np.float32)
        for top_p in (0.05, 0.5, 0.9, 0.999):
            got = probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
            full = probs(logits, SamplingParams(temperature=1.0))
            for g, f in zip(got, full):
                order = np.argsort(-f, kind="stable")
                keep = order[np.cumsum(f[order]) - f[order] < top_p]
                ref = np.zeros_like(f)
                ref[keep] = f[keep] / f[keep].sum()
                assert np.allclose(g, ref, atol=1e-6) and set(np.flatnonzero(g)) == set(keep)
