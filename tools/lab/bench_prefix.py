"""Prefix reuse across requests, as an editor's completions use it: time to first token with the KV
caches kept between requests (GenerationConfig.prefix_cache, the default) and without.

A session opens a held-out file at a function and asks for a completion after every few tokens the
user "types" (the file's own next tokens), each request's prompt being everything up to the cursor.
The two settings run the same session on separate decoders of one bundle, request by request in
alternating order; the outputs must be identical.

    python tools/lab/bench_prefix.py [--bundle bundles/demo] [--json docs/bench_prefix.json]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from specedge.runtime import SpeculativeDecoder  # noqa: E402
from specedge.runtime.files import write_atomic  # noqa: E402
from specedge.runtime.manifest import Manifest, read_prompts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def first_token_seconds(dec, prompt: list[int], **kw) -> tuple[float, list[int], int]:
    """Seconds until the stream yields its first text, the output ids, and the reused prompt tokens."""
    t0 = time.perf_counter()
    stream = dec.stream(prompt, **kw)
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter() - t0
    res = stream.result
    return (first if first is not None else time.perf_counter() - t0), res.token_ids, res.stats.reused_tokens


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "bundles" / "demo")
    ap.add_argument("--sessions", type=int, default=4, help="prompts (files) to open, from the bundle's")
    ap.add_argument("--context", type=int, default=600, help="prompt tokens when the session starts")
    ap.add_argument("--keystrokes", type=int, default=12, help="completions per session")
    ap.add_argument("--typed", type=int, default=3, help="tokens typed between completions")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="the target's intra-op threads")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    m = Manifest.load(args.bundle)
    load = lambda: SpeculativeDecoder.from_bundle(args.bundle, threads=args.threads, speculative=True)
    decs = {"reuse": load(), "fresh": load()}
    kw = {"reuse": dict(prefix_cache=True), "fresh": dict(prefix_cache=False)}
    # the bundle's prompts grown into long contexts: each prompt repeated from its own text is not real
    # code, so the session's text is the prompts file's prompts joined, from a different start each time
    texts = read_prompts(args.bundle / m.prompts)
    tok = decs["reuse"].tokenizer
    corpus = tok.encode("\n\n".join(texts)).ids
    need = args.context + args.keystrokes * args.typed
    times = {name: [] for name in decs}
    first_request = {name: [] for name in decs}
    reused, identical, requests = [], True, 0
    for s in range(args.sessions):
        start = (s * len(corpus)) // max(1, args.sessions)
        ids = (corpus[start:] + corpus)[:need]
        for i in range(args.keystrokes):
            prompt = ids[:args.context + i * args.typed]
            order = ("reuse", "fresh") if (s + i) % 2 == 0 else ("fresh", "reuse")
            got = {}
            for name in order:
                sec, out, kept = first_token_seconds(decs[name], prompt, max_new_tokens=args.max_new_tokens,
                                                     temperature=0.0, **kw[name])
                got[name] = out
                (first_request if i == 0 else times)[name].append(sec)
                if name == "reuse" and i:
                    reused.append(kept / len(prompt))
            identical &= got["reuse"] == got["fresh"]
            requests += 1
    med = {name: statistics.median(v) for name, v in times.items()}
    result = {"bundle": str(args.bundle), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "threads": args.threads, "sessions": args.sessions, "context": args.context,
              "keystrokes": args.keystrokes, "typed": args.typed, "max_new_tokens": args.max_new_tokens,
              "requests": requests, "outputs_identical": identical,
              "first_token_ms_median": {n: 1e3 * v for n, v in med.items()},
              "first_token_ms_first_request": {n: 1e3 * statistics.median(v) for n, v in first_request.items()},
              "speedup_first_token": med["fresh"] / med["reuse"],
              "reused_fraction_median": statistics.median(reused) if reused else 0.0}
    print(json.dumps(result, indent=1))
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
