"""What a round costs on this machine, and whether speculation can pay for it at all.

c = draft 1-token step / target 1-token step; r(k) = target (k+1)-token call / 1-token call. With
per-token acceptance alpha, a round of k drafts yields E = (1 - alpha^(k+1)) / (1 - alpha) tokens for
r(k) + k c target steps (Leviathan et al. 2023). Where a target step is as cheap as the engine's fixed
per-call cost (the demo target with int8 weights on a CPU, docs/benchmarks.md), no draft makes up for
it, and decoding target-only is faster.
"""
from __future__ import annotations

import statistics


GUARD_KS = (1, 2, 4)        # the k whose verify cost the guard measures (bounded by the bundle's max)
# the guard keeps the draft when its bound reaches this: the loop's defaults get about the bound, not more
GUARD_MIN_BOUND = 1.0


def leviathan_bound(alpha: float, k: int, r: float, c: float) -> float:
    """Expected speedup of speculative over target-only decoding (Leviathan et al. 2023):
    tokens per round E = (1 - alpha^(k+1)) / (1 - alpha) over a round's cost r + k c target steps."""
    tokens = k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (r + k * c)


def best_bound(costs: dict, alpha: float) -> tuple[int, float]:
    """(k, bound) of the k in costs["r"] with the highest Leviathan bound at this alpha."""
    return max(((k, leviathan_bound(alpha, k, r, costs["c"])) for k, r in costs["r"].items()),
               key=lambda kb: kb[1])


def loop_costs(dec, prompt: list[int], *, ks, new_tokens: int = 32) -> dict:
    """c and r(k) from the loop itself: per-call engine times of short greedy requests, target-only and
    with k drafts a round, alternating (a target-only request before each k, their median the baseline;
    one more first, untimed, to warm up). A microbenchmark of the same calls misses what the loop does
    between them, and reads c and r lower."""
    new_tokens = max(2, min(new_tokens, (dec.max_context - len(prompt)) // 2))
    run = lambda **kw: dec.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0,
                                    stop=(), ngram=0, **kw).stats
    run(speculative=False)
    steps, verify, draft, accepted, evaluated = [], {}, [], 0, 0
    for k in ks:
        plain = run(speculative=False)
        steps.append(plain.seconds_target / plain.target_calls)
        s = run(speculative=True, k=k, draft_confidence=0.0)
        verify[k] = s.seconds_target / s.target_calls
        draft.append(s.seconds_draft / max(1, s.draft_calls))
        accepted, evaluated = accepted + s.accepted, evaluated + s.evaluated
    step = max(statistics.median(steps), 1e-9)
    return {"c": statistics.median(draft) / step, "r": {k: v / step for k, v in verify.items()},
            "alpha": accepted / max(1, evaluated), "target_step_ms": 1e3 * step,
            "draft_step_ms": 1e3 * statistics.median(draft)}


def speculation_pays(dec, prompt: list[int], *, max_k: int) -> tuple[bool, str, int]:
    """Time the loop on `prompt` (short greedy requests at k = 1, 2, 4 and max_k) and say whether the
    draft, at the acceptance it showed there, lets speculation reach GUARD_MIN_BOUND x target-only
    decoding at its best k; the reason in words, and that k (the default where a request names none)."""
    ks = sorted({k for k in GUARD_KS if k <= max_k} | {max_k})
    costs = loop_costs(dec, prompt, ks=ks)
    k, bound = best_bound(costs, costs["alpha"])
    why = (f"a draft step costs {costs['c']:.2f} target steps, a {k + 1}-token verify {costs['r'][k]:.2f}, and "
           f"alpha was {costs['alpha']:.2f}: the best k ({k}) would run at {bound:.2f}x target-only decoding")
    return bound >= GUARD_MIN_BOUND, why, k


def per_call_costs(plain, spec) -> dict:
    """c and r from engine time per call as the loop made the calls: the target's 1-token step from
    target-only decoding (`plain`), the draft's step and the verify from speculative decoding (`spec`).
    Each is a Stats or a mapping of its fields seconds_target, target_calls, seconds_draft, draft_calls,
    one request's or sums over several (pooled: a ratio of sums, not a mean of ratios)."""
    from collections.abc import Mapping
    get = lambda s, name: s[name] if isinstance(s, Mapping) else getattr(s, name)
    step = max(get(plain, "seconds_target") / max(1, get(plain, "target_calls")), 1e-12)
    draft = get(spec, "seconds_draft") / max(1, get(spec, "draft_calls"))
    verify = get(spec, "seconds_target") / max(1, get(spec, "target_calls"))
    return {"target_step_ms": 1e3 * step, "draft_step_ms": 1e3 * draft, "verify_ms": 1e3 * verify,
            "c": draft / step, "r": verify / step}


def guard_key(bundle, *, threads: int, draft_threads: int, providers) -> str:
    """What the guard's verdict depends on: the bundle (its manifest and its files' sizes and times), the
    machine (CPU model, cores, onnxruntime) and the thread settings. Cheap: no file is read whole."""
    import hashlib
    import json
    import os
    import platform
    from pathlib import Path

    from specedge.engines.ort import import_onnxruntime
    bundle = Path(bundle)
    h = hashlib.sha256((bundle / "manifest.json").read_bytes())
    for f in sorted(p for p in bundle.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(bundle)}:{st.st_size}:{st.st_mtime_ns}".encode())
    cpu = ""
    try:
        cpu = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), "")
    except OSError:
        pass
    h.update(json.dumps([cpu, platform.machine(), os.cpu_count(), import_onnxruntime().__version__, threads,
                         draft_threads, list(providers or [])]).encode())
    return h.hexdigest()[:32]


def cached_verdict(key: str, measure) -> tuple[bool, str, int, bool]:
    """The guard's (pays, why, k) for `key` from the cache, else measure() and remember it; the last
    element says whether it came from the cache. A cache that cannot be written is skipped."""
    import json
    import os
    from pathlib import Path

    from .files import write_atomic
    path = Path(os.environ.get("SPECEDGE_CACHE", Path.home() / ".cache" / "specedge")) / "guard" / f"{key}.json"
    try:
        got = json.loads(path.read_text())
        return bool(got["pays"]), str(got["why"]), int(got["k"]), True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    pays, why, k = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"pays": pays, "why": why, "k": k}))
    except OSError:
        pass
    return pays, why, k, False
