"""spec-bench BUNDLE: speculative vs target-only tokens/s, alpha, c, r(K), the Leviathan bound and
efficiency, for greedy and T = 0.8 -- and, with --peers, onnxruntime-genai, HF transformers and llama.cpp
(when its binaries are built: tools/lab/build_llama_cpp.py) on the same pair, prompts and token budget,
interleaved with ours prompt by prompt (bench/interleave.py): every repeat, every prompt runs on every
system, target-only and speculative at the best K, in an order that rotates; reported are each one's
median tokens/s over repeats and the per-repeat ratios ours/peer with their median, min and max. The
Python peers run in worker processes that load once (this process never imports torch or
onnxruntime-genai); llama.cpp runs its binaries per request, timed by its own clocks.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from specedge.runtime.costs import speculation_pays
from specedge.runtime.files import write_atomic
from specedge.runtime.manifest import read_prompts

from . import interleave, memory, ours

MODES = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.8}}
# each peer's JSON keys for its target-only and speculative tokens/s (HF's speculative mode: assisted generation)
PEER_KEYS = {"ortgenai": ("ortgenai_plain", "ortgenai_spec"), "hf": ("hf_plain", "hf_assisted"),
             "llamacpp": ("llamacpp_plain", "llamacpp_spec")}
LLAMA_PRECISIONS = ("auto", "f32", "f16", "q8_0", "q4_0", "as-is")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="spec-bench", description=__doc__)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--prompts", type=Path, help="JSONL with a 'prompt' per line (default: the bundle's)")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8", help="comma list of K to sweep")
    ap.add_argument("--repeats", type=int, default=3,
                    help="repeats of every prompt (ours' K sweep, then the interleaved peers' comparison); "
                         "figures are medians over repeats")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads for every system's target (default 1)")
    ap.add_argument("--draft-threads", type=int, default=1,
                    help="the draft's intra-op threads, ours and onnxruntime-genai's (default 1)")
    ap.add_argument("--ngram", type=int, default=0,
                    help="prompt lookup in the defaults row (spec-run --ngram); fixed-K rows never use it")
    ap.add_argument("--quick", action="store_true", help="3 prompts, K in {2,4,6}, 48 tokens, 2 repeats")
    ap.add_argument("--peers", action="store_true",
                    help="also run onnxruntime-genai, HF transformers and llama.cpp (if built), interleaved with "
                         "ours prompt by prompt in a rotating order, target-only and speculative at the best K; "
                         "reports ours/peer per repeat (median, min-max)")
    ap.add_argument("--target-hf", type=Path, help="target HF folder for the peers (default: manifest source)")
    ap.add_argument("--draft-hf", type=Path, help="draft HF folder for the peers (default: manifest source)")
    ap.add_argument("--llama-precision", choices=LLAMA_PRECISIONS, default="auto",
                    help="llama.cpp's target GGUF weights (auto: as the bundle's target: fp32 -> f32, int8 -> q8_0, "
                         "int4 -> q4_0; as-is: a .gguf source as shipped)")
    ap.add_argument("--llama-draft-precision", choices=LLAMA_PRECISIONS, default="auto",
                    help="llama.cpp's draft GGUF weights (auto: as the bundle's draft)")
    ap.add_argument("--llama-target", type=Path,
                    help="llama.cpp's target: a .gguf or HF folder (default: manifest source)")
    ap.add_argument("--llama-draft", type=Path,
                    help="llama.cpp's draft: a .gguf or HF folder (default: manifest source)")
    ap.add_argument("--json", type=Path, default=Path("bench.json"))
    ap.add_argument("--plot", type=Path, default=None, help="PNG path (default: next to --json)")
    return ap


def llama_precision(choice: str, bundle_weights: str) -> str:
    """The GGUF type at the bundle's weight precision (auto), or the one asked for."""
    if choice != "auto":
        return choice
    from .llamacpp import BUNDLE_TO_GGUF
    return BUNDLE_TO_GGUF.get(bundle_weights, "f32")


def start_peer(system: str, *, target: Path, draft: Path, prompts: list[str], draft_precision: str,
               args) -> interleave.PeerProcess:
    """onnxruntime-genai or HF in its worker process (bench/peers.py), which starts loading now; a peer that
    cannot run yields null figures and its error."""
    cmd = [sys.executable, "-m", "specedge.bench.peers", "--system", system, "--target", str(target),
           "--draft", str(draft), "--warmup-prompt", prompts[0], "--max-new-tokens", str(args.max_new_tokens),
           "--threads", str(args.threads), "--draft-threads", str(args.draft_threads),
           "--draft-precision", draft_precision, "--cache", str(Path.home() / ".cache" / "specedge" / "peers")]
    return interleave.PeerProcess(system, cmd, prompts, max_new_tokens=args.max_new_tokens)


def compare_peers(dec, prompts: list[str], *, manifest, result: dict, args) -> tuple[dict, dict]:
    """Ours and the peers interleaved per prompt, at each mode's best K: (result["peers"], its errors)."""
    from .llamacpp import find_bin_dir, not_built_message
    errors: dict = {}
    bin_dir = find_bin_dir()
    if bin_dir is None:
        print(f"[peer] llamacpp skipped: {not_built_message()}", file=sys.stderr, flush=True)
        errors["llamacpp"] = not_built_message()
    tinfo, dinfo = manifest.models["target"], manifest.models["draft"]
    head = dinfo.kind == "eagle"     # a hidden-state head: no peer's speculative mode can run it
    if head:
        errors["draft"] = ("the draft is a hidden-state head, which the peers' speculative modes cannot run: "
                           "llama.cpp runs target-only; onnxruntime-genai and HF run only with --draft-hf (a draft "
                           "model of their own)")
    systems: list = [interleave.Ours(dec, prompts, max_new_tokens=args.max_new_tokens)]
    if not head or args.draft_hf:
        target, draft = args.target_hf or Path(tinfo.source), args.draft_hf or Path(dinfo.source)
        systems += [start_peer(system, target=target, draft=draft, prompts=prompts, draft_precision=dinfo.weights,
                               args=args) for system in ("ortgenai", "hf")]
    if bin_dir is not None:
        systems.append(interleave.LlamaCpp(
            bin_dir, prompts, target=args.llama_target or Path(tinfo.source),
            draft=args.llama_draft or (Path(dinfo.source) if dinfo.source and not head else None),
            precision=llama_precision(args.llama_precision, tinfo.weights),
            draft_precision=llama_precision(args.llama_draft_precision, dinfo.weights),
            max_new_tokens=args.max_new_tokens, threads=args.threads, draft_threads=args.draft_threads))
    modes = {mode: {"temperature": MODES[mode]["temperature"], "k": result[mode]["best_k"]} for mode in MODES}
    results, infos = interleave.run(systems, len(prompts), modes=modes, repeats=args.repeats)
    peers, run_errors = interleave.report(results, infos, PEER_KEYS, k_by_mode={m: v["k"] for m, v in modes.items()})
    errors.update(run_errors)
    # flat keys for the common case: greedy figures at the top of "peers"
    peers.update({k: v for k, v in peers["greedy"].items() if not k.endswith("_detail")})
    return peers, errors


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, mode in zip(axes, MODES):
        r = result[mode]
        ks = sorted(int(k) for k in r["per_k"])
        ax.plot(ks, [r["per_k"][k]["tps"] for k in ks], "o-", label="specedge speculative")
        ax.plot(ks, [r["per_k"][k]["bound"] * r["plain_tps"] for k in ks], "--", label="Leviathan bound")
        ax.axhline(r["plain_tps"], color="gray", label="specedge target-only")
        ax.plot([r["default"]["k"]], [r["default_tps"]], "*", markersize=12, color="C1",
                label=f"specedge defaults (K <= {r['default']['k']}, adaptive)")
        peers = result.get("peers", {}).get(mode, {})
        colors = {"ortgenai": "C3", "hf": "C2", "llamacpp": "C4"}
        for key, style in (("ortgenai_plain", ":"), ("ortgenai_spec", "-."), ("hf_plain", ":"), ("hf_assisted", "-."),
                           ("llamacpp_plain", ":"), ("llamacpp_spec", "-.")):
            if peers.get(key):
                ax.axhline(peers[key], linestyle=style, color=colors[key.split("_")[0]], label=key)
        ax.set_title(f"{mode}: tokens/s vs K")
        ax.set_xlabel("K (draft tokens per round)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("tokens/s (batch 1)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomic(path, buf.getvalue())


def _md(columns: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def _peer_process(system: str, detail: dict) -> str:
    """What a peer's process held when its memory was read."""
    if system == "hf":
        return "fp32 torch" if detail.get("spec_tps") else "fp32 torch; its draft did not run"
    return {"draft_model": "plain and speculative models: the target twice",
            "ngram": "plain model only: n-gram mode, no draft"}.get(detail.get("ortgenai_spec_mode"),
                                                                     "its speculative mode did not run")


def table(result: dict) -> str:
    ours = [result[mode] for mode in MODES]
    rows = _md(["mode", "target-only tok/s", "spec tok/s", "best K", "speedup", "alpha", "c", "bound", "efficiency"],
               [[m, f"{r['plain_tps']:.1f}", f"{r['spec_tps']:.1f}", f"{r['best_k']}", f"{r['speedup']:.2f}x",
                 f"{r['alpha']:.3f}", f"{r['c']:.3f}", f"{r['bound']:.2f}x", f"{r['efficiency']:.2f}"]
                for m, r in zip(MODES, ours)])
    rows += [""] + _md(["mode (best K)", "host ms/round", "c in the loop", "r(K) in the loop",
                        "bound from in-loop costs"],
                       [[m, f"{r['host_ms_per_round']:.3f}", f"{r['c_loop']:.3f}", f"{r['r_loop']:.2f}",
                         f"{r['bound_loop']:.2f}x"] for m, r in zip(MODES, ours)])
    rows += [""] + _md(["mode", "loop defaults: spec tok/s", "speedup", "K at most", "draft confidence", "drafts/round",
                        "alpha", "prompt lookup (rounds)"],
                       [[m, f"{d['tps']:.1f}", f"{d['speedup']:.2f}x", f"{d['k']}", f"{d['draft_confidence']}",
                         f"{d['drafts_per_round']:.2f}", f"{d['alpha']:.3f}",
                         f"ngram {d['ngram']} ({d['lookup_round_fraction']:.0%})" if d.get("ngram") else "off"]
                        for m, d in zip(MODES, (r["default"] for r in ours))])
    mem, fmt = result.get("memory"), lambda v: "n/a" if v is None else f"{v:.1f}"
    if mem and "error" not in mem:
        mem_rows = [["specedge", fmt(mem["target_only_held_mb"]), fmt(mem["speculative_held_mb"]),
                     fmt(max((v for v in (mem["target_only_peak_mb"], mem["speculative_peak_mb"]) if v is not None),
                             default=None))]]
        for system in PEER_KEYS:
            detail = result.get("peers", {}).get("greedy", {}).get(f"{system}_detail") or {}
            m = detail.get("memory")
            if m:
                mem_rows.append([f"{system} ({_peer_process(system, detail)})", fmt(m["target_only_held_mb"]), fmt(m["held_mb"]),
                                 fmt(m["peak_mb"])])
        rows += [""] + _md(["host memory, MiB above the import floor", "target only, held",
                            "target + draft, held", "peak"], mem_rows)
    if result.get("peers"):
        rows += [""] + peers_table(result["peers"])
    return "\n".join(rows)


def _ratio(r: dict | None) -> str:
    return "n/a" if not r else f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def peers_table(peers: dict) -> list[str]:
    """One row per mode and system, all from the interleaved requests: tokens/s (median over repeats) and
    ours/that system (the median of the per-repeat ratios, min-max)."""
    fmt = lambda v: "n/a" if v is None else f"{v:.1f}"
    rows = []
    for mode in MODES:
        p = peers.get(mode) or {}
        k = (p.get("ours_detail") or {}).get("k")
        label = mode if k is None else f"{mode}, K = {k}"
        rows.append([label, "specedge (ours)", fmt(p.get("ours_plain")), "", fmt(p.get("ours_spec")), ""])
        for system, (plain_key, spec_key) in PEER_KEYS.items():
            if f"{system}_detail" in p:
                r = (p.get("ratios") or {}).get(system) or {}
                rows.append([label, system, fmt(p.get(plain_key)), _ratio(r.get("plain")), fmt(p.get(spec_key)),
                             _ratio(r.get("spec"))])
    if not rows:
        return []
    return _md(["mode (best K)", "system, interleaved", "target-only tok/s", "ours / it (min-max)", "spec tok/s",
                "ours / it (min-max)"], rows)


def main(argv: list[str] | None = None) -> int:
    from specedge.runtime.console import guarded
    return guarded(_main, argv, prog="spec-bench")


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.n_prompts, args.ks, args.max_new_tokens, args.repeats = 3, "2,4,6", 48, 2
    from specedge.runtime import BundleError, ConfigError, GenerationConfig, Manifest, SpeculativeDecoder
    from specedge.runtime.errors import SpecedgeError
    try:
        if args.n_prompts < 1 or args.repeats < 1 or args.max_new_tokens < 1:
            raise ConfigError("--n-prompts, --repeats and --max-new-tokens must be >= 1")
        manifest = Manifest.load(args.bundle)
        if not manifest.has_draft:
            raise BundleError(f"{args.bundle} has no draft model; export a pair with spec-export")
        prompts_path = args.prompts or (args.bundle / manifest.prompts if manifest.prompts else None)
        if prompts_path is None or not prompts_path.is_file():
            raise BundleError("no prompts: pass --prompts FILE (JSONL with a 'prompt' key per line)")
        ks = sorted({int(k) for k in args.ks.split(",")})
        if not ks or min(ks) < 1 or max(ks) > manifest.max_draft_tokens:
            raise BundleError(f"--ks must lie in 1..{manifest.max_draft_tokens} (the bundle's max draft tokens)")
        prompts = read_prompts(prompts_path)[:args.n_prompts]
        # GenerationConfig(): the modes are plain temperatures, as the peers run them, whatever the
        # model's generation_config.json says
        dec = SpeculativeDecoder.from_bundle(args.bundle, threads=args.threads, draft_threads=args.draft_threads,
                                             speculative=True,
                                             config=GenerationConfig(ngram=args.ngram))
        for p in prompts:
            dec.encode(p)          # refuse an empty or over-long prompt before measuring anything
    except (SpecedgeError, OSError) as e:
        print(f"spec-bench: error: {e}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    plen = int(sum(len(dec.tokenizer.encode(p).ids) for p in prompts) / len(prompts))
    costs = ours.step_costs(dec, past=plen + args.max_new_tokens // 2, ks=ks)
    result = {"bundle": str(args.bundle), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "draft_threads": args.draft_threads, "repeats": args.repeats,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "step_costs": costs}
    # what from_bundle's default (speculative="auto") would decide on this machine; this run keeps the draft
    keeps, why, _ = speculation_pays(dec, dec.encode(prompts[0]), max_k=dec.default_k)
    result["guard"] = {"keeps_draft": keeps, "why": why}
    print("[ours] memory: target-only and speculative, each in a fresh process", file=sys.stderr, flush=True)
    try:
        result["memory"] = memory.measure(args.bundle, prompt=prompts[0], max_new_tokens=args.max_new_tokens,
                                          threads=args.threads, draft_threads=args.draft_threads)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, OSError) as e:   # the speed figures still count
        result["memory"] = {"error": str(e)[:300]}
        print(f"spec-bench: memory probe failed: {e}", file=sys.stderr)
    for mode, sampling in MODES.items():
        print(f"[ours] {mode}: target-only and K in {ks} over {len(prompts)} prompts x {args.repeats}",
              file=sys.stderr, flush=True)
        variants = ours.measure(dec, prompts, ks=ks, sampling=sampling, max_new_tokens=args.max_new_tokens,
                                repeats=args.repeats)
        result[mode] = ours.summarize(variants, costs)
    if args.peers:
        result["peers"], result["peers_error"] = compare_peers(dec, prompts, manifest=manifest, result=result,
                                                               args=args)
    result["seconds"] = time.perf_counter() - t_start
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.json, json.dumps(result, indent=1, default=str))
    png = args.plot or args.json.with_suffix(".png")
    try:
        plot(result, png)
    except ImportError:
        png = None
        print("spec-bench: matplotlib missing (pip install 'specedge[bench]'): no plot", file=sys.stderr)
    print(table(result))
    for name, error in (result.get("peers_error") or {}).items():     # why a peer's column reads n/a
        print(f"peer {name}: {error}")
    print(f"\nfrom_bundle's speculation guard would {'keep' if keeps else 'drop'} the draft here: {why}")
    print(f"\nwrote {args.json}" + (f" and {png}" if png else "") + f" in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
