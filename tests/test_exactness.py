"""Speculative sampling must be *exact*: its output law is the target's, whatever the draft is.

Every statistical check here is a chi-square goodness-of-fit test against an analytic law. Bins are
formed from the analytic probabilities alone (never from the data), so the test is valid; cells of
probability zero must be observed exactly zero times. All chi-square cases in this file share one
Bonferroni budget, so the whole file fails by chance with probability <= FAMILY_ALPHA.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats

from specedge.runtime.config import SamplingParams
from specedge.runtime.gof import accept_law, chi2_fit, merge_bins
from specedge.runtime.sampling import accept, probs, sample

from conftest import make_model

V = 6                    # unit-test vocab: small enough that every output sequence can be enumerated
N_UNIT = 50_000          # accept() calls per unit case (~0.4 s each)
N_E2E = 10_000           # generate() calls per end-to-end case (~1 ms each)


def _rows(rng, n, alpha=1.0):
    return rng.dirichlet(np.full(V, alpha), n)


def _unit_cases():
    """(q [k, V], p [k+1, V]) pairs covering the regimes where a wrong residual would show."""
    rng = np.random.default_rng(20240601)
    p3 = _rows(rng, 4)
    close = (0.9 * p3[:3] + 0.1 * _rows(rng, 3)), p3                     # q ~ p: mostly accepted
    far = _rows(rng, 3, 0.3), _rows(rng, 4, 0.3)                          # peaky, unrelated q and p
    k1_far = _rows(rng, 1, 0.3), _rows(rng, 2, 0.3)
    disjoint = (np.array([[0, 0, .2, .3, .25, .25], [.2, .2, .2, .2, .2, 0]]),   # q = 0 where p > 0 and
                np.array([[.3, .3, .2, .2, 0, 0], [0, .5, 0, .5, 0, 0], [.1, .2, .3, .4, 0, 0]]))  # vice versa
    p2 = _rows(rng, 3)
    equal = p2[:2].copy(), p2                                             # nothing is ever rejected
    onehot = np.eye(V)[[1, 4, 2, 0]]                                      # greedy target rows
    greedy_target = _rows(rng, 3), onehot                                 # sampled draft, greedy target
    greedy_both = np.eye(V)[[1, 3, 5]], onehot                            # accept, reject, (unreached)
    lookup = np.eye(V)[[2, 2, 5]], _rows(rng, 4)                          # prompt-lookup drafts: point masses
    return {"close": close, "far": far, "k1-far": k1_far, "disjoint-support": disjoint, "p-equals-q": equal,
            "greedy-target": greedy_target, "greedy-both": greedy_both, "lookup-drafts": lookup}


UNIT_CASES = _unit_cases()
E2E_CASES = {"spec-T1": (True, SamplingParams(temperature=1.0), 0.0),
             "plain-T1": (False, SamplingParams(temperature=1.0), 0.0),
             "spec-warped": (True, SamplingParams(temperature=0.8, top_k=6, repetition_penalty=1.3), 0.0),
             # rounds that stop drafting early are exact too: the draft's top probability after PROMPT
             # lies in (0.3, 0.45), so with 0.45 every first round stops after one draft
             "spec-T1-early-stop": (True, SamplingParams(temperature=1.0), 0.45),
             # prompt lookup beside the draft model: PROMPT_LOOKUP's last token occurred before, so the
             # first round drafts by lookup; later rounds by lookup or by the model (catching up)
             "lookup-T1": (True, SamplingParams(temperature=1.0), 0.0)}
PROMPT_LOOKUP = [3, 1, 4, 1]
N_CHI2 = 2 * len(UNIT_CASES) + len(E2E_CASES) + 1  # each unit case checks two laws; + sample()
FAMILY_ALPHA = 1e-6
ALPHA = FAMILY_ALPHA / N_CHI2


# -- chi-square machinery (specedge.runtime.gof: spec-check judges with the same) ------------------
def chi2_test(law: dict, seen: Counter, label: str) -> float:
    """Assert zero-probability cells are never seen; return the chi-square p-value (1 if df = 0)."""
    fit = chi2_fit(law, seen)
    assert not fit.impossible, f"{label}: outcomes of probability 0 were produced: {fit.impossible}"
    assert abs(fit.p_value - (stats.chi2.sf(fit.stat, fit.df) if fit.df else 1.0)) < 1e-9   # df 0: p is 1
    print(f"{label}: chi2 {fit.stat:.1f} on {fit.df} df, p = {fit.p_value:.3g} (threshold {ALPHA:.2g})")
    return fit.p_value


def test_sample_is_exact_across_blocks():
    """sample() draws through 128-token blocks: a law spread over full, empty and ragged blocks (400
    tokens: 3 x 128 + 16), with zero cells inside blocks, must come out exact."""
    rng = np.random.default_rng(7)
    law = rng.random(400) * (rng.random(400) < 0.6)
    law[:128] = 0.0                                # a whole empty block before any mass
    law[256:384] = 0.0                             # and one between
    law[399] = 0.05                                # the last token of the ragged block
    law = (law / law.sum()).astype(np.float32)
    seen = Counter(sample(law, rng) for _ in range(100_000))
    exact = law.astype(np.float64) / law.astype(np.float64).sum()
    assert chi2_test({x: float(exact[x]) for x in range(400)}, seen, "sample over blocks") > ALPHA
    for n, pos in [(1, 0), (128, 127), (129, 128), (8192, 0), (8192, 8191)]:   # point masses at block edges
        point = np.zeros(n, np.float32)
        point[pos] = 1.0
        assert {sample(point, rng) for _ in range(50)} == {pos}


def accept_wrong(draft_tokens, q, p, rng):
    """Negative control: on rejection resample from p instead of the residual (a classic mistake)."""
    for i, x in enumerate(draft_tokens):
        if rng.random() * q[i, x] >= p[i, x]:
            return list(draft_tokens[:i]) + [sample(p[i], rng)], i
    return list(draft_tokens) + [sample(p[len(draft_tokens)], rng)], len(draft_tokens)


def run_accept(fn, q, p, n, seed) -> Counter:
    rng = np.random.default_rng(seed)
    drafts = np.stack([rng.choice(V, size=n, p=row) for row in q], axis=1).tolist()  # x_i ~ q_i
    seen = Counter()
    for d in drafts:
        tokens, m = fn(d, q, p, rng)
        assert len(tokens) == m + 1 and tokens[:m] == d[:m]
        seen[tuple(tokens)] += 1
    return seen


def first_token(seen: Counter) -> Counter:
    out = Counter()
    for seq, c in seen.items():
        out[seq[0]] += c
    return out


@pytest.mark.parametrize("name", UNIT_CASES)
def test_accept_is_exact(name):
    q, p = UNIT_CASES[name]
    seen = run_accept(accept, q, p, N_UNIT, seed=list(UNIT_CASES).index(name))
    assert chi2_test({x: p[0, x] for x in range(V)}, first_token(seen), f"{name} first token") > ALPHA
    assert chi2_test(accept_law(q, p), seen, f"{name} full output") > ALPHA


def test_negative_control_is_rejected():
    """The same test at the same threshold must catch a wrong residual; prove it has the power to."""
    q, p = UNIT_CASES["far"]
    null = {x: p[0, x] for x in range(V)}
    beta = 1 - np.minimum(p[0], q[0]).sum()                       # rejection probability at step 0
    wrong = np.minimum(p[0], q[0]) + beta * p[0]                  # the wrong rule's first-token law
    bins = merge_bins(null, N_UNIT)
    p_b, w_b = (np.array([sum(law[c] for c in b) for b in bins]) for law in (p[0], wrong))
    df = len(bins) - 1
    lam = N_UNIT * ((w_b - p_b) ** 2 / p_b).sum()                 # noncentrality under the wrong law
    miss = float(stats.ncx2.cdf(stats.chi2.isf(ALPHA, df), df, lam))
    power = 1 - miss
    print(f"negative control: noncentrality {lam:.0f} on {df} df, power 1 - {miss:.2g} at alpha {ALPHA:.2g}")
    assert power >= 1 - FAMILY_ALPHA    # stricter than 0.999: a missed rejection is as rare as a false one
    seen = run_accept(accept_wrong, q, p, N_UNIT, seed=7)
    assert chi2_test(null, first_token(seen), "negative control first token") < ALPHA


# -- end to end: the decoder's first two tokens ----------------------------------------------------
PROMPT = [3, 1, 4]
E2E_VOCAB = 8


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """An 8-token target and an unrelated 1-layer draft (q far from p), exported as a bundle. The
    models' eos id (256) is outside the vocab, so generation always runs to max_new_tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specedge.export import export_bundle
    tok = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate("abcdefgh")}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    root = tmp_path_factory.mktemp("exact")
    dims = dict(vocab=E2E_VOCAB, hidden=32, heads=4, kv_heads=2)
    target = make_model(root / "target", "llama", seed=11, layers=2, tokenizer=tok.to_str(), **dims)
    draft = make_model(root / "draft", "llama", seed=12, layers=1, tokenizer=tok.to_str(), **dims)
    export_bundle(target=target, draft=draft, out=root / "bundle", k=8, max_context=64, quiet=True)
    return target, root / "bundle"


def target_joint(folder, params: SamplingParams, prompt: list[int]) -> dict:
    """P(x1, x2) = p(x1 | prompt) p(x2 | prompt x1) from the PyTorch target (independent of ONNX and
    of the KV cache), warped by the library's probs() with the history each position really has."""
    import torch
    import transformers as tf
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + [x] for x in range(E2E_VOCAB)])).logits.double().numpy()
    rows = [(logits[0, -2], prompt)] + [(logits[x, -1], prompt + [x]) for x in range(E2E_VOCAB)]
    if params.top_k:      # ORT and torch logits differ by ~1e-5: the top-k cut must not be that close
        for lg, hist in rows:
            seen = np.unique(hist)
            lg = lg.copy()
            lg[seen] = np.where(lg[seen] > 0, lg[seen] / params.repetition_penalty,
                                lg[seen] * params.repetition_penalty)
            top = np.sort(lg)[::-1]
            assert top[params.top_k - 1] - top[params.top_k] > 1e-3, "top-k boundary near a tie"
    def law(lg, hist):    # probs() works in float32: renormalise in float64 for the oracle
        pr = probs(lg[None], params, history=hist)[0].astype(np.float64)
        return pr / pr.sum()
    p1 = law(*rows[0])
    return {(a, b): float(p1[a] * law(lg, h)[b]) for a, (lg, h) in enumerate(rows[1:]) for b in range(E2E_VOCAB)}


@pytest.mark.slow
@pytest.mark.parametrize("name", E2E_CASES)
def test_first_two_tokens_follow_the_target(tiny_pair, name):
    from specedge.runtime.decoder import SpeculativeDecoder
    speculative, params, draft_confidence = E2E_CASES[name]
    target, bundle = tiny_pair
    ngram = 2 if name.startswith("lookup") else 0
    prompt = PROMPT_LOOKUP if ngram else PROMPT
    law = target_joint(target, params, prompt)
    dec = SpeculativeDecoder.from_bundle(bundle, threads=1, speculative=True)
    seen, hist, drafted, fewest = Counter(), np.zeros(3, dtype=int), 0, 3
    lookup_rounds = draft_calls = 0
    for seed in range(N_E2E):
        # 3 new tokens so the first round drafts k=2 (the loop caps k at budget - 1): both of the
        # first two tokens can then come from accepted drafts, a rejection residual, or a bonus
        r = dec.generate(prompt, max_new_tokens=3, k=2, seed=seed, speculative=speculative,
                         temperature=params.temperature, top_k=params.top_k, ngram=ngram, ngram_min=1,
                         repetition_penalty=params.repetition_penalty, draft_confidence=draft_confidence)
        assert len(r.token_ids) == 3 and r.finish_reason == "length"
        seen[tuple(r.token_ids[:2])] += 1
        drafted += r.stats.drafted
        fewest = min(fewest, r.stats.drafted)   # 1 only if the first round stopped after one draft
        if speculative:
            hist += r.stats.accepted_hist[:3]
        lookup_rounds += r.stats.lookup_rounds
        draft_calls += r.stats.draft_calls
    if speculative:      # every branch of accept() was taken: rejection at 0, at 1, all accepted
        print(f"{name}: drafted {drafted}, rounds by drafts accepted {hist.tolist()}")
        stops = draft_confidence > 0
        assert drafted > 0 and (hist[:2] > 0).all() and (hist[2] > 0) != stops
        assert (fewest == 1) == stops     # early stops happened, and only then
    else:
        assert drafted == 0
    if ngram:        # every request starts with a lookup round; some go on with model rounds
        assert lookup_rounds >= N_E2E and draft_calls > 0
    else:
        assert lookup_rounds == 0
    assert chi2_test(law, seen, f"{name} first two tokens") > ALPHA
