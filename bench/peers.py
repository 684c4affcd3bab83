"""Peer systems for spec-bench: HF transformers (plain vs assisted generate) and onnxruntime-genai (plain vs
speculative), run on the same HF pair, prompts and token budget as specedge.

    python -m specedge.bench.peers --system ortgenai|hf --target HF_DIR --draft HF_DIR --prompts P.jsonl
        [--n-prompts N] --max-new-tokens N --mode greedy|sampled [--temperature 0.8] --k K --threads T
        [--draft-threads T] [--draft-precision fp32|fp16|int8|int4] --cache DIR --json OUT.json [--repeats R]

The benchmark starts one subprocess per peer so that its own process never imports torch or
onnxruntime-genai, and so a peer that crashes natively cannot take it down. Whatever fails, OUT.json is
written with the failing figures null and a one-line "error", and the exit status is 0.

tokens/s of a repeat = new tokens of all prompts / their seconds (prefill included, as generate() does it);
the reported figure is the median over repeats, with min and max. "new_tokens" is the fewest new tokens any
timed generation produced (== --max-new-tokens when forcing the length worked), "new_tokens_max" the most.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from specedge.runtime.files import tree_hash, write_atomic
from specedge.runtime.manifest import read_prompts

from .memory import held_mb, rss_mb

# What a peer raises when its library, model or config is not up to the job (onnxruntime-genai raises
# RuntimeError, transformers ValueError/OSError/TypeError, an older library AttributeError).
PEER_ERRORS = (OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError, ImportError,
               subprocess.SubprocessError)
NGRAM_SIZE = 3          # onnxruntime-genai's docs suggest 3-4 to start; only used when the draft model can't run
PRECISION = "fp32"      # the target's: the same arithmetic as specedge's fp32 graphs (the draft's: --draft-precision)
# Counters of Generator.get_speculative_stats() that add up over generations (the rest are per-generator state).
GENAI_COUNTERS = ("rounds", "draft_tokens_proposed", "draft_tokens_evaluated", "draft_tokens_accepted",
                  "correction_tokens", "bonus_tokens", "tokens_emitted", "draft_forward_passes",
                  "target_forward_passes", "target_verify_forward_passes", "full_accept_rounds",
                  "partial_accept_rounds", "zero_accept_rounds", "ngram_lookup_hits", "ngram_lookup_misses",
                  "total_draft_ms", "total_target_ms")


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def hf_folder(path: Path) -> Path:
    if not (path / "config.json").is_file():     # else both libraries answer with a puzzling hub error
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    return path


def measure(res: dict, n_prompts: int, repeats: int, plain, spec) -> None:
    """A B A B: for each repeat and prompt, plain then speculative, so drift on a shared machine hits both
    alike. plain/spec(i, seed) -> new token ids; spec may be None (then only plain is measured)."""
    tps: dict[str, list[float]] = {"plain": [], "spec": []}
    first: dict[str, list] = {"plain": [], "spec": []}
    counts = []
    variants = [("plain", plain)] + ([("spec", spec)] if spec is not None else [])
    for r in range(repeats):
        acc = {name: [0, 0.0] for name, _ in variants}
        for i in range(n_prompts):
            seed = 1000 * r + i + 1     # the same seed for both variants; never -1 (genai: "random")
            for name, fn in variants:
                t0 = time.perf_counter()
                toks = fn(i, seed)
                dt = time.perf_counter() - t0
                acc[name][0] += len(toks)
                acc[name][1] += dt
                counts.append(len(toks))
                if r == 0:
                    first[name].append(toks)
        for name, (n, secs) in acc.items():
            tps[name].append(n / secs)
    for name, _ in variants:
        v = tps[name]
        res.update({f"{name}_tps": statistics.median(v), f"{name}_tps_min": min(v), f"{name}_tps_max": max(v),
                    f"{name}_tps_runs": v})
    res["new_tokens"], res["new_tokens_max"] = min(counts), max(counts)
    if res["mode"] == "greedy" and spec is not None:
        # fp32 on CPU: a correct speculative decoder reproduces plain greedy exactly
        res["greedy_identical"] = first["plain"] == first["spec"]


# ---------------------------------------------------------------------------------------------------------
# HF transformers

def run_hf(args, prompts: list[str], res: dict) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers as tf
    tf.utils.logging.set_verbosity_error()      # keep stderr for real errors: the benchmark shows its tail
    tf.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    res["versions"] = {"torch": torch.__version__, "transformers": tf.__version__}
    res["memory_floor"] = {"peak": rss_mb(), "held": held_mb()}       # once its libraries are imported
    t0 = time.perf_counter()
    tok = tf.AutoTokenizer.from_pretrained(hf_folder(args.target), local_files_only=True)

    def load(path):
        return tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()

    target = load(args.target)
    calls = {"target": 0, "draft": 0}
    target.register_forward_hook(lambda *_: calls.__setitem__("target", calls["target"] + 1))
    ids = [tok(p, return_tensors="pt").input_ids for p in prompts]
    res["prompt_tokens"] = [int(x.shape[1]) for x in ids]
    res["setup_s"] = time.perf_counter() - t0

    pad = target.generation_config.pad_token_id
    pad = pad if pad is not None else (tok.eos_token_id if tok.eos_token_id is not None else 0)
    # min_new_tokens masks EOS until the budget is reached, so every run makes the same number of tokens
    kw = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, pad_token_id=pad)
    if args.mode == "sampled":
        kw.update(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False)
    totals = {"plain": {"target": 0, "draft": 0, "tokens": 0, "runs": 0},
              "spec": {"target": 0, "draft": 0, "tokens": 0, "runs": 0}}

    def variant(name, assistant):
        def run(i, seed):
            torch.manual_seed(seed)
            before = dict(calls)
            with torch.inference_mode():
                out = target.generate(ids[i], attention_mask=torch.ones_like(ids[i]), assistant_model=assistant,
                                      **kw)
            new = out[0, ids[i].shape[1]:].tolist()
            t = totals[name]
            t["target"] += calls["target"] - before["target"]
            t["draft"] += calls["draft"] - before["draft"]
            t["tokens"] += len(new)
            t["runs"] += 1
            return new
        return run

    plain = variant("plain", None)
    plain(0, 0)                                   # warm-ups: first-call allocations and lazy inits
    res["memory_floor"]["plain_held"] = held_mb()    # the target alone, as our target-only process
    try:                                          # a draft that cannot run still leaves the plain figures
        draft = load(hf_folder(args.draft))
        # AssistedCandidateGenerator reads these from the assistant's own generation_config, not from
        # generate()'s kwargs; threshold 0 turns off the early stop on low draft confidence: K every round.
        dgc = draft.generation_config
        dgc.num_assistant_tokens, dgc.num_assistant_tokens_schedule = args.k, "constant"
        dgc.assistant_confidence_threshold = 0.0
        draft.register_forward_hook(lambda *_: calls.__setitem__("draft", calls["draft"] + 1))
        spec = variant("spec", draft)
        spec(0, 0)
    except PEER_ERRORS as e:
        res["error"] = f"assisted: {one_line(e)}"
        spec = None
    for t in totals.values():
        t.update(target=0, draft=0, tokens=0, runs=0)
    log(f"hf {args.mode}: {len(prompts)} prompts x {args.repeats} repeats, K={args.k}")
    measure(res, len(prompts), args.repeats, plain, spec)
    s = totals["spec"]
    if s["runs"]:
        # target calls include the prefill; HF reports no acceptance counters, these are what it can show
        res["spec_stats"] = {"target_forward_calls": s["target"], "draft_forward_calls": s["draft"],
                             "new_tokens": s["tokens"], "generations": s["runs"],
                             "tokens_per_target_call": s["tokens"] / max(1, s["target"]),
                             "plain_target_forward_calls": totals["plain"]["target"]}


# ---------------------------------------------------------------------------------------------------------
# onnxruntime-genai

def content_key(folder: Path, precision: str) -> str:
    """Hash of every file's name and bytes: a retrained or re-exported model gets a fresh build."""
    import onnxruntime_genai as og
    return tree_hash(folder, f"og={og.__version__} p={precision} e=cpu")


def _publish(tmp: Path, out: Path) -> None:
    """Build into tmp, then rename: a half-written folder is never taken for a cached build."""
    try:
        os.replace(tmp, out)
    except OSError:
        if not (out / "genai_config.json").is_file():     # not a concurrent peer that won the race
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def build(src: Path, cache: Path, precision: str = PRECISION) -> tuple[Path, str]:
    key = content_key(src, precision)
    out = cache / f"og-{key}"
    if (out / "genai_config.json").is_file():
        return out, key
    tmp = cache / f".tmp-og-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"building {src} with the onnxruntime-genai model builder -> {out}")
    from specedge.export.genai import run_builder    # one builder invocation for export and peers
    try:
        run_builder(src, tmp, precision=precision)
    except Exception as e:  # ExportError, or the builder's own: reported as this peer's error
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(str(e)) from e
    _publish(tmp, out)
    return out, key


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)          # the composite needs its own folder, not a second copy of the weights
    except OSError:
        shutil.copy2(src, dst)


def composite(tdir: Path, tkey: str, ddir: Path, dkey: str, cache: Path) -> Path:
    """genai_config.json with the target's decoder block as model.decoder and the draft's as model.draft.
    Both models sit in subfolders: genai refuses a '..' in a filename as path traversal."""
    out = cache / f"spec-{tkey}-{dkey}"
    if (out / "genai_config.json").is_file():
        return out
    tmp = cache / f".tmp-spec-{tkey}-{dkey}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for sub, src in (("target", tdir), ("draft", ddir)):
        shutil.copytree(src, tmp / sub, copy_function=_link_or_copy)
    for f in tdir.iterdir():      # tokenizer and processing files: the composite tokenizes like the target
        if f.is_file() and not f.name.startswith("model.onnx") and f.name != "genai_config.json":
            shutil.copy2(f, tmp / f.name)
    cfg = json.loads((tdir / "genai_config.json").read_text())
    draft_block = json.loads((ddir / "genai_config.json").read_text())["model"]["decoder"]
    cfg["model"]["decoder"]["filename"] = f"target/{cfg['model']['decoder']['filename']}"
    draft_block["filename"] = f"draft/{draft_block['filename']}"
    cfg["model"]["draft"] = draft_block
    cfg["model"]["type"] = "speculative"      # as in genai's own speculative tests
    (tmp / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    _publish(tmp, out)
    return out


def load_genai(og, folder: Path, threads: dict[str, int]):
    """Threads per config block ("decoder", "draft") go in through a config overlay, so one cached build
    serves every --threads."""
    config = og.Config(str(folder))
    so = lambda n: {"intra_op_num_threads": n, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {b: {"session_options": so(n)} for b, n in threads.items()}}))
    return og.Model(config)


def sum_stats(runs: list[dict]) -> dict:
    out: dict = {"generations": len(runs)}
    for key in GENAI_COUNTERS:
        if any(key in s for s in runs):
            v = sum(float(s.get(key, 0)) for s in runs)
            out[key] = int(v) if v.is_integer() and not key.endswith("_ms") else v
    ev, tp = out.get("draft_tokens_evaluated", 0), out.get("target_forward_passes", 0)
    out["acceptance_rate"] = out.get("draft_tokens_accepted", 0) / ev if ev else None
    out["tokens_per_target_pass"] = out.get("tokens_emitted", 0) / tp if tp else None
    if runs:
        out["effective_k"] = runs[-1].get("effective_k")
    return out


def run_ortgenai(args, prompts: list[str], res: dict) -> None:
    import numpy as np
    import onnxruntime_genai as og
    res["versions"] = {"onnxruntime_genai": og.__version__}
    res["memory_floor"] = {"peak": rss_mb(), "held": held_mb()}       # once its libraries are imported
    cache = Path(args.cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tdir, tkey = build(hf_folder(args.target), cache)
    plain_model = load_genai(og, tdir, {"decoder": args.threads})
    tok = og.Tokenizer(plain_model)
    ids = [np.asarray(tok.encode(p), dtype=np.int32) for p in prompts]
    res["prompt_tokens"] = [int(x.shape[0]) for x in ids]
    if args.mode == "sampled":
        # top_k 0 is "no top-k" in genai (checked: same draws as top_k = vocab); the builder's default is 50
        sampling = dict(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)
    else:
        sampling = dict(do_sample=False)
    spec_runs: list[dict] = []

    def variant(model, spec_opts):
        def run(i, seed):
            n = len(ids[i]) + args.max_new_tokens
            params = og.GeneratorParams(model)
            # min_length == max_length: EOS can't end a run early, so every run makes the same tokens
            # random_seed always: genai's default -1 seeds each Generator slowly, greedy or not, which
            # would swamp short runs of a small model (docs/benchmarks.md)
            opts = dict(max_length=n, min_length=n, random_seed=seed, **sampling)
            params.set_search_options(**opts)
            if spec_opts:
                params.set_speculative_options(**spec_opts)
            gen = og.Generator(model, params)
            gen.append_tokens(ids[i][None, :])
            while not gen.is_done():
                gen.generate_next_token()
            new = [int(t) for t in gen.get_sequence(0)[len(ids[i]):]]
            if spec_opts:
                spec_runs.append(gen.get_speculative_stats())
            return new
        return run

    plain = variant(plain_model, None)
    plain(0, 0)                                  # warm-up
    res["memory_floor"]["plain_held"] = held_mb()    # the target alone, as our target-only process
    spec = None
    if args.ortgenai_spec in ("auto", "draft_model"):
        try:
            ddir, dkey = build(hf_folder(args.draft), cache, args.draft_precision)
            spec_model = load_genai(og, composite(tdir, tkey, ddir, dkey, cache),
                                    {"decoder": args.threads, "draft": args.draft_threads})
            spec = variant(spec_model, {"max_draft_tokens": args.k})
            spec(0, 0)                           # warm-up, and the proof that this mode runs
            res["ortgenai_spec_mode"] = "draft_model"
        except PEER_ERRORS as e:
            spec = None
            res["ortgenai_draft_error"] = one_line(e)
            log(f"draft-model speculative decoding failed: {one_line(e)}")
    if spec is None and args.ortgenai_spec in ("auto", "ngram"):
        try:
            spec = variant(plain_model, {"ngram_size": NGRAM_SIZE, "max_draft_tokens": args.k})
            spec(0, 0)
            res["ortgenai_spec_mode"] = "ngram"
        except PEER_ERRORS as e:
            spec = None
            res["ortgenai_ngram_error"] = one_line(e)
    if spec is None:
        res["error"] = "; ".join(f"{m}: {res[k]}" for m, k in (("draft_model", "ortgenai_draft_error"),
                                                                ("ngram", "ortgenai_ngram_error")) if k in res)
    res["setup_s"] = time.perf_counter() - t0
    spec_runs.clear()
    log(f"ortgenai {args.mode} ({res['ortgenai_spec_mode']}): {len(prompts)} prompts x {args.repeats} repeats, "
        f"K={args.k}")
    measure(res, len(prompts), args.repeats, plain, spec)
    if spec is not None:
        res["spec_stats"] = sum_stats(spec_runs)


# ---------------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specedge.bench.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=("ortgenai", "hf"), required=True)
    ap.add_argument("--target", type=Path, required=True, help="target HF folder")
    ap.add_argument("--draft", type=Path, required=True, help="draft HF folder (same tokenizer)")
    ap.add_argument("--prompts", type=Path, required=True, help="JSONL with a 'prompt' per line")
    ap.add_argument("--n-prompts", type=int, default=None, help="use the first N prompts (default: all)")
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--mode", choices=("greedy", "sampled"), required=True)
    ap.add_argument("--temperature", type=float, default=0.8, help="sampled mode only")
    ap.add_argument("--k", type=int, required=True, help="draft tokens per round (fixed)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (onnxruntime-genai: the target's)")
    ap.add_argument("--draft-threads", type=int, default=1, help="onnxruntime-genai's draft's intra-op threads")
    ap.add_argument("--draft-precision", choices=("fp32", "fp16", "int8", "int4"), default=PRECISION,
                    help="onnxruntime-genai's draft weights (as the bundle's draft)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "specedge" / "peers",
                    help="where onnxruntime-genai builds are kept, keyed by the HF folder's content")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ortgenai-spec", choices=("auto", "draft_model", "ngram"), default="auto",
                    help="auto: draft model, falling back to n-gram lookup if it cannot run")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    res: dict = {"system": args.system, "mode": args.mode, "k": args.k, "threads": args.threads,
                 "draft_threads": args.draft_threads, "draft_precision": args.draft_precision,
                 "temperature": args.temperature if args.mode == "sampled" else 0.0,
                 "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "n_prompts": None,
                 "plain_tps": None, "spec_tps": None, "plain_tps_min": None, "plain_tps_max": None,
                 "spec_tps_min": None, "spec_tps_max": None, "new_tokens": None, "spec_stats": {},
                 "ortgenai_spec_mode": None, "error": None}
    try:
        if min(args.repeats, args.k, args.max_new_tokens, args.threads, args.draft_threads) < 1:
            raise ValueError("--repeats, --k, --max-new-tokens, --threads and --draft-threads must be >= 1")
        prompts = read_prompts(args.prompts)[:args.n_prompts or None]
        res["n_prompts"] = len(prompts)
        (run_hf if args.system == "hf" else run_ortgenai)(args, prompts, res)
    except PEER_ERRORS as e:
        res["error"] = one_line(e)
    except Exception as e:  # noqa: BLE001 -- last resort: the benchmark must get its JSON whatever breaks
        traceback.print_exc()
        res["error"] = f"unexpected {one_line(e)}"
    if res["error"]:
        log(f"{args.system}: {res['error']}")
    floor = res.pop("memory_floor", None)
    if floor:      # as bench/memory.py measures ours: MiB above the floor
        above = lambda v: None if v is None or floor["held"] is None else v - floor["held"]
        res["memory"] = {"peak_mb": rss_mb() - (floor["held"] if floor["held"] is not None else floor["peak"]),
                         "held_mb": above(held_mb()),
                         "target_only_held_mb": above(floor.get("plain_held"))}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.json, json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
