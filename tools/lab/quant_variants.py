"""Weight-only quantization variants of one model, side by side: each is built by onnxruntime-genai's
model builder with its own --extra_options (block size, accuracy level, ...), then all are timed in one
process, interleaved (a 1-token step and K-token verifies at a given past, medians over repeats), and
compared with the fp32 graph on the fp32 graph's own greedy continuations of held-out prompts
(teacher-forced top-1 agreement and max |delta logit|).

    python tools/lab/quant_variants.py --model ~/.cache/specedge/smollm2/hf \
        --variant fp32 --variant int8 --variant int8:block_size=128 --variant int4:accuracy_level=1 \
        [--prompts models/smollm2/prompts.jsonl] [--past 200] [--verify 2,5,9] [--json docs/quant_variants.json]

Builds are cached under ~/.cache/specedge/variants/ by folder content and options.
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

import numpy as np  # noqa: E402

from specedge.bench.ours import call_seconds  # noqa: E402
from specedge.engines.ort import OrtEngine, import_onnxruntime  # noqa: E402
from specedge.export.genai import run_builder  # noqa: E402
from specedge.runtime.errors import SpecedgeError  # noqa: E402
from specedge.runtime.files import tree_hash, write_atomic  # noqa: E402
from specedge.runtime.manifest import read_prompts  # noqa: E402

CACHE = Path.home() / ".cache" / "specedge" / "variants"


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """'int4:block_size=128,accuracy_level=4' -> ('int4', {'block_size': '128', 'accuracy_level': '4'})."""
    precision, _, opts = text.partition(":")
    options = dict(kv.split("=", 1) for kv in opts.split(",") if kv)
    return precision, options


def build(model: Path, precision: str, options: dict[str, str]) -> Path:
    key = "_".join([precision] + [f"{k}-{v}" for k, v in sorted(options.items())])
    out = CACHE / tree_hash(model)[:12] / key
    if not (out / "model.onnx").is_file():
        t0 = time.time()
        run_builder(model, out, precision=precision, extra_options=options)
        print(f"built {key} in {time.time() - t0:.0f} s", flush=True)
    return out


def engine_for(graph: Path, cfg: dict, threads: int) -> OrtEngine:
    return OrtEngine(graph / "model.onnx", vocab_size=cfg["vocab_size"], max_context=2048, threads=threads,
                     num_kv_heads=cfg["num_key_value_heads"],
                     head_dim=cfg["hidden_size"] // cfg["num_attention_heads"], share_buffer=True)


def timed(engine: OrtEngine, past_ids: np.ndarray, n: int, calls: int, rng) -> float:
    """Median seconds of an n-token call on top of past_ids."""
    return statistics.median(call_seconds(engine, past_ids, n, calls, rng))


def greedy(engine: OrtEngine, prompt: list[int], n: int) -> list[int]:
    engine.truncate(0)
    out = [int(np.argmax(engine.run(np.asarray(prompt), keep=1)[-1]))]
    for _ in range(n - 1):
        out.append(int(np.argmax(engine.run(np.asarray(out[-1:]), keep=1)[-1])))
    return out


def teacher_forced(engine: OrtEngine, seq: list[int], n_prompt: int) -> np.ndarray:
    """Logits at the positions that predict seq[n_prompt:]."""
    engine.truncate(0)
    return engine.run(np.asarray(seq[:-1]), keep=len(seq) - n_prompt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="Hugging Face folder")
    ap.add_argument("--variant", action="append", required=True, help="PRECISION[:key=value,...]")
    ap.add_argument("--prompts", type=Path, default=Path("models/smollm2/prompts.jsonl"))
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--past", type=int, default=200)
    ap.add_argument("--verify", default="2,5,9")
    ap.add_argument("--calls", type=int, default=15, help="calls per timing (median)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds over the variants")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import_onnxruntime()
    from tokenizers import Tokenizer
    cfg = json.loads((args.model / "config.json").read_text())
    graphs, engines, failed = {}, {}, {}
    for v in dict.fromkeys(args.variant):        # a variant the builder or onnxruntime refuses is reported
        try:
            graphs[v] = build(args.model, *parse_variant(v))
            engines[v] = engine_for(graphs[v], cfg, args.threads)
        except SpecedgeError as e:
            failed[v] = " ".join(str(e).split())[:300]
            print(f"{v}: {failed[v]}", flush=True)
    names = list(engines)
    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    prompts = [tok.encode(p).ids for p in read_prompts(args.prompts)[:args.n_prompts]]
    ks = [int(k) for k in args.verify.split(",")]
    rng = np.random.default_rng(0)
    past_ids = rng.integers(0, cfg["vocab_size"], size=args.past)
    times = {v: {n: [] for n in [1] + ks} for v in names}
    for _ in range(args.repeats):            # interleaved: each round visits every variant and size
        for v in names:
            for n in [1] + ks:
                times[v][n].append(timed(engines[v], past_ids, n, args.calls, rng))
    ref_name = next((v for v in names if parse_variant(v)[0] == "fp32"), None)
    seqs = []
    if ref_name:
        seqs = [(p + greedy(engines[ref_name], p, args.new_tokens), len(p)) for p in prompts]
        ref = [teacher_forced(engines[ref_name], s, n) for s, n in seqs]
    rows = {}
    for v in names:
        step = statistics.median(times[v][1])
        row = {"graph_mb": round(sum(f.stat().st_size for f in graphs[v].glob("model.onnx*")) / 1e6, 1),
               "step_ms": round(1e3 * step, 3), "tok_s": round(1 / step, 1),
               "verify_over_step": {k: round(statistics.median(times[v][k]) / step, 3) for k in ks},
               "step_ms_per_repeat": [round(1e3 * t, 3) for t in times[v][1]]}
        if ref_name:
            got = [teacher_forced(engines[v], s, n) for s, n in seqs]
            agree = [float(np.mean(np.argmax(g, -1) == np.argmax(r, -1))) for g, r in zip(got, ref)]
            row["top1_agreement_with_fp32"] = round(float(np.mean(agree)), 4)
            row["max_abs_logit_diff"] = round(max(float(np.abs(g - r).max()) for g, r in zip(got, ref)), 4)
        rows[v] = row
        print(v, json.dumps(row), flush=True)
    if args.json:
        out = {"model": str(args.model), "threads": args.threads, "past": args.past, "calls": args.calls,
               "repeats": args.repeats, "prompts": len(prompts), "new_tokens": args.new_tokens,
               "onnxruntime": import_onnxruntime().__version__, "machine": platform.processor() or platform.machine(),
               "load_average": os.getloadavg(), "variants": rows, "failed": failed}
        write_atomic(args.json, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
