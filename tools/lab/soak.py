"""A long run in one process: many requests (greedy and sampled, streams left early, follow-ups that
reuse the previous request's KV, chat when the bundle has a template) until at least --tokens new tokens,
with the resident set sampled after each request. Memory must stay flat once warmed up: the growth from
the end of the warm-up to the end of the run is reported, and the run fails above --max-growth.

    python tools/lab/soak.py [--bundle bundles/demo] [--tokens 20000] [--json docs/soak_demo.json]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from specedge.bench.memory import held_mb  # noqa: E402
from specedge.runtime import SpeculativeDecoder  # noqa: E402
from specedge.runtime.files import write_atomic  # noqa: E402
from specedge.runtime.manifest import Manifest, read_prompts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def requests(dec, prompts: list[str], rng: np.random.Generator):
    """An endless mix of the request kinds an app sends."""
    last = ""
    while True:
        prompt = prompts[int(rng.integers(len(prompts)))]
        kind = str(rng.choice(["greedy", "sampled", "follow-up", "abandoned", "chat"]))
        if kind == "chat" and dec.chat is None:
            kind = "greedy"
        if kind == "follow-up" and last:
            prompt = last[-2000:]
        yield kind, prompt, dict(max_new_tokens=int(rng.integers(16, 96)),
                                 temperature=0.0 if kind in ("greedy", "follow-up") else 0.8,
                                 seed=int(rng.integers(1 << 30)))
        last = prompt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "bundles" / "demo")
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--warmup", type=float, default=0.2, help="share of the tokens counted as warm-up")
    ap.add_argument("--max-growth", type=float, default=0.02)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    m = Manifest.load(args.bundle)
    prompts = read_prompts(args.bundle / m.prompts) if m.prompts else ["def f(x):\n"]
    dec = SpeculativeDecoder.from_bundle(args.bundle, threads=1, speculative=True)
    rng = np.random.default_rng(0)
    tokens, samples, kinds, t0 = 0, [], {}, time.perf_counter()
    for kind, prompt, kw in requests(dec, prompts, rng):
        if kind == "abandoned":          # a client that stops reading: the stream is closed mid-way
            stream = dec.stream(prompt, **kw)
            pieces = iter(stream)
            for _ in range(3):
                next(pieces, None)
            stream.close()
            n = 0
        elif kind == "chat":
            n = len(dec.generate(messages=[{"role": "user", "content": prompt[:400]}], **kw).token_ids)
        else:
            res = dec.generate(prompt, **kw)
            n = len(res.token_ids)
            if kind == "follow-up":
                prompt += res.text
        tokens += n
        kinds[kind] = kinds.get(kind, 0) + 1
        samples.append({"tokens": tokens, "rss_mb": held_mb(), "seconds": round(time.perf_counter() - t0, 2)})
        if tokens >= args.tokens:
            break
    warm = next(s for s in samples if s["tokens"] >= args.warmup * args.tokens)
    growth = (samples[-1]["rss_mb"] - warm["rss_mb"]) / warm["rss_mb"]
    peak = max(s["rss_mb"] for s in samples if s["tokens"] >= warm["tokens"])
    result = {"bundle": str(args.bundle), "tokens": tokens, "requests": len(samples), "by_kind": kinds,
              "seconds": round(time.perf_counter() - t0, 1), "rss_after_warmup_mb": warm["rss_mb"],
              "rss_end_mb": samples[-1]["rss_mb"], "rss_peak_after_warmup_mb": peak, "growth": growth,
              "max_growth": args.max_growth, "flat": growth < args.max_growth,
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
              "samples": samples}
    print(f"{tokens} tokens in {len(samples)} requests ({kinds}), {result['seconds']} s; resident "
          f"{warm['rss_mb']:.1f} MiB after warm-up -> {samples[-1]['rss_mb']:.1f} MiB at the end "
          f"({100 * growth:+.2f} %, peak {peak:.1f}): {'flat' if result['flat'] else 'GROWING'}")
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")
    return 0 if result["flat"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
