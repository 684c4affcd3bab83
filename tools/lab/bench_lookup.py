"""Prompt lookup (GenerationConfig.ngram) on a bundle: tokens/s of target-only decoding, the draft
model alone, the draft model with prompt lookup, and prompt lookup alone (no draft model loaded),
greedy and at T = 0.8, on the bundle's prompts. Interleaved (every prompt runs each variant back to
back, the order alternating), summed over prompts and repeats; ratios to target-only in one run.

    python tools/lab/bench_lookup.py [--bundle bundles/demo] [--ngram 3] [--prompts 30] [--json /tmp/bench_lookup.json]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from specedge.runtime.files import write_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "bundles" / "demo")
    ap.add_argument("--ngram", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=30, help="every n-th of the bundle's prompts, this many")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="the target's intra-op threads")
    ap.add_argument("--json", type=Path, default=Path("/tmp/bench_lookup.json"))
    args = ap.parse_args(argv)
    from specedge.runtime import GenerationConfig, Manifest, SpeculativeDecoder, __version__
    from specedge.runtime.manifest import read_prompts

    prompts = read_prompts(args.bundle / Manifest.load(args.bundle).prompts)
    prompts = prompts[::max(1, len(prompts) // args.prompts)][:args.prompts]
    pair = SpeculativeDecoder.from_bundle(args.bundle, threads=args.threads, config=GenerationConfig(),
                                          speculative=True)
    # the same target graph without a draft model: lookup is the only drafter
    solo = SpeculativeDecoder.from_bundle(args.bundle, threads=args.threads, config=GenerationConfig(),
                                          speculative=False)
    variants = {"target_only": (pair, {"speculative": False}), "draft_model": (pair, {}),
                "draft_model+lookup": (pair, {"ngram": args.ngram}),
                "lookup_only": (solo, {"speculative": True, "ngram": args.ngram})}
    result = {"bundle": str(args.bundle), "ngram": args.ngram, "prompts": len(prompts), "repeats": args.repeats,
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, "specedge": __version__,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for mode, temperature in (("greedy", 0.0), ("sampled", 0.8)):
        agg = {name: dict(tokens=0, seconds=0.0, rounds=0, accepted=0, evaluated=0, lookup_rounds=0,
                          lookup_accepted=0, lookup_evaluated=0) for name in variants}
        outputs: dict[int, list[int]] = {}
        for rep in range(args.repeats):
            for i, prompt in enumerate(prompts):
                order = list(variants.items())
                for name, (dec, over) in (order if (rep + i) % 2 == 0 else order[::-1]):
                    t0 = time.perf_counter()
                    r = dec.generate(prompt, max_new_tokens=args.max_new_tokens, ignore_eos=True,
                                     temperature=temperature, seed=i, prefix_cache=False, **over)
                    a = agg[name]
                    a["seconds"] += time.perf_counter() - t0
                    a["tokens"] += len(r.token_ids)
                    for key in ("rounds", "accepted", "evaluated", "lookup_rounds", "lookup_accepted",
                                "lookup_evaluated"):
                        a[key] += getattr(r.stats, key)
                    if temperature == 0:      # greedy: every variant must give the target's own tokens
                        if outputs.setdefault(i, r.token_ids) != r.token_ids:
                            raise SystemExit(f"{name}: greedy output differs from the other variants on prompt {i}")
        base = agg["target_only"]["tokens"] / agg["target_only"]["seconds"]
        ratio = lambda num, den: num / den if den else None       # pooled over requests
        result[mode] = {name: {**a, "tokens_per_second": a["tokens"] / a["seconds"],
                               "speedup": a["tokens"] / a["seconds"] / base,
                               "alpha": ratio(a["accepted"], a["evaluated"]),
                               "lookup_alpha": ratio(a["lookup_accepted"], a["lookup_evaluated"]),
                               "lookup_round_fraction": a["lookup_rounds"] / a["rounds"]}
                        for name, a in agg.items()}
        for name, v in result[mode].items():
            la = f"{v['lookup_alpha']:.2f}" if v["lookup_alpha"] is not None else "-"
            print(f"{mode:8s} {name:20s} {v['tokens_per_second']:7.1f} tok/s  {v['speedup']:.3f}x  "
                  f"lookup rounds {v['lookup_round_fraction']:.0%} (alpha {la})", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.json, json.dumps(result, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
