#!/usr/bin/env python3
"""One GPU check, prepared to run on a lent GPU machine in a few minutes and write one JSON: for each bundle,
on each GPU execution provider onnxruntime offers (CUDA, TensorRT), against the CPU graph of the same bundle
(and, where TensorRT imports, through TensorRT plans built here: identity and speed):

    parity    logits of a prefill, a 1-token step, a (k+1)-token verify and a rollback: max |diff| vs CPU
    identity  speculative greedy output == target-only greedy output on the provider (token ids)
    check     spec-check's certificate on the provider (greedy, numerics, chi-square of sampled tokens)
    speed     target-only vs speculative tokens/s at batch 1 on the provider, interleaved, medians

Every step that cannot run says why in the JSON ("skipped": reason) instead of stopping the check; a
time budget skips what is left once it is spent. `--cpu-dry-run` runs every step with the CPU provider as
the "device" and the KV cache bound through IOBinding (the CUDA code path's cache), so CI exercises all
of it without a GPU.

    python tools/gpu_check.py --bundle bundles/demo [--bundle bundles/demo_fp16 ...] [--json docs/gpu_check.json]
        [--budget-s 420] [--cpu-dry-run]
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from specedge.engines.ort import OrtEngine, import_onnxruntime
from specedge.runtime import SpeculativeDecoder
from specedge.runtime.check import CheckConfig, certify
from specedge.runtime.errors import SpecedgeError
from specedge.runtime.files import write_atomic
from specedge.runtime.manifest import Manifest, read_prompts

GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


def environment(dry_run: bool) -> dict:
    ort = import_onnxruntime()
    env = {"onnxruntime": ort.__version__, "available_providers": ort.get_available_providers(),
           "python": platform.python_version(), "machine": platform.machine(), "dry_run": dry_run}
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        env["gpu"] = out.stdout.strip() or out.stderr.strip()
    else:
        env["gpu"] = None
    try:
        import tensorrt
        env["tensorrt"] = tensorrt.__version__
    except ImportError as e:          # TensorRT's Python package is not on the machine
        env["tensorrt"] = None
        env["tensorrt_why"] = str(e)
    return env


def providers_to_check(env: dict, dry_run: bool) -> dict[str, str | None]:
    """alias -> None (runs) or the reason it cannot."""
    if dry_run:
        return {"cpu": None}
    out = {}
    for alias, name in GPU_PROVIDERS.items():
        if name not in env["available_providers"]:
            out[alias] = (f"{name} is not in this onnxruntime build ({env['onnxruntime']}, providers "
                          f"{env['available_providers']}): install onnxruntime-gpu")
        else:
            out[alias] = None
    return out


def parity(bundle: Path, m: Manifest, provider: str, *, k: int) -> dict:
    """Each model's logits on the provider against the CPU graph: prefill, step, verify, rollback."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, m.vocab_size, size=24)
    cont = rng.integers(0, m.vocab_size, size=k + 1)
    out = {}
    for role, info in m.models.items():
        if info.kind == "eagle":
            out[role] = {"skipped": "a hidden-state head reads the target's features; the target's parity covers it"}
            continue
        kw = dict(vocab_size=m.vocab_size, max_context=m.max_context, num_kv_heads=info.num_kv_heads,
                  head_dim=info.head_dim, share_buffer=info.kv_in_place, threads=1)
        cpu = OrtEngine(bundle / info.file, providers=["cpu"], **kw)
        dev = OrtEngine(bundle / info.file, providers=[provider], io_binding=True, **kw)
        rows = {}
        for name, e in (("cpu", cpu), ("dev", dev)):
            e.truncate(0)
            prefill = np.array(e.run(ids, keep=1))
            step = np.array(e.run(cont[:1], keep=1))
            e.truncate(len(ids))
            verify = np.array(e.run(cont))
            e.truncate(len(ids))
            again = np.array(e.run(cont))
            rows[name] = {"prefill": prefill, "step": step, "verify": verify, "rollback": again}
        diffs = {case: float(np.abs(rows["dev"][case] - rows["cpu"][case]).max()) for case in rows["cpu"]}
        out[role] = {"max_abs_diff": diffs, "providers": dev.providers,
                     "argmax_equal": all(bool((rows["dev"][c].argmax(-1) == rows["cpu"][c].argmax(-1)).all())
                                         for c in rows["cpu"])}
    return out


def identity_and_speed(dec: SpeculativeDecoder, prompts: list[str], *, new_tokens: int, repeats: int) -> dict:
    """Greedy ids speculative vs target-only on each prompt, and tokens/s of both, interleaved."""
    run = lambda p, spec: dec.generate(p, max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                                       prefix_cache=False, speculative=spec)
    for spec in (False, True):       # warm-up: the first runs of a GPU session pay for its allocations
        run(prompts[0], spec)
    same, tps = [], {False: [], True: []}
    for rep in range(repeats):
        totals = {False: [0, 0.0], True: [0, 0.0]}
        for i, p in enumerate(prompts):
            got = {}
            for spec in ((False, True) if (rep + i) % 2 == 0 else (True, False)):
                t0 = time.perf_counter()
                r = run(p, spec)
                totals[spec][0] += r.stats.new_tokens
                totals[spec][1] += time.perf_counter() - t0
                got[spec] = r.token_ids
            if rep == 0:
                same.append(got[True] == got[False])
        for spec, (n, secs) in totals.items():
            tps[spec].append(n / secs)
    plain, spec = statistics.median(tps[False]), statistics.median(tps[True])
    return {"greedy_identical": all(same), "identical_per_prompt": same, "target_only_tps": plain,
            "speculative_tps": spec, "speedup": spec / plain, "tps_runs": {"target_only": tps[False],
                                                                            "speculative": tps[True]}}


def check_bundle(bundle: Path, provider: str, *, deadline: float, quick: bool) -> dict:
    m = Manifest.load(bundle)
    prompts = read_prompts(bundle / m.prompts)[:3] if m.prompts else ["def add(a, b):", "for i in range(10):"]
    res = {"dtypes": {role: info.dtype for role, info in m.models.items()},
           "weights": {role: info.weights for role, info in m.models.items()}}
    steps = {
        "parity": lambda: parity(bundle, m, provider, k=min(4, m.max_draft_tokens)),
        "identity_speed": lambda: identity_and_speed(
            SpeculativeDecoder.from_bundle(bundle, providers=[provider], threads=1, speculative=True),
            prompts, new_tokens=16 if quick else 64, repeats=1 if quick else 3),
        "spec_check": lambda: _certificate(bundle, provider, prompts, quick=quick),
    }
    for name, fn in steps.items():
        if time.monotonic() > deadline:
            res[name] = {"skipped": "the time budget was spent"}
            continue
        t0 = time.monotonic()
        try:
            res[name] = fn()
        except (SpecedgeError, OSError, RuntimeError, ValueError) as e:   # onnxruntime raises RuntimeError
            res[name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
        res[name]["seconds"] = round(time.monotonic() - t0, 2)
    return res


def _certificate(bundle: Path, provider: str, prompts: list[str], *, quick: bool) -> dict:
    cfg = (CheckConfig(prompts=1, new_tokens=12, samples=200, sampling_prompts=1, ks=(1,), lookup=0) if quick else
           CheckConfig(prompts=4, new_tokens=48, samples=1000, sampling_prompts=1))
    cert = certify(bundle, cfg, providers=[provider], threads=1, prompts=prompts, log=lambda _: None)
    c = cert["checks"]
    return {"passed": cert["passed"], "greedy": c["greedy"]["passed"], "numerics": c["numerics"]["passed"],
            "verify_vs_steps_max_abs": c["numerics"]["target"]["verify_vs_steps_max_abs"],
            "sampling_p": [r["p_value"] for r in c.get("sampling", {}).get("prompts", [])],
            "providers": cert["environment"]["providers"]}


def check_plans(bundle: Path, *, quick: bool) -> dict:
    """TensorRT plans built from the bundle here (spec-export engine), then identity and speed through them."""
    from specedge.export.tensorrt import build_engines
    m = Manifest.load(bundle)
    prompts = read_prompts(bundle / m.prompts)[:3] if m.prompts else ["def add(a, b):", "for i in range(10):"]
    t0 = time.monotonic()
    build_engines(bundle, overwrite=True, quiet=True)
    res = {"build_seconds": round(time.monotonic() - t0, 1)}
    res.update(identity_and_speed(SpeculativeDecoder.from_bundle(bundle, engine="tensorrt", speculative=True),
                                  prompts, new_tokens=16 if quick else 64, repeats=1 if quick else 3))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, action="append", required=True)
    ap.add_argument("--json", type=Path, default=Path("docs/gpu_check.json"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting steps after this many seconds")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="no GPU: every step on the CPU provider, the KV cache through IOBinding (for CI)")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and samples (the dry run's tests)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    env = environment(args.cpu_dry_run)
    report = {"check": "specedge gpu", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "environment": env, "bundles": {}}
    for alias, why in providers_to_check(env, args.cpu_dry_run).items():
        for bundle in args.bundle:
            key = f"{bundle.name}/{alias}"
            if why:
                report["bundles"][key] = {"skipped": why}
            else:
                try:
                    report["bundles"][key] = check_bundle(bundle, alias, deadline=deadline, quick=args.quick)
                except SpecedgeError as e:            # a bundle that does not load: said, and the rest goes on
                    report["bundles"][key] = {"error": str(e)}
            print(f"{key}: {json.dumps(report['bundles'][key], default=str)[:600]}", flush=True)
    for bundle in args.bundle:          # TensorRT's own plans, where TensorRT imports (a GPU machine's image may lack it)
        key = f"{bundle.name}/tensorrt-plan"
        if args.cpu_dry_run or not env.get("tensorrt"):
            report["bundles"][key] = {"skipped": "no GPU (dry run)" if args.cpu_dry_run
                                      else f"TensorRT does not import: {env.get('tensorrt_why')}"}
        elif time.monotonic() > deadline:
            report["bundles"][key] = {"skipped": "the time budget was spent"}
        else:
            try:
                report["bundles"][key] = check_plans(bundle, quick=args.quick)
            except (SpecedgeError, OSError, RuntimeError, ValueError) as e:
                report["bundles"][key] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
        print(f"{key}: {json.dumps(report['bundles'][key], default=str)[:600]}", flush=True)
    report["seconds"] = round(time.monotonic() - t0, 1)
    write_atomic(args.json, json.dumps(report, indent=1, default=float) + "\n")
    print(f"wrote {args.json} in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
