"""Benchmark KV-cache handling options of the ONNX Runtime engine (engines/ort.py), on CPU.

Builds random-weight copies of the demo pair (target 12.6 M params, draft 2 layers) once, exports
them into a cache folder outside the repository (~/.cache/specedge/bench-engine, or
$SPECEDGE_BENCH_CACHE / --cache), then times every engine variant on the same calls, interleaved:
each repetition runs every variant once, in a shuffled order, so background load hits all alike.
Engines are loaded in a shuffled order too (--seed), and the original engine is loaded twice
("a numpy (orig) #2"): the gap between two identical instances is the noise floor to beat.

Each call is timed by wall clock and by the calling thread's CPU time (one intra-op thread: ORT
computes on the calling thread, so CPU time leaves out preemption by other jobs on the cores).
Reported per case: median ms, ratio of medians to "a numpy (orig)", median of the per-repetition
ratios ("paired"), and the share of repetitions in which the variant beat it ("won").

Cases, as the runtime issues them (run, then truncate = rollback); each timed call follows an
untimed call on the same engine, as in the runtime's back-to-back calls:
  decode@P        1 token at past P after a rollback to P (the cache must be re-packed)
  decode@P/fresh  1 token at past P right after a call that ended at P (no rollback)
  verifyK@256     K+1 tokens at past 256 after a rollback to 256
  round x24       a fixed, seeded sequence of 24 speculative rounds on a (target, draft) pair of
                  the variant: draft 4 single-token calls, target one 5-token call, both truncated
                  to a random acceptance (whole sequence timed)

    python tools/bench_engine.py                          # ~3 min on one busy core
    python tools/bench_engine.py --quick --reps 5         # smoke run
    python tools/bench_engine.py --variants "#2,iobind"   # baseline + the named variants only
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from specedge.runtime.files import write_atomic  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SPECEDGE_BENCH_CACHE", Path.home() / ".cache" / "specedge" / "bench-engine"))
DEMO_TOKENIZER = Path.home() / ".cache" / "specedge" / "demo" / "tokenizer.json"


# -- bundle ------------------------------------------------------------------------------------------
def bundle(cache: Path = CACHE) -> Path:
    """The exported random-weight demo pair; built on the first call, reused afterwards."""
    out = cache / "bundle"
    if (out / "manifest.json").is_file():
        return out
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    sys.path.insert(0, str(HERE))
    from train_demo_pair import build
    from specedge.export import export_bundle
    if not DEMO_TOKENIZER.is_file():
        raise SystemExit(f"{DEMO_TOKENIZER} is missing; run tools/train_demo_pair.py once to create it")
    for kind in ("target", "draft"):
        folder = cache / kind
        if not (folder / "config.json").is_file():
            model = build(kind)
            print(f"[bench] {kind}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params",
                  file=sys.stderr)
            model.save_pretrained(folder)
            shutil.copy2(DEMO_TOKENIZER, folder / "tokenizer.json")
    t0 = time.perf_counter()
    export_bundle(target=cache / "target", draft=cache / "draft", out=out, k=8, max_context=1024,
                  quiet=True, overwrite=True)
    print(f"[bench] exported {out} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


# -- engine variants ---------------------------------------------------------------------------------
def session_options(ort, *, level="all", mem_pattern=True, arena=True, spinning=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[level]
    so.enable_mem_pattern = mem_pattern
    so.enable_cpu_mem_arena = arena
    if spinning is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    so.log_severity_level = 3
    return so


def load(cls, path: Path, kwargs=None, opts=None):
    """An engine of class `cls` (OrtEngine or a subclass), its session re-made with `opts`."""
    import onnxruntime as ort
    e = cls(path, threads=1, **(kwargs or {}))
    if opts:
        e.session = ort.InferenceSession(str(path), session_options(ort, **opts),
                                         providers=["CPUExecutionProvider"])
        e.reset()
    return e


def variants():
    from specedge.engines.ort import OrtEngine

    class NumpyFeed(OrtEngine):
        """(a) the original engine, frozen here: numpy presents fed back as past; a rollback
        copies the kept prefix to a contiguous array."""

        def reset(self):
            empty = np.zeros((1, self.num_kv_heads, 0, self.head_dim), dtype=self.dtype)
            self._cache = [empty] * len(self.past_names)
            self._len = 0

        def truncate(self, length):
            self._len = length

        def _begin(self, ids):
            """Shared by every variant: ids [1, n], past length, total length (mask grown to fit)."""
            ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
            past = self._len
            total = past + ids.shape[1]
            if self._ones.shape[1] < total:
                self._ones = np.ones((1, 2 * total), dtype=np.int64)
            return ids, past, total

        def run(self, ids):
            ids, past, total = self._begin(ids)
            cache = self._cache
            if cache[0].shape[2] != past:
                cache = [np.ascontiguousarray(a[:, :, :past]) for a in cache]
            feed = dict(zip(self.past_names, cache))
            feed["input_ids"] = ids
            feed["attention_mask"] = self._ones[:, :total]
            if self.has_position_ids:
                feed["position_ids"] = np.arange(past, total, dtype=np.int64)[None]
            out = self.session.run(self.output_names, feed)
            self._cache = out[1:]
            self._len = total
            return out[0][0, :, :self.vocab_size]

    class Binding(NumpyFeed):
        """(b) IOBinding: presents stay OrtValues (outputs bound to the CPU device) and are bound
        as the next pasts, zero-copy; a rollback slices `OrtValue.numpy()` and wraps the copy."""

        def reset(self):
            import onnxruntime as ort
            self._ort = ort
            empty = np.zeros((1, self.num_kv_heads, 0, self.head_dim), dtype=self.dtype)
            self._past = [ort.OrtValue.ortvalue_from_numpy(empty)] * len(self.past_names)
            self._io = self.session.io_binding()
            self._len = 0

        def _rollback(self, past):
            return [self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v.numpy()[:, :, :past]))
                    for v in self._past]

        def run(self, ids):
            ids, past, total = self._begin(ids)
            if self._past[0].shape()[2] != past:
                self._past = self._rollback(past)
            io = self._io
            io.bind_cpu_input("input_ids", ids)
            io.bind_cpu_input("attention_mask", self._ones[:, :total])
            if self.has_position_ids:
                io.bind_cpu_input("position_ids", np.arange(past, total, dtype=np.int64)[None])
            for name, v in zip(self.past_names, self._past):
                io.bind_ortvalue_input(name, v)
            for name in self.output_names:
                io.bind_output(name, "cpu")
            self.session.run_with_iobinding(io)
            out = io.get_outputs()
            self._past = out[1:]
            self._len = total
            return out[0].numpy()[0, :, :self.vocab_size]

    class BindingView(Binding):
        """(b') as (b), but a rollback copies the kept prefix straight out of the OrtValue's buffer
        (a numpy view over data_ptr, no intermediate full copy)."""

        def _rollback(self, past):
            out = []
            for v in self._past:
                shape = v.shape()
                full = np.ctypeslib.as_array(
                    (np.ctypeslib.as_ctypes_type(self.dtype) * int(np.prod(shape))).from_address(v.data_ptr()))
                out.append(self._ort.OrtValue.ortvalue_from_numpy(
                    np.ascontiguousarray(full.reshape(shape)[:, :, :past])))
            return out

    class RunOrtValues(BindingView):
        """(c) session.run_with_ort_values: pasts as OrtValues, presents returned as OrtValues."""

        def run(self, ids):
            ort = self._ort
            ids, past, total = self._begin(ids)
            if self._past[0].shape()[2] != past:
                self._past = self._rollback(past)
            feed = dict(zip(self.past_names, self._past))
            feed["input_ids"] = ort.OrtValue.ortvalue_from_numpy(ids)
            feed["attention_mask"] = ort.OrtValue.ortvalue_from_numpy(self._ones[:, :total])
            if self.has_position_ids:
                feed["position_ids"] = ort.OrtValue.ortvalue_from_numpy(
                    np.arange(past, total, dtype=np.int64)[None])
            out = self.session.run_with_ort_values(self.output_names, feed)
            self._past = list(out[1:])
            self._len = total
            return out[0].numpy()[0, :, :self.vocab_size]

    table = {                                       # name: (class, constructor kwargs, session options)
        "a numpy (orig)": (NumpyFeed, {}, {}),
        "a numpy (orig) #2": (NumpyFeed, {}, {}),   # a second instance: the noise floor
        "OrtEngine (file)": (OrtEngine, {}, {}),
        "OrtEngine io_binding (file)": (OrtEngine, {"io_binding": True}, {}),
        "b iobind": (Binding, {}, {}),
        "b' iobind+view": (BindingView, {}, {}),
        "c run_ortvalues": (RunOrtValues, {}, {}),
        "c numpy ext-opt": (NumpyFeed, {}, {"level": "extended"}),
        "c numpy no-mempat": (NumpyFeed, {}, {"mem_pattern": False}),
        "c numpy no-arena": (NumpyFeed, {}, {"arena": False}),
        "c numpy spin=0": (NumpyFeed, {}, {"spinning": "0"}),
    }
    return table


# -- timing ------------------------------------------------------------------------------------------
class clock:
    """Wall and CPU time of the block, as a (wall, cpu) pair in `t` after it. With one intra-op
    thread ORT computes on the calling thread, so thread CPU time leaves out the time this process
    was preempted by the other jobs sharing the cores (the dominant noise here)."""

    def __enter__(self):
        self.t = [0.0, 0.0]
        self.w, self.c = time.perf_counter(), time.thread_time()
        return self.t

    def __exit__(self, *exc):
        self.t[0], self.t[1] = time.perf_counter() - self.w, time.thread_time() - self.c


# -- cases ---------------------------------------------------------------------------------------------
def prefill(e, n: int, rng) -> None:
    e.reset()
    e.run(rng.integers(2, e.vocab_size, size=n))


def case_decode(past: int, fresh: bool):
    """1 token at `past`. Each timed call follows an untimed call on the same engine (so caches are
    as warm as in the runtime's back-to-back calls); `fresh`: that call ended exactly at `past`
    (its presents are fed as they are), else it ended at past+1 and was rolled back to `past`."""
    def setup(e, rng):
        prefill(e, past + 1, rng)

    def timed(e, rng):
        e.truncate(past - 1)
        e.run(rng.integers(2, e.vocab_size, size=1 if fresh else 2))
        e.truncate(past)
        with clock() as t:
            e.run(rng.integers(2, e.vocab_size, size=1))
        return t
    return setup, timed


def case_verify(k: int, past: int = 256):
    """k+1 tokens at `past` after a rollback (the verify call after a partly rejected round)."""
    def setup(e, rng):
        prefill(e, past + k + 1, rng)

    def timed(e, rng):
        e.truncate(past - 1)
        e.run(rng.integers(2, e.vocab_size, size=2))
        e.truncate(past)
        with clock() as t:
            e.run(rng.integers(2, e.vocab_size, size=k + 1))
        return t
    return setup, timed


def case_rounds(rounds: int = 24, start: int = 128, k: int = 4, seed: int = 7):
    """A fixed sequence of speculative rounds over a (target, draft) pair of the same variant."""
    plan = np.random.default_rng(seed).integers(0, k + 1, size=rounds)   # accepted per round

    def setup(pair, rng):
        pass

    def timed(pair, rng):
        target, draft = pair
        toks = list(np.random.default_rng(seed + 1).integers(2, target.vocab_size, size=start))
        target.reset()
        draft.reset()
        target.run(np.asarray(toks[:-1]))
        draft.run(np.asarray(toks[:-1]))
        with clock() as t:
            for acc in plan:
                n = len(toks)
                feed, drafts = toks[draft.length:], []
                for _ in range(k):
                    logits = draft.run(np.asarray(feed))[-1]
                    drafts.append(int(logits.argmax()))
                    feed = drafts[-1:]
                target.run(np.asarray([toks[-1]] + drafts))
                toks += drafts[:acc] + [int(acc) + 2]
                target.truncate(n + int(acc))
                draft.truncate(min(draft.length, n + int(acc)))
        return t
    return setup, timed


def run_case(label, engines, setup, timed, reps, rng):
    names = list(engines)
    for e in engines.values():
        setup(e, rng)
        timed(e, rng)                # warm-up (allocations, arena growth)
    times = {n: [] for n in names}
    for _ in range(reps):
        random.shuffle(names)
        for n in names:
            times[n].append(timed(engines[n], rng))
    return times


def summarize(times, base):
    """Per variant and clock (wall, cpu): median ms, ratio of medians to `base`, median of the
    per-repetition ratios, and the share of repetitions in which the variant beat `base`."""
    out = {}
    for n, ts in times.items():
        out[n] = {}
        for i, clk in enumerate(("wall", "cpu")):
            mine, ref = [t[i] for t in ts], [t[i] for t in times[base]]
            ratios = [t / b for t, b in zip(mine, ref)]
            out[n][clk] = {"median_ms": 1e3 * statistics.median(mine),
                           "ratio": statistics.median(mine) / statistics.median(ref),
                           "paired_ratio": statistics.median(ratios),
                           "share_faster": sum(r < 1 for r in ratios) / len(ratios),
                           "samples_ms": [round(1e3 * t, 4) for t in mine]}
    return out


def check_identical(engines_by_variant, rng) -> dict:
    """Every variant must give the same logits as the baseline on a run/rollback sequence."""
    ids = rng.integers(2, 8192, size=40)
    res = {}
    ref = None
    for name, e in engines_by_variant.items():
        e.reset()
        outs = [e.run(ids[:20])]
        e.truncate(12)
        outs.append(e.run(ids[12:17]))
        outs.append(e.run(ids[17:18]))
        e.truncate(15)
        outs.append(e.run(ids[15:25]))
        outs = np.concatenate(outs)
        if ref is None:
            ref = outs
        res[name] = float(np.abs(outs - ref).max())
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200, help="interleaved repetitions per case")
    ap.add_argument("--round-reps", type=int, default=40, help="repetitions of the round sequence")
    ap.add_argument("--variants", default="", help="comma-separated substrings selecting variants")
    ap.add_argument("--quick", action="store_true", help="fewer cases (decode@64, verify 4, rounds)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the load order and the interleaving")
    ap.add_argument("--json", default="/tmp/bench_engine.json")
    ap.add_argument("--cache", default=str(CACHE))
    args = ap.parse_args(argv)

    import onnxruntime as ort
    path = bundle(Path(args.cache))
    table = variants()
    if args.variants:
        keep = [s.strip() for s in args.variants.split(",")]
        table = {k: v for k, v in table.items() if k == "a numpy (orig)" or any(s in k for s in keep)}
    base = "a numpy (orig)"
    rng = np.random.default_rng(args.seed)
    random.seed(args.seed)
    order = [(role, n) for role in ("target", "draft") for n in table]
    random.Random(args.seed).shuffle(order)         # load order affects speed a little: vary it
    engines = {"target": {}, "draft": {}}
    for role, n in order:
        cls, kwargs, opts = table[n]
        engines[role][n] = load(cls, path / role / "model.onnx", kwargs, opts)
    engines = {role: {n: engines[role][n] for n in table} for role in engines}
    e0 = engines["target"][base]
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread; target {e0.num_layers} layers x "
          f"{e0.num_kv_heads} kv heads x {e0.head_dim}; draft {engines['draft'][base].num_layers} layers x "
          f"{engines['draft'][base].num_kv_heads} kv heads x {engines['draft'][base].head_dim}")
    result = {"onnxruntime": ort.__version__, "bundle": str(path), "reps": args.reps,
              "round_reps": args.round_reps, "seed": args.seed, "load_order": order, "cases": {},
              "max_abs_diff_vs_base": {}}
    for role in ("target", "draft"):
        result["max_abs_diff_vs_base"][role] = check_identical(engines[role], rng)
    print("max |logits - baseline| on a run/rollback sequence:", result["max_abs_diff_vs_base"])

    cases = [("decode@64", case_decode(64, False)), ("decode@64/fresh", case_decode(64, True)),
             ("decode@512", case_decode(512, False)), ("decode@512/fresh", case_decode(512, True)),
             ("verify4@256", case_verify(4)), ("verify8@256", case_verify(8))]
    if args.quick:
        cases = [cases[0], cases[1], cases[4]]
    for role in ("target", "draft"):
        for label, (setup, timed) in cases:
            key = f"{role} {label}"
            times = run_case(key, engines[role], setup, timed, args.reps, rng)
            result["cases"][key] = summarize(times, base)
            print(f"  {key}: done", file=sys.stderr, flush=True)
    pairs = {n: (engines["target"][n], engines["draft"][n]) for n in table}
    setup, timed = case_rounds()
    times = run_case("rounds", pairs, setup, timed, args.round_reps, rng)
    result["cases"]["round x24 (draft 4 + verify 5)"] = summarize(times, base)

    names = list(table)
    w = max(len(c) for c in result["cases"]) + 2
    print(f"\nmedians over {args.reps} interleaved reps ({args.round_reps} for rounds); ratio = median / "
          f"median of '{base}'; paired = median of per-rep ratios; won = share of reps faster than it")
    for n in names:
        print(f"\n== {n}\n  {'case':<{w}} {'wall ms':>9} {'ratio':>6} {'paired':>6} {'won':>4}   "
              f"{'cpu ms':>9} {'ratio':>6} {'paired':>6} {'won':>4}")
        for c, r in result["cases"].items():
            line = f"  {c:<{w}}"
            for clk in ("wall", "cpu"):
                s = r[n][clk]
                line += (f" {s['median_ms']:9.3f} {s['ratio']:6.3f} {s['paired_ratio']:6.3f} "
                         f"{100 * s['share_faster']:3.0f}%  ")
            print(line)
    write_atomic(args.json, json.dumps(result, indent=1))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
