"""spec-bench on a tiny pair: every figure of its JSON report is written, and the bound is the formula."""
from __future__ import annotations

import json

import pytest

from specedge.bench import ours
from specedge.bench.cli import main as bench_main
from specedge.runtime import GenerationConfig


def test_leviathan_bound():
    assert ours.leviathan_bound(0.0, 4, 1.0, 0.0) == pytest.approx(1.0)
    assert ours.leviathan_bound(1.0, 4, 1.0, 0.0) == pytest.approx(5.0)
    alpha, k, r, c = 0.8, 4, 1.25, 0.05
    assert ours.leviathan_bound(alpha, k, r, c) == pytest.approx((1 - alpha ** 5) / (1 - alpha) / (r + k * c))


@pytest.mark.slow
def test_quick_bench_writes_every_figure(pair_bundles, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):", "import os", "x = [")))
    out = tmp_path / "bench.json"
    assert bench_main([str(pair_bundles["agree"]), "--prompts", str(prompts), "--quick", "--json", str(out),
                       "--ngram", "2"]) == 0
    r = json.loads(out.read_text())
    for mode in ("greedy", "sampled"):
        for key in ("plain_tps", "spec_tps", "best_k", "speedup", "alpha", "bound", "efficiency"):
            assert r[mode][key] is not None, (mode, key)
        assert r[mode]["best_k"] in (2, 4, 6) and 0 <= r[mode]["alpha"] <= 1
        assert r[mode]["speedup"] == pytest.approx(r[mode]["spec_tps"] / r[mode]["plain_tps"])
        m = r[mode]
        assert m["c_loop"] > 0 and m["r_loop"] > 0 and m["host_ms_per_round"] >= 0
        assert m["bound_loop"] == pytest.approx(ours.leviathan_bound(m["alpha"], m["best_k"], m["r_loop"], m["c_loop"]))
        assert all(v["drafts_per_round"] == pytest.approx(v["k"], abs=1.0) for v in m["per_k"].values())
        # fixed K is the draft model alone (the bound's premise); prompt lookup only in the defaults
        assert all(v["ngram"] == 0 and v["lookup_round_fraction"] == 0 for v in m["per_k"].values())
        d = m["default"]      # the loop's defaults: at most k drafts a round, fewer after unconfident ones
        assert d["k"] == 6 and 0 < d["drafts_per_round"] <= 6 and d["draft_confidence"] == GenerationConfig().draft_confidence
        assert d["ngram"] == 2 and (d["lookup_round_fraction"] > 0 or mode == "sampled")   # greedy output loops
        assert m["default_speedup"] == pytest.approx(d["tps"] / m["plain_tps"])
    assert isinstance(r["guard"]["keeps_draft"], bool) and "target-only decoding" in r["guard"]["why"]
    mem = r["memory"]
    # a tiny pair may load below the imports' own peak (peak 0 above the floor); what it holds shows
    assert min(mem["target_only_held_mb"], mem["speculative_held_mb"]) > 0
    assert min(mem["target_only_peak_mb"], mem["speculative_peak_mb"]) >= 0
    assert all(run["new_tokens"] == 48 for run in mem["runs"].values())
    assert (tmp_path / "bench.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "| greedy |" in out and "| specedge |" in out


def test_bench_refuses_k_beyond_bundle(pair_bundles, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    assert bench_main([str(pair_bundles["agree"]), "--prompts", str(prompts), "--ks", "9"]) == 2
    assert "max draft tokens" in capsys.readouterr().err


def test_bench_refuses_bad_prompt_files(pair_bundles, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    for text, msg in [('{"text": "x"}\n', "must be a JSON object with a 'prompt'"), ("", "holds no prompts")]:
        bad.write_text(text)
        assert bench_main([str(pair_bundles["agree"]), "--prompts", str(bad), "--quick"]) == 2
        assert msg in capsys.readouterr().err
    assert bench_main([str(pair_bundles["agree"]), "--prompts", str(bad), "--repeats", "0"]) == 2


@pytest.mark.slow
def test_a_peer_that_cannot_run_says_why_in_the_table(pair_bundles, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    out = tmp_path / "bench.json"
    assert bench_main([str(pair_bundles["agree"]), "--prompts", str(prompts), "--quick", "--json", str(out),
                       "--peers", "--target-hf", str(tmp_path / "no-such-folder")]) == 0
    printed = capsys.readouterr().out
    errors = json.loads(out.read_text())["peers_error"]
    assert errors and all(f"peer {name}: " in printed for name in errors)
    assert any("no-such-folder" in e for e in errors.values())
