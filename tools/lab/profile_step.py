"""Where a decode step's time goes: onnxruntime's profiler on a bundle's graph, a 1-token step and an
n-token verify at a given past, summed by operator type, with the time outside kernels (session.run's
wall time minus the kernels').

    python tools/lab/profile_step.py --bundle bundles/demo [--role target] [--past 200] [--verify 5]
        [--runs 200] [--threads 1] [--json docs/profile_demo_target.json]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from specedge.bench.ours import call_seconds  # noqa: E402
from specedge.engines.ort import OrtEngine, import_onnxruntime  # noqa: E402
from specedge.runtime.files import write_atomic  # noqa: E402
from specedge.runtime.manifest import Manifest  # noqa: E402


def profile(engine: OrtEngine, past: int, n: int, runs: int) -> dict:
    """Run n new tokens on top of `past` cached ones `runs` times under the profiler; per op type:
    total microseconds per run and node count, and the wall time per run."""
    ort = import_onnxruntime()
    rng = np.random.default_rng(0)
    walls = call_seconds(engine, rng.integers(0, engine.vocab_size, size=past), n, runs, rng)
    path = engine.session.end_profiling()
    events = json.loads(Path(path).read_text())
    Path(path).unlink()
    per_op, nodes = defaultdict(float), defaultdict(set)
    runs_seen = sorted(e["ts"] + e["dur"] for e in events if e.get("name") == "model_run")
    after_prefill = runs_seen[0] if runs_seen else -1      # the prefill's kernels are not counted
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > after_prefill:
            op = e["args"].get("op_name", "?")
            per_op[op] += e["dur"]
            nodes[op].add(e["name"])
    total_runs = runs
    kernels = sum(per_op.values()) / total_runs
    wall_us = 1e6 * statistics.median(walls)
    return {"past": past, "new_tokens": n, "runs": runs, "wall_us_median": wall_us,
            "kernel_us_per_run": kernels, "outside_kernels_us": max(0.0, wall_us - kernels),
            "nodes": sum(len(v) for v in nodes.values()),
            "by_op": dict(sorted(((op, {"us_per_run": us / total_runs, "nodes": len(nodes[op])})
                                  for op, us in per_op.items()), key=lambda kv: -kv[1]["us_per_run"]))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--role", default="target", choices=["target", "draft"])
    ap.add_argument("--past", type=int, default=200)
    ap.add_argument("--verify", type=int, default=5, help="tokens of the verify call profiled beside the step")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    m = Manifest.load(args.bundle)
    info = m.models[args.role]
    if info.kind == "eagle":
        raise SystemExit("profile_step.py: a hidden-state head needs the target's features as input; profile the "
                         "target, or a draft model")
    out = {"bundle": str(args.bundle), "role": args.role, "builder": info.builder, "weights": info.weights,
           "threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, args.verify):
            engine = OrtEngine(args.bundle / info.file, vocab_size=m.vocab_size, max_context=m.max_context,
                               threads=args.threads, num_kv_heads=info.num_kv_heads, head_dim=info.head_dim,
                               share_buffer=info.kv_in_place, profile_prefix=str(Path(tmp) / "p"))
            out[f"n{n}"] = profile(engine, args.past, n, args.runs)
    step, ver = out["n1"], out[f"n{args.verify}"]
    out["verify_over_step"] = ver["wall_us_median"] / step["wall_us_median"]
    print(f"{args.bundle} {args.role} ({info.builder}, {info.weights}), past {args.past}, {args.threads} thread(s), "
          f"{step['nodes']} nodes")
    for label, r in (("1-token step", step), (f"{args.verify}-token verify", ver)):
        print(f"  {label}: {r['wall_us_median']:.0f} us ({r['kernel_us_per_run']:.0f} in kernels, "
              f"{r['outside_kernels_us']:.0f} outside)")
        for op, d in list(r["by_op"].items())[:8]:
            print(f"    {op:28s} {d['us_per_run']:8.1f} us  ({d['nodes']} nodes)")
    print(f"  verify / step = {out['verify_over_step']:.2f}")
    if args.json:
        write_atomic(args.json, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
