"""spec-check: the exactness certificate passes on exact bundles, and its tests can fail."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from specedge.runtime.check import (CheckConfig, certify, first_divergence, greedy_passes, main, numerics_pass,
                                    sample_two_tokens, summary, two_token_law)
from specedge.runtime.config import ConfigError, SamplingParams
from specedge.runtime.gof import chi2_fit, chi2_sf

PROMPTS = ["def add(a, b):\n    return", "for i in range(10):\n    print(i)\n", "class Point:\n    def __init__"]
SMALL = dict(prompts=2, new_tokens=12, samples=400, sampling_prompts=1, prompt_tokens=8)


@pytest.mark.parametrize("df", [1, 2, 3, 7, 30, 200, 3000])
def test_chi2_sf_matches_scipy(df):
    for q in (1e-12, 1e-6, 1e-3, 0.05, 0.5, 0.95, 1 - 1e-9):
        x = stats.chi2.isf(q, df)
        assert chi2_sf(x, df) == pytest.approx(q, rel=1e-9)
    assert chi2_sf(0.0, df) == 1.0


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2


@pytest.mark.slow
def test_certificate_on_exact_bundles(pair_bundles):
    """Both tiny pairs (a draft that mostly agrees, one that never does) certify exact: every greedy
    mode matches target-only output, the sampling test passes, and the certificate names its bundle."""
    for name, bundle in pair_bundles.items():
        cert = certify(bundle, CheckConfig(**SMALL), threads=1, prompts=PROMPTS, log=lambda _: None)
        checks = cert["checks"]
        assert cert["passed"], (name, checks)
        assert checks["greedy"]["modes"] == ["k=1", "k=6", "k=8", "lookup n=3"]
        assert checks["greedy"]["requests"] == 2 * 4 and not checks["greedy"]["mismatches"]
        assert checks["numerics"]["target"]["verify_vs_steps_max_abs"] < 1e-3
        assert checks["numerics"]["target"]["rollback_max_abs"] == 0.0      # CPU: a rerun is bit-identical
        run = checks["sampling"]["prompts"][0]
        assert run["samples"] == 400 and run["df"] >= 5
        hist = run["first_rounds_by_drafts_accepted"]
        if name == "agree":              # the loop took the bonus path as well as rejections
            assert hist[2] > 0 and hist[0] + hist[1] > 0
        else:
            assert hist[0] > 0
        assert {"manifest.json", "target/model.onnx"} <= set(cert["bundle"]["files"])
        assert cert["environment"]["providers"] == ["CPUExecutionProvider"]


def first_tokens(counts) -> Counter:
    out = Counter()
    for (a, _), m in counts.items():
        out[a] += m
    return out


def test_summary_reports_a_divergence(pair_bundles):
    """The report of a failed greedy check names the prompt, mode, token and the diagnosis."""
    cert = certify(pair_bundles["agree"], CheckConfig(**{**SMALL, "samples": 0}), threads=1, prompts=PROMPTS,
                   log=lambda _: None)
    assert "verdict   PASS" in summary(cert) and "sampling" not in summary(cert)
    g = cert["checks"]["greedy"]
    g["mismatches"] = [{"prompt": 1, "mode": "k=6", "position": 7, "target_token": 5, "speculative_token": 9,
                        "top2_margin": 2e-6, "near_tie": True},
                       {"prompt": 0, "mode": "k=1", "position": 3, "target_token": 4, "speculative_token": 8,
                        "top2_margin": 1.5, "near_tie": False}]
    g["passed"] = cert["passed"] = False
    text = summary(cert)
    assert "greedy    FAIL" in text and "2 diverged" in text and "verdict   FAIL" in text
    assert "prompt 1 k=6: token 7 is 9 not 5" in text and "near-tie" in text and "a bug" in text


def test_quantized_targets_may_flip_near_ties_only_within_their_bound():
    """int8/int4 graphs quantize activations per call, so the batching moves their logits by more than
    rounding: near-ties may flip (never a clear winner), and the move must stay within the graph's own
    parity against fp32 with an exact rollback. fp32 targets stay token-exact."""
    tie, clear = {"near_tie": True}, {"near_tie": False}
    assert greedy_passes([], ties_pass=False) and not greedy_passes([tie], ties_pass=False)
    assert greedy_passes([tie, tie], ties_pass=True) and not greedy_passes([tie, clear], ties_pass=True)
    moved = {"argmax_equal": False, "rollback_max_abs": 0.0, "verify_vs_steps_max_rel": 0.03}
    assert numerics_pass({**moved, "argmax_equal": True}, None) and not numerics_pass(moved, None)
    assert numerics_pass(moved, 0.1) and not numerics_pass(moved, 0.02)
    assert not numerics_pass({**moved, "rollback_max_abs": 1e-3}, 0.1)


def test_sampling_check_has_power(pair_bundles):
    """The same samples that fit the target's law must fail against another model's law (here the
    'disagree' draft's): what a loop that sampled from the wrong distribution would produce."""
    from specedge.runtime.decoder import SpeculativeDecoder
    dec = SpeculativeDecoder.from_bundle(pair_bundles["disagree"], threads=1, speculative=True)
    ids = dec.tokenizer.encode(PROMPTS[0]).ids
    params, n = SamplingParams(temperature=0.8), 400
    law = two_token_law(dec.target, ids, params, heads=16, n=n)
    wrong = two_token_law(dec.draft, ids, params, heads=16, n=n)
    tested = {a for a, b in law if b is not None}
    seen, _ = sample_two_tokens(dec, ids, params=params, samples=n, tested=tested, seed=0)
    assert chi2_fit(law, seen).p_value > 1e-4
    fits = {name: chi2_fit(dict(first_tokens(m)), first_tokens(seen)) for name, m in (("target", law), ("draft", wrong))}
    print({name: f.p_value for name, f in fits.items()})
    assert fits["target"].p_value > 1e-4 and fits["draft"].p_value < 1e-6   # first tokens: the target's, not the draft's


def test_cli_writes_a_certificate(pair_bundles, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "cert.json"
    code = main([str(pair_bundles["agree"]), "--prompts", str(prompts), "--n-prompts", "1", "--new-tokens", "8",
                 "--k", "2", "--lookup", "0", "--samples", "200", "--sampling-prompts", "1", "--threads", "1",
                 "--json", str(out)])
    cert = json.loads(out.read_text())
    assert code == 0 and cert["passed"] and cert["checks"]["greedy"]["modes"] == ["k=2"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []      # no temp file left


@pytest.mark.parametrize("argv, needle", [
    (["--k", "99"], "exceeds the bundle's max draft tokens (8)"),
    (["--k", "two"], "--k takes a comma list of integers"),
    (["--samples", "-1"], "samples must be an integer >= 0"),
    (["--temperature", "0"], "needs temperature > 0"),
    (["--lookup", "1"], "lookup must be 0"),
    (["--samples", "50"], "samples must be 0 (no sampling check) or >= 100"),
    (["--new-tokens", "300"], "leave no room for a prompt"),
    (["--json", "/nonexistent/dir/c.json"], "does not exist"),
])
def test_cli_bad_input(pair_bundles, capsys, argv, needle):
    assert main([str(pair_bundles["agree"]), "--n-prompts", "1", "--samples", "0", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_cli_missing_bundle_and_prompts(tmp_path, pair_bundles, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(pair_bundles["agree"]), "--samples", "0"]) == 2      # the tiny bundles ship no prompts
    assert "--prompts FILE" in capsys.readouterr().err


@pytest.mark.slow
def test_target_only_bundle_checks_lookup_or_refuses(tmp_path, llama_target):
    """Without a draft model the speculative path is prompt lookup: checked with --lookup, refused
    without; a one-token prompt is fine for the numerics check (nothing to prefill before it)."""
    from specedge.export import export_bundle
    from specedge.runtime.check import check_numerics
    from specedge.runtime.decoder import SpeculativeDecoder
    bundle = tmp_path / "alone"
    export_bundle(target=llama_target, draft=None, out=bundle, k=4, max_context=128, quiet=True)
    with pytest.raises(ConfigError, match="no draft model and --lookup is 0"):
        certify(bundle, CheckConfig(**{**SMALL, "lookup": 0}), threads=1, prompts=PROMPTS, log=lambda _: None)
    cert = certify(bundle, CheckConfig(**SMALL), threads=1, prompts=PROMPTS, log=lambda _: None)
    assert cert["passed"] and cert["checks"]["greedy"]["modes"] == ["lookup n=3"]
    assert "no draft model" in summary(cert)
    dec = SpeculativeDecoder.from_bundle(bundle, threads=1)
    assert check_numerics(dec, [5], k=2)["target"]["positions"] == 3


def test_config_checks():
    with pytest.raises(ConfigError, match="family_alpha"):
        CheckConfig(family_alpha=1.5)
    with pytest.raises(ConfigError, match="top_p"):
        CheckConfig(top_p=0.0)
    with pytest.raises(ConfigError, match="ks"):
        CheckConfig(ks=(0,))
    assert CheckConfig().sampling == SamplingParams(temperature=0.8)
    assert np.isclose(CheckConfig().family_alpha, 1e-3)


def test_write_atomic_leaves_whole_files_only(tmp_path):
    from specedge.runtime.files import write_atomic
    target = tmp_path / "out.json"
    write_atomic(target, '{"a": 1}')
    write_atomic(target, b'{"a": 2}')
    assert json.loads(target.read_text()) == {"a": 2}
    with pytest.raises(TypeError):               # a failure midway: the old file stays, no temp file is left
        write_atomic(target, 3)
    assert json.loads(target.read_text()) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == ["out.json"]
