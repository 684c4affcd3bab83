"""spec-bench --peers, interleaved (bench/interleave.py, bench/peers.py): the schedule, the ratio and spread
arithmetic on given numbers, the worker protocol with a real peer worker, and peers that fail.

`Scripted` below is a system whose runs return given token counts and seconds: it checks the arithmetic
and the bookkeeping around the runs, and measures nothing.
"""
from __future__ import annotations

import json
import statistics
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from specedge.bench import interleave as I
from specedge.bench.cli import PEER_KEYS, peers_table


class Scripted:
    """A system whose run (variant, prompt, repeat) takes the given seconds for 10 new tokens."""

    def __init__(self, name, seconds, *, variants=I.VARIANTS, calls=None):
        self.name, self.seconds, self.variants = name, seconds, variants
        self.calls = calls if calls is not None else []

    def start(self):
        pass

    def run(self, variant, i, *, mode, temperature, k, seed):
        rep = (seed - i - 1) // 1000 if seed else None        # run_mode's seeds: 1000 * repeat + prompt + 1
        self.calls.append((self.name, variant, i, rep))
        secs = self.seconds(variant, i, rep) if rep is not None else 0.01
        return {"new_tokens": 10, "seconds": secs, "output": [i, 1, 2], "stats": {}}

    def summary(self, stats):
        return {"generations": len(stats)}

    def info(self):
        return {}

    def close(self):
        pass


# ---------------------------------------------------------------------------------------------------------
# the schedule

def test_schedule_visits_every_prompt_with_every_system_each_repeat():
    systems = {"ours": ("plain", "spec"), "ortgenai": ("plain", "spec"), "hf": ("plain",),
               "llamacpp": ("plain", "spec")}
    n_prompts, repeats = 3, 4
    order = I.schedule(systems, n_prompts, repeats)
    visits = Counter(order)
    expected = {(r, i, s, v) for r in range(repeats) for i in range(n_prompts) for s, vs in systems.items() for v in vs}
    assert set(visits) == expected and set(visits.values()) == {1}
    # prompt by prompt: every system finishes prompt i of repeat r before any system starts the next one
    blocks = [(r, i) for r, i, _, _ in order]
    assert blocks == sorted(blocks)
    # a system's variants run back to back, in the other order on the next prompt
    for r in range(repeats):
        for i in range(n_prompts):
            runs = [(s, v) for rr, ii, s, v in order if (rr, ii) == (r, i)]
            assert [v for s, v in runs if s == "ours"] == (["plain", "spec"] if (r + i) % 2 == 0 else ["spec", "plain"])


def test_schedule_rotates_so_no_system_is_always_first():
    systems = {name: ("plain", "spec") for name in ("ours", "ortgenai", "hf")}
    order = I.schedule(systems, 2, 6)

    def system_order(r, i):
        seen = []
        for rr, ii, s, _ in order:
            if (rr, ii) == (r, i) and s not in seen:
                seen.append(s)
        return seen

    for i in range(2):
        firsts = [system_order(r, i)[0] for r in range(6)]
        # from one repeat to the next the first system changes, and over 3 repeats each one leads once
        assert all(a != b for a, b in zip(firsts, firsts[1:]))
        assert set(firsts[:3]) == set(systems)
        # every system takes every place in the order
        for name in systems:
            assert {system_order(r, i).index(name) for r in range(6)} == {0, 1, 2}
    # within a repeat too, consecutive prompts start with different systems
    assert system_order(0, 0)[0] != system_order(0, 1)[0]


# ---------------------------------------------------------------------------------------------------------
# ratios and spread, on given numbers

def test_ratios_are_per_repeat_with_median_and_spread():
    r = I.ratios([300.0, 330.0, 270.0], [250.0, 300.0, 300.0])
    assert r["runs"] == pytest.approx([1.2, 1.1, 0.9])
    assert (r["median"], r["min"], r["max"]) == pytest.approx((1.1, 0.9, 1.2))
    # the median of the per-repeat ratios, not the ratio of the medians (300 / 300 = 1.0 here)
    assert statistics.median([300.0, 330.0, 270.0]) / statistics.median([250.0, 300.0, 300.0]) == pytest.approx(1.0)
    assert I.spread([4.0, 1.0, 2.0, 3.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "runs": [4.0, 1.0, 2.0, 3.0]}
    # a peer missing a repeat (it failed) or missing altogether has no ratio
    assert I.ratios([1.0, 2.0], [1.0]) is None and I.ratios([1.0], None) is None and I.spread([]) is None


def test_run_mode_aggregates_repeats_and_ratios():
    calls = []
    # ours: 10 tokens in 0.1 s (repeat 0) and 0.2 s (repeat 1) per prompt; the peer half as fast in repeat 0
    ours = Scripted("ours", lambda v, i, rep: 0.1 * (rep + 1) / (2 if v == "spec" else 1), calls=calls)
    peer = Scripted("hf", lambda v, i, rep: 0.2 if rep == 0 else 0.2 * (1 + i), calls=calls)
    res = I.run_mode([ours, peer], 2, mode="sampled", temperature=0.8, k=3, repeats=2)
    o, p = res["systems"]["ours"], res["systems"]["hf"]
    # a repeat's figure: its tokens over all prompts / their seconds
    assert o["plain"]["runs"] == pytest.approx([100.0, 50.0]) and o["spec"]["runs"] == pytest.approx([200.0, 100.0])
    assert p["plain"]["runs"] == pytest.approx([50.0, 20 / 0.6])
    assert o["plain"]["median"] == pytest.approx(75.0)
    assert res["ratios"]["hf"]["plain"]["runs"] == pytest.approx([2.0, 50.0 / (20 / 0.6)])
    assert res["ratios"]["hf"]["spec"]["runs"] == pytest.approx([4.0, 100.0 / (20 / 0.6)])
    assert res["errors"] == {} and o["new_tokens"] == 10
    # warm-ups first (one per system and variant, untimed), then each prompt on both systems in turn
    assert len(calls) == 4 + 2 * 2 * 4 and all(rep is None for *_, rep in calls[:4])
    timed = [(s, i, rep) for s, _, i, rep in calls[4:]]
    assert [(i, rep) for _, i, rep in timed] == sorted([(i, rep) for _, i, rep in timed], key=lambda x: (x[1], x[0]))
    assert {timed[4 * j][0] for j in range(4)} == {"ours", "hf"}       # who goes first changes


# ---------------------------------------------------------------------------------------------------------
# failing peers

# a stand-in worker process that speaks the protocol and then fails as told: it checks the client's handling
# of a worker that dies or hangs; its figures are never taken for a measurement
_FAILING = textwrap.dedent("""
    import json, os, sys, time
    how, after = sys.argv[1], int(sys.argv[2])
    print(json.dumps({"ready": True, "spec_error": None}), flush=True)
    for n, line in enumerate(sys.stdin):
        if n >= after:
            if how == "die":
                print("RuntimeError: the peer's library crashed", file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(60)
        print(json.dumps({"new_tokens": 10, "seconds": 0.1, "tokens": [1], "stats": {}}), flush=True)
""")


def _failing(name, how, after, prompts, timeout=30.0):
    return I.PeerProcess(name, [sys.executable, "-c", _FAILING, how, str(after)], prompts, max_new_tokens=4,
                         request_timeout=timeout)


def test_failing_peers_leave_ours_and_the_others_intact(tmp_path):
    prompts = ["a", "b"]
    ours = Scripted("ours", lambda v, i, rep: 0.1)
    good = Scripted("llamacpp", lambda v, i, rep: 0.2)
    # a real onnxruntime-genai worker on a folder that is no model: it never gets ready
    never = I.PeerProcess("ortgenai", [sys.executable, "-m", "specedge.bench.peers", "--system", "ortgenai",
                                       "--target", str(tmp_path / "missing"), "--draft", str(tmp_path / "missing"),
                                       "--warmup-prompt", "a", "--max-new-tokens", "4",
                                       "--cache", str(tmp_path / "cache")], prompts, max_new_tokens=4)
    dies = _failing("hf", "die", after=5, prompts=prompts)            # after its warm-ups and a few requests
    hangs = _failing("hangs", "hang", after=3, prompts=prompts, timeout=1.0)
    results, infos = I.run([ours, never, dies, hangs, good], len(prompts),
                           modes={"greedy": {"temperature": 0.0, "k": 2}, "sampled": {"temperature": 0.8, "k": 2}},
                           repeats=2)
    for mode in ("greedy", "sampled"):
        res = results[mode]
        assert res["systems"]["ours"]["plain"]["runs"] == pytest.approx([100.0, 100.0])
        assert res["systems"]["llamacpp"]["spec"]["runs"] == pytest.approx([50.0, 50.0])
        assert res["ratios"]["llamacpp"]["plain"]["median"] == pytest.approx(2.0)
        for name in ("hf", "hangs"):
            assert res["systems"][name]["plain"] is None and res["systems"][name]["spec"] is None
            assert res["ratios"][name] == {"plain": None, "spec": None}
    assert "exited 3" in results["greedy"]["errors"]["hf"] and "crashed" in results["greedy"]["errors"]["hf"]
    assert "gave no answer in 1 s" in results["greedy"]["errors"]["hangs"]
    assert "no config.json" in infos["ortgenai"]["error"] and "\n" not in infos["ortgenai"]["error"]
    assert dies.worker.proc.returncode == 3 and hangs.worker.proc.returncode is not None     # nothing left running

    peers, errors = I.report(results, infos, PEER_KEYS, k_by_mode={"greedy": 2, "sampled": 2})
    g = peers["greedy"]
    assert g["ortgenai_plain"] is None and g["ortgenai_spec"] is None and g["ours_over_ortgenai_plain"] is None
    assert g["hf_plain"] is None and g["hf_assisted"] is None and "exited 3" in g["hf_detail"]["error"]
    assert g["llamacpp_plain"] == pytest.approx(50.0) and g["ours_over_llamacpp_spec"] == pytest.approx(2.0)
    assert g["ours_plain"] == pytest.approx(100.0) and g["ours_detail"]["k"] == 2
    assert {"ortgenai_greedy", "ortgenai_sampled", "hf_greedy", "hf_sampled"} <= set(errors)
    assert "llamacpp_greedy" not in errors
    table = "\n".join(peers_table(peers))
    assert "| greedy, K = 2 | llamacpp | 50.0 | 2.00x (2.00-2.00) | 50.0 | 2.00x (2.00-2.00) |" in table
    assert "| greedy, K = 2 | ortgenai | n/a | n/a | n/a | n/a |" in table


# ---------------------------------------------------------------------------------------------------------
# llama.cpp, per request

def test_llamacpp_requests_are_timed_by_its_own_clocks(tmp_path):
    """Stand-in binaries replay output captured from llama.cpp (tests/data/llamacpp) and log their argv:
    the figures must be llama.cpp's own timings, whatever the process took, and mode, K and seed go through."""
    data = Path(__file__).parent / "data" / "llamacpp"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    for name, capture in (("llama-completion", "completion_greedy"),
                          ("llama-speculative-simple", "speculative_greedy")):
        script = bin_dir / name
        # argv as unit-separated fields, one record-separated invocation each (the prompt holds newlines)
        script.write_text(f"#!/bin/sh\nprintf '%s\\037' \"$@\" >> {log}\nprintf '\\036' >> {log}\nsleep 0.3\n"
                          f"cat {data / (capture + '.stdout')}\ncat {data / (capture + '.stderr')} >&2\n")
        script.chmod(0o755)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    prompt = json.loads((data / "prompt.jsonl").read_text())["prompt"]
    llama = I.LlamaCpp(bin_dir, [prompt], target=gguf, draft=gguf, precision="as-is", draft_precision="as-is",
                       max_new_tokens=64, threads=1, draft_threads=1)
    llama.start()
    assert llama.variants == ("plain", "spec")
    res = I.run_mode([Scripted("ours", lambda v, i, rep: 0.1), llama], 1, mode="sampled", temperature=0.8, k=3,
                     repeats=2)
    fig = res["systems"]["llamacpp"]
    # "total time = 171.87 ms" for 63 eval runs + 1; the speculative run: encode 0.053 s + decode 0.237 s, 67 tokens
    assert fig["plain"]["runs"] == pytest.approx([64 / 0.17187] * 2)
    assert fig["spec"]["runs"] == pytest.approx([67 / 0.290] * 2)
    assert fig["spec_stats"]["acceptance_rate"] == pytest.approx(41 / 51)
    argv = [rec.split("\x1f")[:-1] for rec in log.read_text().split("\x1e")[:-1]]
    flag = lambda a, name: a[a.index(name) + 1]
    spec = [a for a in argv if "--spec-draft-n-max" in a]
    assert len(argv) == 2 + 2 * 2 and len(spec) == 3            # a warm-up each, then 2 repeats of each variant
    assert all(flag(a, "--spec-draft-n-max") == "3" and flag(a, "--spec-draft-sampling") == "probabilistic"
               for a in spec)
    sampling = ("--temp", "--top-k", "--top-p", "--min-p")      # plain T = 0.8: llama.cpp's truncations off
    assert all([flag(a, f) for f in sampling] == ["0.8", "0", "1", "0"] for a in argv)
    assert all(flag(a, "-p") == prompt for a in argv)
    assert sorted(flag(a, "--seed") for a in spec) == ["0", "1", "1001"]       # 1000 * repeat + prompt + 1


# ---------------------------------------------------------------------------------------------------------
# a real worker

@pytest.mark.slow       # imports torch and transformers: about 6 s on a loaded 2-core machine
def test_hf_worker_round_trip(llama_target, llama_drafts, tmp_path):
    """bench/peers.py's HF worker on the tiny pair, through the client spec-bench uses."""
    pytest.importorskip("transformers")
    prompts = ["def f(x):", "import os"]
    cmd = [sys.executable, "-m", "specedge.bench.peers", "--system", "hf", "--target", str(llama_target),
           "--draft", str(llama_drafts["agree"]), "--warmup-prompt", prompts[0], "--max-new-tokens", "6"]
    peer = I.PeerProcess("hf", cmd, prompts, max_new_tokens=6)
    try:
        peer.start()
        assert peer.hello["ready"] and peer.variants == ("plain", "spec") and "transformers" in peer.hello["versions"]
        kw = dict(mode="sampled", temperature=0.8, k=3)
        plain = peer.run("plain", 1, seed=7, **kw)
        again = peer.run("plain", 1, seed=7, **kw)
        spec = peer.run("spec", 0, seed=7, **kw)
        # every run makes the budget exactly (EOS masked); the seed travels: the same seed, the same draws
        assert plain["new_tokens"] == len(plain["output"]) == 6 and spec["new_tokens"] == 6
        assert again["output"] == plain["output"] and plain["seconds"] > 0
        assert plain["prompt_tokens"] == len("import os".encode())          # the byte-level tokenizer
        assert plain["stats"]["draft"] == 0 and spec["stats"]["draft"] > 0 and spec["stats"]["target"] >= 1
        with pytest.raises(I.PeerError, match="KeyError"):                   # a bad request: one line back
            peer.worker.request({"op": "generate"}, 30)
        mem = peer.info()["memory"]                                          # and the worker still answers
        assert mem["held_mb"] > 0 and mem["target_only_held_mb"] > 0
    finally:
        peer.close()
    assert peer.worker.proc.returncode == 0


def test_worker_keeps_its_stdout_for_the_protocol(tmp_path):
    """Whatever a peer's library prints on stdout, from Python or native code, goes to stderr: the hello
    (here: a genai worker whose model folder is missing) still arrives as one JSON line."""
    code = ("import os, sys\n"
            "import specedge.bench.peers as p\n"
            "real = p.GenaiPeer.__init__\n"
            "def noisy(self, args):\n"
            "    print('python noise', flush=True)\n"
            "    os.write(1, b'native noise\\n')\n"
            "    real(self, args)\n"
            "p.GenaiPeer.__init__ = noisy\n"
            "sys.exit(p.main(sys.argv[1:]))\n")
    cmd = [sys.executable, "-c", code, "--system", "ortgenai", "--target", str(tmp_path / "nowhere"), "--draft",
           str(tmp_path / "nowhere"), "--warmup-prompt", "x", "--max-new-tokens", "1", "--cache", str(tmp_path / "c")]
    peer = I.PeerProcess("ortgenai", cmd, ["x"], max_new_tokens=1)
    with pytest.raises(I.PeerError, match="no config.json"):
        peer.start()
    peer.close()
    assert peer.hello["ready"] is False


@pytest.mark.slow       # exports the tiny pair; the peers load torch and run onnxruntime-genai's builder
def test_spec_bench_peers_interleaved_on_the_tiny_pair(pair_bundles, tmp_path, monkeypatch, capsys):
    from specedge.bench import cli
    monkeypatch.setenv("SPECEDGE_LLAMA_CPP_BIN", str(tmp_path / "no-llama"))    # not built here, whatever is cached
    monkeypatch.setattr(cli.memory, "measure", lambda *a, **k: {"error": "skipped in this test"})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):", "import os")))
    out = tmp_path / "b.json"
    assert cli.main([str(pair_bundles["agree"]), "--prompts", str(prompts), "--ks", "2", "--max-new-tokens", "6",
                     "--repeats", "2", "--peers", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert "llamacpp" in r["peers_error"]
    for mode in ("greedy", "sampled"):
        p = r["peers"][mode]
        ours, hf = p["ours_detail"], p["hf_detail"]
        assert hf["error"] is None, hf["error"]
        assert ours["k"] == hf["k"] == r[mode]["best_k"] == 2 and hf["new_tokens"] == hf["new_tokens_max"] == 6
        for v, key in (("plain", "hf_plain"), ("spec", "hf_assisted")):
            runs, mine = hf[f"{v}_tps_runs"], ours[f"{v}_tps_runs"]
            assert len(runs) == len(mine) == 2 and p[key] == pytest.approx(statistics.median(runs))
            ratio = p["ratios"]["hf"][v]
            assert ratio["runs"] == pytest.approx([a / b for a, b in zip(mine, runs)])
            assert p[f"ours_over_hf_{v}"] == pytest.approx(statistics.median(ratio["runs"]))
        assert hf["spec_stats"]["draft_forward_calls"] > 0 and hf["memory"]["held_mb"] > 0
        # onnxruntime-genai's builder may not take the tiny random model: then its figures are null, with why
        assert (p["ortgenai_plain"] or 0) > 0 or r["peers_error"].get(f"ortgenai_{mode}")
    assert r["peers"]["hf_plain"] == r["peers"]["greedy"]["hf_plain"]          # the flat greedy keys stay
    assert isinstance(r["peers"]["greedy"]["hf_detail"]["greedy_identical_to_ours"], bool)
    printed = capsys.readouterr().out
    assert "| greedy, K = 2 | hf |" in printed and "| sampled, K = 2 | specedge (ours) |" in printed
