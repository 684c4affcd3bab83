"""Measure the demo pair's quality targets with specedge's own runtime on the demo bundle (target
fp32, draft int8 weights: demo_bundle.py's DEMO_EXPORT, as tools/demo.py exports it), and write every
figure as JSON plus the model card (markdown beside the weights).

    python tools/demo_pair/eval_demo_pair.py [--models models] [--bundle bundles/demo] [--work ~/.cache/specedge/demo]
                                   [--json models/eval.json] [--card models/MODEL_CARD.md]
                                   [--windows 64] [--prompts N] [--max-new-tokens 64] [--draft-dtype fp32]
    python tools/demo_pair/eval_demo_pair.py --from-json models/eval.json --card models/MODEL_CARD.md   # card only

Steps:
1. export the pair (--models/target, --models/draft, --models/prompts.jsonl) into --bundle with the demo's
   settings (K <= 8, context 1024; --draft-dtype overrides the draft's weights, into its own bundle) -- or
   reuse the bundle when it holds exactly that export;
2. held-out next-token loss (nats/token), top-1 accuracy and bits per byte of BOTH graphs, run by
   OrtEngine over fixed non-overlapping 256-token windows of heldout.bin (the windows of
   recipe.evaluate; bytes per token from data.json);
3. on the held-out prompts: alpha / acceptance rate / tokens per target call at K=4 greedy and at
   temperature 0.8 (seeded), the target's greedy continuations' distinct-token ratio (the "not loops"
   aim), whether speculative greedy reproduces target-only greedy, c and r(4) as the loops made the calls
   (the c of the quality targets) and in spec-bench's microbenchmark (bench.ours.step_costs),
   and the speculative / target-only tokens/s ratio at K=4 greedy (interleaved, median over prompts);
4. whether each quality target is met, in the JSON and the card.

Everything runs with ONE thread (ONNX Runtime intra-op, BLAS, torch for the export).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from specedge.runtime.costs import per_call_costs  # noqa: E402
from specedge.runtime.files import write_atomic  # noqa: E402
from specedge.runtime.manifest import read_prompts  # noqa: E402

# sibling modules (this folder is on sys.path when the script runs)
import demo_bundle  # noqa: E402  (the demo bundle's one export path and settings, shared with tools/demo.py)
from demo_bundle import ROOT  # noqa: E402
from demo_card import card  # noqa: E402  (the card's rendering; this file measures)
from recipe import extra_files  # noqa: E402

CONTEXT = 256            # the training context; windows are CONTEXT + 1 tokens
K = 4
TEMPERATURE = 0.8
THREADS = 1

# The demo pair's quality targets: (key, figure, comparison, aim).
TARGETS = [
    ("target_top1", "target held-out top-1 accuracy", ">=", 0.45),
    ("target_distinct", "target 64-token greedy continuations: distinct-token ratio", ">=", 0.40),
    ("bpb_target_below_draft", "target held-out bits/byte < draft's", "<", None),
    ("alpha_greedy_k4", "alpha, K=4, greedy", ">=", 0.80),
    ("alpha_t08_k4", "alpha, K=4, temperature 0.8", ">=", 0.75),
    ("c", "c = draft / target 1-token step, as the loops call them (onnxruntime, 1 thread)", "<=", 0.10),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- 1. the bundle -----------------------------------------------------------------------------------
def ensure_bundle(bundle: Path, target: Path, draft: Path, prompts: Path, draft_dtype: str | None) -> dict:
    """The demo bundle, exported (or reused) by the one export path and settings of tools/demo.py
    (demo_bundle.py)."""
    import torch
    torch.set_num_threads(THREADS)
    t0 = time.perf_counter()
    settings = {**demo_bundle.DEMO_EXPORT, **({"draft_dtype": draft_dtype} if draft_dtype else {})}
    reused = demo_bundle.ensure_bundle(bundle, target, draft, prompts, settings=settings)
    log(f"{'reused' if reused else 'exported'} bundle {bundle}")
    return {"path": str(bundle), "reused": reused, "export_settings": settings,
            "export_seconds": 0.0 if reused else round(time.perf_counter() - t0, 1)}


# -- 2. held-out loss / top-1 / bits per byte ----------------------------------------------------------
def window_starts(n_tokens: int, windows: int) -> list[int]:
    """recipe.evaluate's windows: fixed, non-overlapping, spread over the held-out tokens."""
    step = max(CONTEXT + 1, (n_tokens - CONTEXT - 1) // windows)
    return list(range(0, n_tokens - CONTEXT - 1, step))[:windows]


def heldout_eval(engine, data: np.ndarray, starts: list[int], bytes_per_token: float) -> dict:
    nll, correct, count = 0.0, 0, 0
    t0 = time.perf_counter()
    for s in starts:
        window = data[s:s + CONTEXT + 1].astype(np.int64)
        engine.truncate(0)
        logits = engine.run(window[:-1]).astype(np.float64)           # [CONTEXT, vocab]
        truth = window[1:]
        m = logits.max(-1)
        logz = m + np.log(np.exp(logits - m[:, None]).sum(-1))
        nll += float((logz - logits[np.arange(len(truth)), truth]).sum())
        correct += int((logits.argmax(-1) == truth).sum())
        count += len(truth)
    engine.truncate(0)
    loss = nll / count
    return {"loss": loss, "top1": correct / count, "bits_per_byte": loss / math.log(2) / bytes_per_token,
            "perplexity": math.exp(loss), "tokens": count, "windows": len(starts),
            "seconds": round(time.perf_counter() - t0, 2)}


# -- 3. generation on the held-out prompts --------------------------------------------------------------
def load_prompts(path: Path, n: int | None) -> list[dict]:
    rows = read_prompts(path, records=True)
    if n and n < len(rows):       # evenly spaced, so both kinds (functions first, then edits) are in
        rows = [rows[i] for i in sorted({round(x) for x in np.linspace(0, len(rows) - 1, n)})]
    return rows


def distinct_ratio(ids: list[int]) -> float:
    return len(set(ids)) / len(ids) if ids else 0.0


def pooled(runs: list[dict], key: str) -> dict:
    """alpha etc. pooled over prompts (sums of counts), as spec-bench does."""
    s = {f: sum(r[key][f] for r in runs) for f in ("accepted", "evaluated", "drafted", "new_tokens",
                                                   "target_calls", "rounds", "draft_calls", "seconds_target",
                                                   "seconds_draft")}
    hist = np.sum([r[key]["accepted_hist"] for r in runs], axis=0).tolist()
    return {"alpha": s["accepted"] / s["evaluated"] if s["evaluated"] else None,
            "acceptance_rate": s["accepted"] / s["drafted"] if s["drafted"] else None,
            "tokens_per_target_call": s["new_tokens"] / s["target_calls"] if s["target_calls"] else None,
            "alpha_mean_over_prompts": statistics.fmean(r[key]["alpha"] for r in runs),
            "accepted_hist": hist, **s}


def loop_costs(runs: list[dict]) -> dict:
    """Engine time per call as the loops made the calls: target-only steps (plain), and the K=4 greedy
    rounds' draft steps (each run right after a verify) and verifies. What the speedup pays, unlike a
    microbenchmark's pattern (step_costs)."""
    spec = pooled(runs, "greedy")
    return {**per_call_costs(pooled(runs, "plain"), spec), "draft_calls": spec["draft_calls"]}


def stat_fields(stats) -> dict:
    return {"alpha": stats.alpha, "acceptance_rate": stats.acceptance_rate,
            "tokens_per_target_call": stats.tokens_per_target_call, "accepted": stats.accepted,
            "evaluated": stats.evaluated, "drafted": stats.drafted, "new_tokens": stats.new_tokens,
            "target_calls": stats.target_calls, "rounds": stats.rounds, "accepted_hist": list(stats.accepted_hist),
            "draft_calls": stats.draft_calls, "seconds_target": stats.seconds_target,
            "seconds_draft": stats.seconds_draft,
            "decode_tokens_per_second": stats.tokens_per_second}


def generation_eval(dec, prompts: list[dict], *, max_new_tokens: int) -> dict:
    # every round drafts K (no early stop): alpha as the quality targets define it, at a fixed K
    # timed end to end, prefill included: every request prefills its whole prompt
    common = dict(max_new_tokens=max_new_tokens, ignore_eos=True, draft_confidence=0.0, prefix_cache=False)
    warm = prompts[0]["prompt"]
    for spec in (False, True):                 # first calls pay one-time allocation costs
        dec.generate(warm, max_new_tokens=8, k=K, speculative=spec, temperature=0.0, ignore_eos=True,
                     draft_confidence=0.0)
    runs = []
    t_start = time.perf_counter()
    for i, p in enumerate(prompts):
        timed = {}
        order = (False, True) if i % 2 == 0 else (True, False)      # interleaved: A B, B A, ...
        for spec in order:
            t0 = time.perf_counter()
            res = dec.generate(p["prompt"], k=K, speculative=spec, temperature=0.0, seed=i, **common)
            timed[spec] = (res, time.perf_counter() - t0)
        (plain, t_plain), (greedy, t_spec) = timed[False], timed[True]
        sampled = dec.generate(p["prompt"], k=K, temperature=TEMPERATURE, seed=i, **common)
        runs.append({
            "index": i, "kind": p.get("kind", "?"), "file": p.get("file"),
            "prompt_tokens": plain.stats.prompt_tokens,
            "distinct": distinct_ratio(plain.token_ids),
            "greedy_identical": greedy.token_ids == plain.token_ids,
            "plain": stat_fields(plain.stats), "greedy": stat_fields(greedy.stats), "t08": stat_fields(sampled.stats),
            "speedup_e2e": (len(greedy.token_ids) / t_spec) / (len(plain.token_ids) / t_plain),
            "speedup_decode": (greedy.stats.tokens_per_second / plain.stats.tokens_per_second
                               if plain.stats.tokens_per_second else None),
            "plain_tokens_per_second_e2e": len(plain.token_ids) / t_plain,
            "spec_tokens_per_second_e2e": len(greedy.token_ids) / t_spec,
            "continuation": plain.text,
        })
        if (i + 1) % 10 == 0 or i + 1 == len(prompts):
            log(f"  prompts {i + 1}/{len(prompts)}  ({time.perf_counter() - t_start:.0f} s)")

    def summary(rs: list[dict]) -> dict:
        e2e = [r["speedup_e2e"] for r in rs]
        dec_ = [r["speedup_decode"] for r in rs if r["speedup_decode"]]
        return {"prompts": len(rs), "distinct": statistics.fmean(r["distinct"] for r in rs),
                "distinct_min": min(r["distinct"] for r in rs),
                "greedy_identical_fraction": statistics.fmean(r["greedy_identical"] for r in rs),
                "greedy_k4": pooled(rs, "greedy"), "t08_k4": pooled(rs, "t08"), "loop_costs": loop_costs(rs),
                "speedup_k4_greedy_e2e_median": statistics.median(e2e),
                "speedup_k4_greedy_e2e_min": min(e2e), "speedup_k4_greedy_e2e_max": max(e2e),
                "speedup_k4_greedy_decode_median": statistics.median(dec_) if dec_ else None,
                "plain_tokens_per_second_e2e_median": statistics.median(
                    r["plain_tokens_per_second_e2e"] for r in rs),
                "spec_tokens_per_second_e2e_median": statistics.median(
                    r["spec_tokens_per_second_e2e"] for r in rs)}

    kinds = sorted({r["kind"] for r in runs})
    return {"all": summary(runs), "by_kind": {k: summary([r for r in runs if r["kind"] == k]) for k in kinds},
            "per_prompt": runs, "seconds": round(time.perf_counter() - t_start, 1)}


# -- model facts ----------------------------------------------------------------------------------------
def safetensors_params(folder: Path) -> int:
    """Parameters stored in the folder's safetensors (tied embeddings counted once), from the headers."""
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                total += math.prod(info["shape"])
    return total


def file_bytes(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def checkpoint_state(work: Path | None, kind: str, last_step: int | None) -> dict | None:
    """The training state of --work's checkpoint when it is the packaged one (same step): cool-down."""
    ckpt = work / f"{kind}.pt" if work else None
    if ckpt is None or not ckpt.is_file():
        return None
    try:
        import torch
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state"]
    except Exception as e:  # noqa: BLE001 -- optional detail for the card
        log(f"note: cannot read {ckpt} ({e})")
        return None
    if state.get("step") != last_step:
        log(f"note: {ckpt} is at step {state.get('step')}, the packaged {kind} at {last_step}; "
            f"its cool-down is not reported")
        return None
    # every finished cool-down, oldest first: a `--rewarm` run trains on after each but the last
    cooldowns = [st["cooldown"] for st in state.get("stages", [])]
    lrs = [st.get("lr") for st in state.get("stages", [])]          # each stage's peak LR (None: the base)
    if state.get("cooldown"):
        cooldowns.append(state["cooldown"])
        lrs.append(state.get("lr"))
    return {"step": state["step"], "tokens": state["tokens"], "cooldown": state.get("cooldown"),
            "cooldowns": cooldowns, "tvd": state.get("tvd"), "unlikelihood": state.get("unlikelihood"),
            "teachers": state.get("teachers"), "on_policy": state.get("on_policy"), "lrs": lrs}


def model_facts(folder: Path, bundle: Path, role: str, work: Path | None) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    params = safetensors_params(folder)
    tlog_path = folder / "training_log.json"
    tlog = json.loads(tlog_path.read_text()) if tlog_path.is_file() else []
    last = tlog[-1] if tlog else {}
    onnx_dir = bundle / role
    manifest = json.loads((bundle / "manifest.json").read_text())
    return {
        "folder": str(folder),
        "architecture": cfg.get("architectures", [cfg.get("model_type")])[0],
        "config": {**{k: cfg.get(k) for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                             "num_attention_heads", "num_key_value_heads", "vocab_size",
                                             "max_position_embeddings", "tie_word_embeddings", "hidden_act",
                                             "rms_norm_eps")},
                   "rope_theta": cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta"))},
        "parameters": params,
        "fp32_bytes": 4 * params,
        "safetensors_fp16_bytes": file_bytes(folder.glob("*.safetensors")),
        "onnx_bytes": file_bytes(onnx_dir.glob("model.onnx*")),
        "onnx_weights": manifest["models"][role].get("weights", "fp32"),
        "training": {"steps": last.get("step"), "tokens": last.get("tokens"), "log_entries": len(tlog),
                     "checkpoint": checkpoint_state(work, role, last.get("step"))},
    }


def heldout_overlap(data: dict, *, threshold: float = 0.5) -> dict:
    """Held-out files with a near-copy in the training corpus (vendored copies in site-packages, ...):
    the share of a held-out file's non-blank lines found in a same-named training file."""
    root = Path(data["stdlib"])
    by_name: dict[str, list[Path]] = {}
    for p in extra_files():
        by_name.setdefault(p.name, []).append(p)
    lines = lambda text: [x.strip() for x in text.splitlines() if x.strip()]
    found, total_bytes = [], 0
    for rel in data.get("heldout_files", []):
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        total_bytes += len(text.encode())
        mine, best = lines(text), (0.0, None)
        for cand in by_name.get(Path(rel).name, []):
            try:
                theirs = set(lines(cand.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError):
                continue
            best = max(best, (sum(x in theirs for x in mine) / max(1, len(mine)), str(cand)))
        if best[0] >= threshold:
            found.append({"file": rel, "training_copy": best[1], "lines_shared": round(best[0], 3),
                          "bytes": len(text.encode())})
    return {"threshold": threshold, "files": found,
            "bytes_fraction": sum(f["bytes"] for f in found) / total_bytes if total_bytes else 0.0}


def target_results(fig: dict) -> dict:
    values = {"target_top1": fig["heldout"]["target"]["top1"],
              "target_distinct": fig["generation"]["all"]["distinct"],
              "bpb_target_below_draft": (fig["heldout"]["target"]["bits_per_byte"],
                                         fig["heldout"]["draft"]["bits_per_byte"]),
              "alpha_greedy_k4": fig["generation"]["all"]["greedy_k4"]["alpha"],
              "alpha_t08_k4": fig["generation"]["all"]["t08_k4"]["alpha"],
              "c": fig["generation"]["all"]["loop_costs"]["c"]}
    out = {}
    for key, text, op, threshold in TARGETS:
        v = values[key]
        if key == "bpb_target_below_draft":
            met = v[0] < v[1]
            out[key] = {"text": text, "target": v[0], "draft": v[1], "met": met}
            continue
        met = v is not None and (v >= threshold if op == ">=" else v <= threshold)
        out[key] = {"text": text, "value": v, "op": op, "threshold": threshold, "met": met}
    return out


def git_head() -> str | None:
    """HEAD's short hash, marked when tracked files differ from it (figures measured before a commit)."""
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "--short", "HEAD").stdout.strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} + uncommitted changes" if head and dirty else head or None


# -- main -------------------------------------------------------------------------------------------------
def measure(args) -> dict:
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    models = args.models
    target, draft, prompts_path = models / "target", models / "draft", models / "prompts.jsonl"
    for p in (target / "config.json", draft / "config.json", prompts_path):
        if not p.is_file():
            sys.exit(f"eval_demo_pair: {p} does not exist; package the pair first "
                     f"(python tools/demo_pair/train_demo_pair.py package --out {models})")
    data_json = args.work / "data.json"
    heldout_bin = args.work / "heldout.bin"
    for p in (data_json, heldout_bin):
        if not p.is_file():
            sys.exit(f"eval_demo_pair: {p} does not exist; run `python tools/demo_pair/train_demo_pair.py data` "
                     f"(--work {args.work})")
    bundle_info = ensure_bundle(args.bundle, target, draft, prompts_path, args.draft_dtype)

    import onnxruntime

    from specedge.bench.ours import step_costs
    from specedge.runtime import GenerationConfig, SpeculativeDecoder, __version__

    dec = SpeculativeDecoder.from_bundle(args.bundle, threads=THREADS, config=GenerationConfig(),   # plain T
                                         speculative=True)     # the targets are about the draft, whatever it costs
    data = json.loads(data_json.read_text())
    tokens = np.fromfile(heldout_bin, dtype=np.uint16)
    bpt = data["bytes_heldout"] / data["tokens_heldout"]
    starts = window_starts(len(tokens), args.windows)
    log(f"held-out: {len(starts)} windows of {CONTEXT + 1} tokens, both models")
    heldout = {"windows": len(starts), "context": CONTEXT, "bytes_per_token": bpt, "starts": starts}
    for role, engine in (("target", dec.target), ("draft", dec.draft)):
        heldout[role] = heldout_eval(engine, tokens, starts, bpt)
        log(f"  {role}: " + "  ".join(f"{k} {v:.4f}" for k, v in heldout[role].items()
                                     if k in ("loss", "top1", "bits_per_byte")))

    all_prompts = load_prompts(prompts_path, None)
    prompt_counts = {}
    for p in all_prompts:
        prompt_counts[p.get("kind", "?")] = prompt_counts.get(p.get("kind", "?"), 0) + 1
    prompts = load_prompts(prompts_path, args.prompts)
    log(f"generation: {len(prompts)} prompts x (target-only greedy, K={K} greedy, K={K} T={TEMPERATURE}), "
        f"{args.max_new_tokens} new tokens")
    generation = generation_eval(dec, prompts, max_new_tokens=args.max_new_tokens)
    plen = int(statistics.fmean(r["prompt_tokens"] for r in generation["per_prompt"]))
    past = plen + args.max_new_tokens // 2
    log(f"step costs at {past} cached tokens")
    reps = 200                  # the machine is shared: more repeats than spec-bench's 30 steady c
    costs = step_costs(dec, past=past, ks=[K], reps=reps)
    costs = {**costs, "r": {str(k): v for k, v in costs["r"].items()}, "past": past, "reps": reps}

    fig = {
        "command": f"python {Path(__file__).resolve().relative_to(ROOT)} " + shlex.join(args.argv),
        "settings": {"k": K, "temperature": TEMPERATURE, "max_new_tokens": args.max_new_tokens,
                     "windows": args.windows, "prompts": len(prompts), "threads": THREADS},
        "env": {"specedge": __version__, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
                "python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "date": time.strftime("%Y-%m-%d %H:%M %Z"), "git_head": git_head(),
                "loadavg_1min_start": round(load_start, 2), "loadavg_1min_end": round(os.getloadavg()[0], 2)},
        "bundle": bundle_info,
        "data": {k: data[k] for k in ("files_train", "files_heldout", "bytes_train", "bytes_heldout",
                                      "tokens_train", "tokens_heldout", "stdlib", "heldout_files") if k in data},
        "heldout_overlap": heldout_overlap(data),
        "prompt_counts": prompt_counts,
        "models": {role: model_facts(models / role, args.bundle, role, args.work) for role in ("target", "draft")},
        "heldout": heldout,
        "generation": generation,
        "step_costs": costs,
    }
    fig["targets"] = target_results(fig)
    fig["all_targets_met"] = all(b["met"] for b in fig["targets"].values())
    fig["requirements"] = {
        "target_params_ge_10M": fig["models"]["target"]["parameters"] >= 10_000_000,
        "prompts_function_ge_50": prompt_counts.get("function", 0) >= 50,
        "prompts_edit_ge_20": prompt_counts.get("edit", 0) >= 20,
    }
    fig["seconds_total"] = round(time.perf_counter() - t_start, 1)
    return fig


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=ROOT / "models",
                    help="folder with target/, draft/ and prompts.jsonl (default: models)")
    ap.add_argument("--bundle", type=Path, default=None,
                    help="bundle folder to export into or reuse (default: bundles/demo, or "
                         "bundles/demo-draft-DTYPE with --draft-dtype)")
    ap.add_argument("--draft-dtype", choices=("fp32", "fp16", "int8", "int4"), default=None,
                    help="the draft's weights instead of the demo's (int8)")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "specedge" / "demo",
                    help="train_demo_pair.py's work folder: heldout.bin, data.json (and checkpoints)")
    ap.add_argument("--json", type=Path, default=ROOT / "models" / "eval.json")
    ap.add_argument("--card", type=Path, default=ROOT / "models" / "MODEL_CARD.md")
    ap.add_argument("--windows", type=int, default=64, help="held-out windows of 257 tokens (default 64)")
    ap.add_argument("--prompts", type=int, default=None, help="use N prompts, evenly spaced (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--from-json", type=Path, default=None,
                    help="write only the card, from figures a previous run saved")
    args = ap.parse_args(argv)
    args.argv = argv
    args.bundle = args.bundle or ROOT / "bundles" / (f"demo-draft-{args.draft_dtype}" if args.draft_dtype else "demo")
    if args.from_json:
        fig = json.loads(args.from_json.read_text())
    else:
        if args.windows < 1 or (args.prompts is not None and args.prompts < 1) or args.max_new_tokens < K + 1:
            ap.error("--windows and --prompts must be >= 1 and --max-new-tokens > 4")
        fig = measure(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json, json.dumps(fig, indent=1) + "\n")
        log(f"wrote {args.json}")
    args.card.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.card, card(fig))
    log(f"wrote {args.card}")
    for key, b in fig["targets"].items():
        shown = f"{b['value']:.3f}" if "value" in b else f"{b['target']:.3f} vs {b['draft']:.3f}"
        print(f"{'met' if b['met'] else 'not met'}  {b['text']}: {shown}")
    print(f"total {fig['seconds_total']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
