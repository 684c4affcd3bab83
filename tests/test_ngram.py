"""Prompt-lookup drafting: the lookup itself, and the loop's output with it (greedy identity; the
sampled law is in test_exactness.py)."""
from __future__ import annotations

import numpy as np
import pytest

from specedge.runtime import ConfigError, SpeculativeDecoder
from specedge.runtime.cli import main as run_main
from specedge.runtime.ngram import NgramLookup, lookup


def brute_force(h: np.ndarray, max_n: int, min_n: int, k: int) -> np.ndarray:
    """Longest n first; for that n the latest earlier start whose n tokens equal the last n."""
    for n in range(max_n, min_n - 1, -1):
        starts = [s for s in range(len(h) - n) if (h[s:s + n] == h[len(h) - n:]).all()]
        if starts:
            return h[starts[-1] + n:starts[-1] + n + k]
    return h[:0]


def test_lookup_examples():
    h = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 4, 2, 3])
    assert lookup(h, max_n=3, min_n=2, k=4).tolist() == [7, 4, 2, 3]     # (2, 3) latest; (4, 2, 3) never
    assert lookup(h, max_n=3, min_n=3, k=4).tolist() == []
    assert lookup(h, max_n=3, min_n=1, k=2).tolist() == [7, 4]
    loop = np.array([1, 2, 3, 1, 2, 3, 1, 2])
    assert lookup(loop, max_n=3, min_n=2, k=5).tolist() == [3, 1, 2]       # the continuation ends at the end
    assert lookup(np.array([7]), max_n=3, min_n=1, k=4).tolist() == []
    assert lookup(np.array([7, 7]), max_n=3, min_n=1, k=4).tolist() == [7]


def test_lookup_equals_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        h = rng.integers(0, 4, size=int(rng.integers(1, 40)))
        max_n = int(rng.integers(1, 6))
        min_n, k = int(rng.integers(1, max_n + 1)), int(rng.integers(1, 6))
        assert lookup(h, max_n=max_n, min_n=min_n, k=k).tolist() == brute_force(h, max_n, min_n, k).tolist()


def test_lookup_buffer_grows_past_its_capacity():
    lk = NgramLookup([1, 2, 3], max_n=2, min_n=2, capacity=4)
    for t in [9, 1, 2, 8, 8, 8, 1, 2]:
        lk.extend([t])
    assert lk.propose(3) == [8, 8, 8]       # (1, 2) last began at 4: its successors, not those of 0


PROMPTS = [list(np.random.default_rng(i).integers(0, 256, size=3 + (i * 5) % 17)) for i in range(12)]
PROMPTS += [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 2, 3] * 6]     # prompts that repeat themselves


@pytest.mark.parametrize("draft", ["agree", "disagree", None])
def test_greedy_identity_with_prompt_lookup(pair_bundles, draft):
    """With prompt lookup, alone (no draft model) or beside either draft, greedy output is the
    target's own; lookup rounds happen, and beside a draft so do model rounds after them (the draft's
    cache catching up over several tokens)."""
    dec = SpeculativeDecoder.from_bundle(pair_bundles[draft or "agree"], threads=1, speculative=True)
    if draft is None:
        dec = SpeculativeDecoder(target=dec.target, draft=None, tokenizer=dec.tokenizer, vocab_size=dec.vocab_size,
                                 eos_token_ids=dec.eos, max_context=dec.max_context,
                                 max_draft_tokens=dec.max_draft_tokens)
    lookup_rounds = lookup_accepted = draft_calls = 0
    for prompt in PROMPTS:
        plain = dec.generate(prompt, max_new_tokens=32, speculative=False).token_ids
        for k, n, n_min in [(1, 3, 2), (4, 3, 1), (8, 2, 2), (8, 5, 3)]:
            res = dec.generate(prompt, max_new_tokens=32, k=k, ngram=n, ngram_min=n_min)
            assert res.token_ids == plain, f"k={k} ngram={n}..{n_min} diverged from target-only greedy"
            s = res.stats
            assert s.lookup_accepted <= s.accepted and s.lookup_evaluated <= s.evaluated
            lookup_rounds += s.lookup_rounds
            lookup_accepted += s.lookup_accepted
            draft_calls += s.draft_calls
    assert lookup_rounds > 0 and lookup_accepted > 0
    assert (draft_calls > 0) == (draft is not None)


def test_prompt_lookup_off_changes_nothing(pair_bundles):
    dec = SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=1, speculative=True)
    a = dec.generate(PROMPTS[-1], max_new_tokens=24, k=4, temperature=0.9, seed=3)
    b = dec.generate(PROMPTS[-1], max_new_tokens=24, k=4, temperature=0.9, seed=3, ngram=0)
    assert a.token_ids == b.token_ids and a.stats.lookup_rounds == b.stats.lookup_rounds == 0


def test_bad_prompt_lookup_parameters(pair_bundles, capsys):
    dec = SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=1)
    for kwargs, match in [({"ngram": -1}, "ngram .* >= 0"), ({"ngram": True}, "ngram"),
                          ({"ngram_min": 0}, "ngram_min"), ({"ngram": 2, "ngram_min": 3}, "must be >= ngram_min"),
                          ({"ngram": 3, "k": 9}, "max draft tokens")]:
        with pytest.raises(ConfigError, match=match):
            dec.generate("x", **kwargs)
    assert run_main([str(pair_bundles["agree"]), "x", "--ngram", "2", "--ngram-min", "3"]) == 2
    assert "ngram_min" in capsys.readouterr().err
