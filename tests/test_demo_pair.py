"""The shipped demo pair (configs/demo.toml -> models/): a real HF pair, held-out prompts, exported by
the same path as the README's main command, and a target that beats its draft on held-out code."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import demo_bundle  # tools/demo_pair/demo_bundle.py (pyproject's pytest pythonpath): tools/demo.py's export path
from specedge.runtime.manifest import read_prompts


@pytest.fixture(scope="module")
def pair() -> dict:
    cfg = demo_bundle.load_demo_config()
    for key in ("target", "draft", "prompts"):
        assert cfg[key].exists(), f"configs/demo.toml names {cfg[key]}, which is not in the checkout"
    return cfg


@pytest.fixture(scope="module")
def bundle(pair, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "bundle"
    demo_bundle.ensure_bundle(out, pair["target"], pair["draft"], pair["prompts"])
    return out


@pytest.fixture(scope="module")
def decoder(bundle):
    from specedge.runtime import SpeculativeDecoder
    return SpeculativeDecoder.from_bundle(bundle, threads=1, speculative=True)


def test_pair_is_a_standard_hf_pair(pair):
    from safetensors import safe_open
    from transformers import AutoConfig
    sizes = {}
    for role in ("target", "draft"):
        cfg = AutoConfig.from_pretrained(pair[role])
        assert cfg.model_type == "llama" and cfg.vocab_size == 8192
        with safe_open(str(pair[role] / "model.safetensors"), "np") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        assert {t.dtype for t in tensors.values()} == {np.dtype("float16")}
        sizes[role] = sum(t.size for t in tensors.values())
        assert (pair[role] / "tokenizer.json").is_file() and (pair[role] / "generation_config.json").is_file()
    assert sizes["target"] * 4 > 32 * 2 ** 20            # fp32 weights beyond a 32 MB L3: memory-bound decode
    assert sizes["draft"] * 5 < sizes["target"]
    assert (pair["target"] / "tokenizer.json").read_bytes() == (pair["draft"] / "tokenizer.json").read_bytes()


def test_held_out_prompts(pair):
    rows = read_prompts(pair["prompts"], records=True)
    kinds = Counter(r["kind"] for r in rows)
    assert kinds["function"] >= 50 and kinds["edit"] >= 20
    assert all(r["prompt"].strip() and r.get("file") for r in rows)
    assert len({r["prompt"] for r in rows}) == len(rows)


@pytest.mark.slow
def test_greedy_speculative_is_the_target_and_the_draft_helps(decoder, pair):
    rows = read_prompts(pair["prompts"], records=True)[:4]
    drafted = accepted = 0
    for r in rows:
        spec = decoder.generate(r["prompt"], max_new_tokens=32, k=4, temperature=0.0, ignore_eos=True)
        plain = decoder.generate(r["prompt"], max_new_tokens=32, temperature=0.0, speculative=False, ignore_eos=True)
        assert spec.token_ids == plain.token_ids
        drafted += spec.stats.drafted
        accepted += spec.stats.accepted
    assert accepted / drafted > 0.3        # a trained draft, not a random one (random: ~0)


@pytest.mark.slow
def test_target_greedy_continuations_are_not_loops(decoder, pair):
    """The quality target (>= 40 % distinct tokens in 64-token greedy continuations) on the first 8 prompts:
    0.46 for the shipped target; the previous release's target, which looped ("list(list(list(...") gave 0.29."""
    rows = read_prompts(pair["prompts"], records=True)[:8]
    distinct = []
    for r in rows:
        ids = decoder.generate(r["prompt"], max_new_tokens=64, temperature=0.0, speculative=False,
                               ignore_eos=True).token_ids
        distinct.append(len(set(ids)) / len(ids))
    assert np.mean(distinct) >= 0.40, distinct


@pytest.mark.slow
def test_target_predicts_held_out_code_better_than_the_draft(decoder, pair):
    rows = read_prompts(pair["prompts"], records=True)
    nll = {"target": [], "draft": []}
    for r in rows[::6]:
        ids = decoder.encode(r["prompt"])[:256]              # the pair was trained on 256-token windows
        for role, engine in (("target", decoder.target), ("draft", decoder.draft)):
            engine.truncate(0)
            logits = engine.run(np.asarray(ids[:-1])).astype(np.float64)      # [n - 1, vocab]
            logits -= logits.max(axis=1, keepdims=True)
            logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            nll[role] += list(-logp[np.arange(len(ids) - 1), ids[1:]])
    mean = {role: float(np.mean(v)) for role, v in nll.items()}
    assert mean["target"] < mean["draft"] < math.log(8192) / 2, mean


def test_training_helpers_mark_loops_and_keep_prefixes():
    """The unlikelihood phase's mask hits repeated n-grams only; on-policy rows keep their first half."""
    torch = pytest.importorskip("torch")
    import train_demo_pair as tdp
    import train_unlikelihood as tul
    from transformers import LlamaConfig, LlamaForCausalLM
    mask = tul.repeated_ngrams(torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]]), 4)
    assert mask[0].tolist() == [False] * 4 + [True] * 4 + [False] and not mask[1].any()
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1)).eval()
    x = torch.randint(0, 64, (3, 16))
    y = torch.cat([x[:, 1:], torch.randint(0, 64, (3, 1))], 1)
    x2, y2 = tdp.target_continued(teacher, x, y, rows=2, seed=5)
    assert torch.equal(x2[:, :8], x[:, :8]) and torch.equal(x2[2], x[2]) and torch.equal(y2[2], y[2])
    assert torch.equal(x2[:, 1:], y2[:, :-1]) and not torch.equal(x2[:2, 8:], x[:2, 8:])
    again = tdp.target_continued(teacher, x, y, rows=2, seed=5)[0]
    assert torch.equal(again, x2)                               # seeded: a resumed run sees the same rows
    prefixes = torch.randint(0, 64, (2, 5))
    cont = tul.greedy_continuations(teacher, prefixes, 6)
    ref = teacher.generate(input_ids=prefixes, attention_mask=torch.ones_like(prefixes), max_new_tokens=6,
                           do_sample=False, eos_token_id=None, pad_token_id=0)[:, 5:]
    assert torch.equal(cont, ref)


def test_eval_c_is_the_loops_draft_step_over_the_target_only_step():
    """The quality targets' c: draft engine seconds per call in the speculative runs over target seconds per call in
    the target-only runs, pooled over prompts (not a mean of per-prompt ratios)."""
    import eval_demo_pair as ev
    from specedge.runtime import Stats
    runs = [{"plain": ev.stat_fields(Stats(target_calls=64, seconds_target=64 * 2e-3)),
             "greedy": ev.stat_fields(Stats(target_calls=20, seconds_target=20 * 3e-3, draft_calls=60,
                                            seconds_draft=60 * 2e-4, accepted_hist=[0] * 5))},
            {"plain": ev.stat_fields(Stats(target_calls=64, seconds_target=64 * 1e-3)),
             "greedy": ev.stat_fields(Stats(target_calls=30, seconds_target=30 * 3e-3, draft_calls=90,
                                            seconds_draft=90 * 1e-4, accepted_hist=[0] * 5))}]
    lc = ev.loop_costs(runs)
    assert lc["target_step_ms"] == pytest.approx(1.5) and lc["draft_step_ms"] == pytest.approx(0.14)
    assert lc["c"] == pytest.approx(0.14 / 1.5) and lc["r"] == pytest.approx(3.0 / 1.5)


@pytest.mark.slow
def test_the_demo_pair_certifies_exact(bundle):
    """spec-check on the shipped pair, as a user would run it (smaller budgets): greedy identity at
    every k and with lookup, verify/step numerics, and the sampled law of the first two tokens."""
    from specedge.runtime.check import CheckConfig, certify
    cert = certify(bundle, CheckConfig(prompts=2, new_tokens=32, samples=600, sampling_prompts=1), threads=1,
                   log=lambda _: None)
    assert cert["passed"], cert["checks"]
    assert cert["checks"]["greedy"]["alpha"] > 0.5                  # a real pair: most drafts are accepted
    assert cert["checks"]["sampling"]["prompts"][0]["first_tokens_tested_to_the_second"] >= 2


@pytest.mark.slow
def test_memory_figures_see_the_weights(bundle):
    """spec-bench's memory probe: the target's weights are resident in a target-only process, and the
    speculative process holds more (the draft's graph and cache). This pytest process holds hundreds of
    MB: a child's peak must not inherit its parent's (ru_maxrss would)."""
    from specedge.bench.memory import measure
    mem = measure(bundle, prompt="def f(x):", max_new_tokens=8)
    weights = sum(f.stat().st_size for f in (bundle / "target").glob("model.onnx*")) / 2 ** 20
    assert mem["target_only_held_mb"] > 0.9 * weights
    assert mem["target_only_peak_mb"] >= mem["target_only_held_mb"] - 1
    assert mem["target_only_peak_mb"] < 4 * weights
    assert mem["speculative_held_mb"] > mem["target_only_held_mb"]
