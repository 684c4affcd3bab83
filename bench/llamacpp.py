"""llama.cpp as a spec-bench peer: target-only and draft-model speculative decoding on a GGUF of the same
model, prompts and token budget, through llama.cpp's own binaries (built once by
`python tools/lab/build_llama_cpp.py` into ~/.cache/specedge/llama.cpp/<version>/bin).

    python -m specedge.bench.llamacpp --target T.gguf|HF_DIR [--draft D.gguf|HF_DIR] --prompts P.jsonl
        [--n-prompts N] --max-new-tokens N [--mode greedy|sampled] [--temperature 0.8] [--k K]
        [--threads T] [--draft-threads T] [--precision f32|f16|q8_0|q4_0|as-is[,...]]
        [--draft-precision ...] [--repeats R] [--decode-bench] [--ours BUNDLE [--ours-spec]] --json OUT.json

spec-bench --peers runs one request at a time through request_plain / request_spec, interleaved with ours
and the other peers (bench/interleave.py); the command above measures llama.cpp alone, or against ours
target-only with --ours (and ours speculative, at the k from_bundle's start-up check chose, with --ours-spec).

Figures (all at batch 1, on `--threads` threads for the target):
- plain_tps / spec_tps: end to end per request as spec-bench measures ours -- new tokens of all prompts
  over their seconds, prefill included -- by llama.cpp's own timers (llama-completion's "total time":
  prompt eval + eval + sampling; llama-speculative-simple's encode + decode times); process start, model
  load and warm-up are not counted, as ours excludes from_bundle. Median over repeats, with min, max and
  every repeat. Requests of a repeat run A B A B (plain, speculative, and ours target-only when --ours is
  given, timed around its generate()), so drift on a shared machine hits every variant alike.
- decode_tps (--decode-bench): llama-bench -p 0 -n 128: the pure decode rate at an empty context; the
  median of --bench-repeats runs of -r 1 (each precision's in turn, when --precision lists several).
- spec_stats: llama-speculative-simple's n_drafted / n_accept summed over requests; acceptance_rate =
  accepted / drafted (drafts are K tokens every round: --spec-draft-p-min 0, its default).

A Hugging Face folder is converted with llama.cpp's convert_hf_to_gguf.py (F32) and quantized with
llama-quantize --pure (so the embeddings and the head are quantized too) into
~/.cache/specedge/llama.cpp/gguf/, keyed by the folder's content; a .gguf is used as given
(--precision as-is) or requantized (--allow-requantize). Whatever fails, OUT.json is written with the
failing figures null and a one-line "error", and the exit status is 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from .gguf_files import convert_hf, default_pre, prepare_gguf, quantize  # noqa: F401  (re-exported)
from .llamacpp_tools import (BINARIES, BUILD_HINT, BUNDLE_TO_GGUF, PRECISIONS, PeerError, build_info, cache_root, check, find_bin_dir, generated_text, log, not_built_message, one_line, parse_bench_json, parse_completion, parse_speculative, parse_tokenize)  # noqa: F401  (re-exported: bench.cli, tests)

def sampling_args(mode: str, temperature: float, seed: int) -> list[str]:
    """Plain temperature sampling, as spec-bench's modes: llama.cpp's default top-k 40 / top-p 0.95 /
    min-p 0.05 are turned off."""
    if mode == "greedy":
        return ["--temp", "0", "--seed", str(seed)]
    return ["--temp", str(temperature), "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", str(seed)]


def completion_argv(bin_dir: Path, gguf: Path, prompt: str, *, n: int, threads: int, mode: str = "greedy",
                    temperature: float = 0.8, seed: int = 1, ctx: int | None = None) -> list:
    return [bin_dir / "llama-completion", "-m", gguf, "-p", prompt, "-n", str(n), "--ignore-eos",
            "-no-cnv", "--no-escape", "--no-display-prompt", "-t", str(threads), "-tb", str(threads),
            *(["-c", str(ctx)] if ctx else []), *sampling_args(mode, temperature, seed)]


def speculative_argv(bin_dir: Path, target: Path, draft: Path, prompt: str, *, n: int, k: int, threads: int,
                     draft_threads: int, mode: str = "greedy", temperature: float = 0.8, seed: int = 1,
                     ctx: int | None = None) -> list:
    extra = ["--spec-draft-sampling", "probabilistic"] if mode == "sampled" else []
    return [bin_dir / "llama-speculative-simple", "-m", target, "--spec-type", "draft-simple",
            "--spec-draft-model", draft, "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", "0", *extra, "-p", prompt, "-n", str(n), "--ignore-eos", "--no-escape",
            "-t", str(threads), "-tb", str(threads), "-td", str(draft_threads), "-tbd", str(draft_threads),
            *(["-c", str(ctx)] if ctx else []), *sampling_args(mode, temperature, seed)]


def bench_argv(bin_dir: Path, gguf: Path, *, n: int, threads: int, repeats: int = 3) -> list:
    return [bin_dir / "llama-bench", "-m", gguf, "-p", "0", "-n", str(n), "-t", str(threads),
            "-r", str(repeats), "-o", "json"]


def tokenize(bin_dir: Path, gguf: Path, text: str) -> list[int]:
    out, _ = check([bin_dir / "llama-tokenize", "-m", gguf, "-p", text, "--ids", "--no-escape", "--log-disable"],
                   "llama-tokenize", timeout=120)
    return parse_tokenize(out)


def same_prefix(a: list[str], b: list[str], slack: int = 24) -> bool:
    """Each pair agrees up to the shorter text, less `slack` characters: llama.cpp writes its text from a
    log thread that the process's exit can cut off, and a run cut at -n may end mid-token."""
    def one(x: str, y: str) -> bool:
        n = max(0, min(len(x), len(y)) - slack)
        return x[:n] == y[:n]
    return all(one(x, y) for x, y in zip(a, b))


def _summary(res: dict, name: str, runs: list[float]) -> None:
    res.update({f"{name}_tps": statistics.median(runs), f"{name}_tps_min": min(runs),
                f"{name}_tps_max": max(runs), f"{name}_tps_runs": runs})


def parse_precisions(text: str) -> list[str]:
    out = [p.strip().lower() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in PRECISIONS]
    if not out or bad or len(set(out)) != len(out):
        raise PeerError(f"--precision {text!r}: give distinct values among {', '.join(PRECISIONS)}")
    return out


def run_parsed(argv: list, what: str, parse, *, lost: dict | None = None) -> tuple[str, dict]:
    """Run and parse; a run that exits 0 without its timings lost its last log lines (llama.cpp logs from a
    thread that the process's exit can cut off: rare) and is run again, at most twice; `lost` counts those
    reruns under "log_lost_reruns"."""
    for attempt in range(3):
        out, err = check(argv, what)
        try:
            return out, parse(err)
        except PeerError:
            if attempt == 2:
                raise
            if lost is not None:
                lost["log_lost_reruns"] = lost.get("log_lost_reruns", 0) + 1
    raise AssertionError("unreachable")


def request_plain(bin_dir: Path, gguf: Path, prompt: str, *, n: int, threads: int, mode: str, temperature: float,
                  seed: int, ctx: int | None = None, lost: dict | None = None) -> dict:
    """One llama-completion request: new_tokens, seconds (its own clocks), text, and the phases apart."""
    out, r = run_parsed(completion_argv(bin_dir, gguf, prompt, n=n, threads=threads, mode=mode,
                                        temperature=temperature, seed=seed, ctx=ctx),
                        "llama-completion", parse_completion, lost=lost)
    perf = r["perf"]
    r.update(text=out, decode=(perf["eval_runs"], perf["eval_ms"] / 1e3),
             prefill=(perf["prompt_eval_tokens"], perf["prompt_eval_ms"] / 1e3))
    return r


def request_spec(bin_dir: Path, target: Path, draft: Path, *, prompt: str, n: int, k: int, threads: int,
                 draft_threads: int, mode: str, temperature: float, seed: int, ctx: int | None = None,
                 lost: dict | None = None) -> dict:
    """One llama-speculative-simple request: new_tokens, seconds (encode + decode), text, n_drafted, n_accept."""
    out, r = run_parsed(speculative_argv(bin_dir, target, draft, prompt, n=n, k=k, threads=threads,
                                         draft_threads=draft_threads, mode=mode, temperature=temperature,
                                         seed=seed, ctx=ctx),
                        "llama-speculative-simple", parse_speculative, lost=lost)
    r["text"] = generated_text(out, prompt)
    return r


def measure(args, bin_dir: Path, targets: dict[str, Path], draft: Path | None, prompts: list[str], res: dict,
            ours=None) -> None:
    """A B A B over prompts and repeats: llama.cpp plain (the first target; then one variant "plain@P" for
    each further precision P), llama.cpp speculative, ours target-only."""
    variants: list[tuple[str, object]] = []
    target = next(iter(targets.values()))
    res["log_lost_reruns"] = 0
    common = dict(threads=args.threads, mode=args.mode, temperature=args.temperature, ctx=args.ctx, lost=res)

    def plain_of(gguf: Path):
        return lambda i, seed: request_plain(bin_dir, gguf, prompts[i], n=args.max_new_tokens, seed=seed, **common)

    def spec(i, seed):
        return request_spec(bin_dir, target, draft, prompt=prompts[i], n=args.max_new_tokens, k=args.k,
                            draft_threads=args.draft_threads, seed=seed, **common)

    def ours_of(speculative: bool):
        def run_ours(i, seed):
            t0 = time.perf_counter()
            g = ours.generate(prompts[i], max_new_tokens=args.max_new_tokens, seed=seed, ignore_eos=True,
                              prefix_cache=False, speculative=speculative,
                              temperature=0.0 if args.mode == "greedy" else args.temperature)
            dt = time.perf_counter() - t0
            st = g.stats
            r = {"new_tokens": st.new_tokens, "seconds": dt, "text": g.text, "prompt_tokens": st.prompt_tokens}
            if not speculative:
                r.update(decode=(st.new_tokens, st.seconds_total), prefill=(st.prompt_tokens, st.seconds_prefill))
            return r
        return run_ours

    names = {}
    for j, (prec, gguf) in enumerate(targets.items()):
        names[prec] = "plain" if j == 0 else f"plain@{prec}"
        variants.append((names[prec], plain_of(gguf)))
    if draft is not None:
        variants.append(("spec", spec))
    if ours is not None:
        variants.append(("ours_plain", ours_of(False)))
        if ours.draft is not None:           # --ours-spec, and the start-up check kept the draft: its best k
            variants.append(("ours_spec", ours_of(True)))
    for name, fn in list(variants):          # warm-ups; a speculative mode that cannot run leaves the rest
        try:
            fn(0, 0)
        except PeerError as e:
            if name != "spec":
                raise
            res["error"] = f"speculative: {one_line(e)}"
            variants.remove((name, fn))
    tps: dict[str, list[float]] = {name: [] for name, _ in variants}
    counts: list[int] = []
    first: dict[str, list] = {name: [] for name, _ in variants}
    stats = {"generations": 0, "n_drafted": 0, "n_accept": 0, "new_tokens": 0, "k": args.k}
    prompt_tokens = []
    log(f"{args.mode}: {len(prompts)} prompts x {args.repeats} repeats: {', '.join(n for n, _ in variants)}"
        f"{f', K={args.k}' if draft is not None else ''}")
    phases: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        acc = {name: [0, 0.0] for name, _ in variants}
        phase_acc: dict[str, list] = {}
        for i in range(len(prompts)):
            seed = 1000 * rep + i + 1
            order = variants if (rep + i) % 2 == 0 else variants[::-1]
            for name, fn in order:
                r = fn(i, seed)
                acc[name][0] += r["new_tokens"]
                acc[name][1] += r["seconds"]
                for phase in ("decode", "prefill"):
                    if phase in r:
                        a = phase_acc.setdefault(f"{name}_{phase}_phase_tps", [0, 0.0])
                        a[0] += r[phase][0]
                        a[1] += r[phase][1]
                if name in ("plain", "spec"):
                    counts.append(r["new_tokens"])
                if rep == 0:
                    first[name].append(r["text"])
                    if name == "plain":
                        prompt_tokens.append(r["prompt_tokens"])
                if name == "spec":
                    stats["generations"] += 1
                    stats["n_drafted"] += r["n_drafted"] or 0
                    stats["n_accept"] += r["n_accept"] or 0
                    stats["new_tokens"] += r["new_tokens"]
        for name, (n, secs) in acc.items():
            tps[name].append(n / secs)
        for key, (n, secs) in phase_acc.items():
            phases.setdefault(key, []).append(n / secs)
    for name, runs in tps.items():
        _summary(res, name, runs)
    # the phases apart (target-only runs): prefill = the prompt's pass(es), decode = one token a call after it
    # (llama.cpp: eval time / eval runs; ours: the decode phase's seconds / new tokens, host code included)
    res["phases"] = {key: statistics.median(v) for key, v in phases.items()}
    if len(targets) > 1:
        for prec, name in names.items():
            v = tps[name]
            res["by_precision"].setdefault(prec, {}).update({
                "plain_tps": statistics.median(v), "plain_tps_min": min(v), "plain_tps_max": max(v),
                "plain_tps_runs": v, "decode_phase_tps": res["phases"].get(f"{name}_decode_phase_tps"),
                "prefill_phase_tps": res["phases"].get(f"{name}_prefill_phase_tps")})
    res["prompt_tokens"] = prompt_tokens
    res["new_tokens"], res["new_tokens_max"] = min(counts), max(counts)
    if "spec" in tps:
        stats["acceptance_rate"] = stats["n_accept"] / stats["n_drafted"] if stats["n_drafted"] else None
        # tokens per target verify call: each round emits its accepted drafts + 1
        rounds = (stats["new_tokens"] - stats["n_accept"]) or 1
        stats["tokens_per_target_call"] = stats["new_tokens"] / rounds
        res["spec_stats"] = stats
        if args.mode == "greedy":
            # llama-speculative-simple may decode up to K tokens past -n: the shorter text must be a
            # prefix of the longer (text, not ids: a token cut at the end may decode differently)
            res["greedy_identical"] = same_prefix(first["plain"], first["spec"])
    if "ours_plain" in tps:
        if args.mode == "greedy":
            res["greedy_identical_to_ours"] = same_prefix(first["plain"], first["ours_plain"])
        res["ratio_llamacpp_over_ours"] = res["plain_tps"] / res["ours_plain_tps"]
        res["ratio_runs"] = [a / b for a, b in zip(tps["plain"], tps["ours_plain"])]
    if "ours_spec" in tps:       # ours at its best against llama.cpp target-only, repeat by repeat
        if args.mode == "greedy":
            res["ours_spec_greedy_identical_to_ours"] = first["ours_spec"] == first["ours_plain"]
        res["ours_k"] = ours.default_k
        runs = [a / b for a, b in zip(tps["ours_spec"], tps["plain"])]
        res["ratio_ours_spec_over_llamacpp_runs"] = runs
        res["ratio_ours_spec_over_llamacpp"] = statistics.median(runs)


def run(args, res: dict) -> None:
    bin_dir = find_bin_dir(args.bin_dir)
    if bin_dir is None:
        raise PeerError(not_built_message())
    info = build_info(bin_dir)
    res["versions"] = {"llama.cpp": info.get("version"), "llama_cpp_bin_dir": str(bin_dir)}
    from specedge.runtime.manifest import read_prompts
    prompts = read_prompts(args.prompts)[:args.n_prompts or None]
    res["n_prompts"] = len(prompts)
    t0 = time.perf_counter()
    precisions = parse_precisions(args.precision)
    targets = {p: prepare_gguf(args.target, p, bin_dir=bin_dir) for p in precisions}
    target = targets[precisions[0]]
    res["target_gguf"] = str(target)
    res["by_precision"] = {p: {"gguf": str(g), "gguf_bytes": g.stat().st_size} for p, g in targets.items()} \
        if len(targets) > 1 else {}
    draft = None
    if args.draft is not None:
        try:
            draft = prepare_gguf(args.draft, args.draft_precision, bin_dir=bin_dir)
            res["draft_gguf"] = str(draft)
        except PeerError as e:
            res["error"] = f"draft: {one_line(e)}"
            log(res["error"])
    res["setup_s"] = time.perf_counter() - t0
    ours = None
    if args.ours:
        from specedge.runtime import SpeculativeDecoder
        try:
            ours = SpeculativeDecoder.from_bundle(args.ours, threads=args.threads,
                                                  speculative="auto" if args.ours_spec else False)
        except Exception as e:  # noqa: BLE001 -- BundleError, OSError, onnxruntime's: one line in the JSON
            raise PeerError(f"--ours {args.ours}: {one_line(e)}") from e
        res["ours_bundle"] = str(args.ours)
        res["ours_draft_note"] = ours.draft_note
    if args.check_tokenizer and ours is not None:
        mismatch = sum(tokenize(bin_dir, target, p) != list(ours.tokenizer.encode(p).ids) for p in prompts)
        res["tokenization_mismatches"] = mismatch
    if args.decode_bench:
        # llama-bench -r 1 per precision in turn, bench_repeats rounds: drift hits every precision alike
        samples: dict[str, list[float]] = {p: [] for p in targets}
        for _ in range(args.bench_repeats):
            for p, g in targets.items():
                out, _ = check(bench_argv(bin_dir, g, n=args.bench_tokens, threads=args.threads, repeats=1),
                               "llama-bench")
                b = parse_bench_json(out)
                samples[p].append(b["decode_tps"])
                if p == precisions[0]:
                    res["decode_bench"] = b
        res["decode_bench"].update(decode_tps_samples=samples[precisions[0]], runs=args.bench_repeats)
        res["decode_tps"] = statistics.median(samples[precisions[0]])
        for p, v in samples.items():
            if len(targets) > 1:
                res["by_precision"][p].update(decode_tps=statistics.median(v), decode_tps_samples=v)
    if args.repeats > 0:
        measure(args, bin_dir, targets, draft, prompts, res, ours=ours)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specedge.bench.llamacpp", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="the target: a .gguf or a Hugging Face folder")
    ap.add_argument("--draft", type=Path, help="the draft: a .gguf or a Hugging Face folder (same vocabulary)")
    ap.add_argument("--prompts", type=Path, required=True, help="JSONL with a 'prompt' per line")
    ap.add_argument("--n-prompts", type=int, default=None, help="use the first N prompts (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--mode", choices=("greedy", "sampled"), default="greedy")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampled mode only")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (fixed)")
    ap.add_argument("--threads", type=int, default=1, help="the target's threads (llama.cpp -t and -tb)")
    ap.add_argument("--draft-threads", type=int, default=1)
    ap.add_argument("--precision", default="f32",
                    help=f"the target GGUF's weights, one of {', '.join(PRECISIONS)} (as-is: a .gguf as given; a "
                         "folder converts to F32); a comma list measures each, interleaved (the first is the "
                         "one the speculative mode and --ours compare with)")
    ap.add_argument("--draft-precision", choices=PRECISIONS, default="f32")
    ap.add_argument("--ctx", type=int, default=None, help="llama.cpp -c (default: the model's)")
    ap.add_argument("--repeats", type=int, default=3, help="0: no request runs (with --decode-bench: that alone)")
    ap.add_argument("--decode-bench", action="store_true", help="also llama-bench's pure decode rate")
    ap.add_argument("--bench-tokens", type=int, default=128)
    ap.add_argument("--bench-repeats", type=int, default=3)
    ap.add_argument("--ours", type=Path, help="a bundle whose target-only decoding runs interleaved")
    ap.add_argument("--ours-spec", action="store_true",
                    help="with --ours: its speculative decoding too (its draft, the default k), interleaved")
    ap.add_argument("--check-tokenizer", action="store_true",
                    help="with --ours: count prompts whose llama-tokenize ids differ from the bundle's")
    ap.add_argument("--bin-dir", type=Path, help="llama.cpp's binaries (default: the cached build)")
    ap.add_argument("--json", type=Path, required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    res: dict = {"system": "llamacpp", "mode": args.mode, "k": args.k, "threads": args.threads,
                 "draft_threads": args.draft_threads, "precision": args.precision,
                 "draft_precision": args.draft_precision,
                 "temperature": args.temperature if args.mode == "sampled" else 0.0,
                 "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "n_prompts": None,
                 "rate": "end to end per request, prefill included, by llama.cpp's own timers (llama-completion: "
                         "its total time, prompt eval + eval + sampling; llama-speculative-simple: encode + decode); "
                         "model load excluded; decode_tps: llama-bench -p 0 -n N (decode only, empty context), "
                         "median of runs",
                 "plain_tps": None, "spec_tps": None, "plain_tps_min": None, "plain_tps_max": None,
                 "spec_tps_min": None, "spec_tps_max": None, "decode_tps": None, "new_tokens": None,
                 "spec_stats": {}, "error": None}
    try:
        if min(args.k, args.max_new_tokens, args.threads, args.draft_threads) < 1 or args.repeats < 0:
            raise ValueError("--k, --max-new-tokens, --threads and --draft-threads must be >= 1, --repeats >= 0")
        run(args, res)
    except (PeerError, OSError, ValueError, subprocess.SubprocessError) as e:
        msg = str(e) if isinstance(e, PeerError) else one_line(e)
        res["error"] = f"{res['error']}; {msg}" if res["error"] else msg
    except Exception as e:  # noqa: BLE001 -- the benchmark must get its JSON whatever breaks
        traceback.print_exc()
        res["error"] = f"unexpected {one_line(e)}"
    if res["error"]:
        log(res["error"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_name(f".{args.json.name}.tmp")
    tmp.write_text(json.dumps(res, indent=1, default=str))
    os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
