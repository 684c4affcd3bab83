"""Our side of spec-bench: target-only vs speculative tokens/s per K, alpha, c, r(K) and the bound.

Hygiene: a warm-up per variant, then repeats in which every prompt runs target-only and each K
back to back (A B A B: the machine's drift hits all variants alike); medians over repeats, with
min and max as the noise. Times are end to end per request (prefill included), as the peers'.
With --peers, ours runs a second time, target-only and at the best K, interleaved with the peers
(bench/interleave.py): the cross-system ratios come from that, never from this sweep.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from specedge.runtime.costs import leviathan_bound
from specedge.runtime.proposers.hidden_head import FEATURES_IN


def _timed_run(engine, ids_list, features=None) -> float:
    """Mean seconds per call over consecutive calls, as the loop makes them (a draft runs k times in
    a row, so its weights stay in cache); the cache is rolled back afterwards. `features(n)`: the
    hidden states a hidden-state head reads beside n tokens."""
    n = engine.length
    t0 = time.perf_counter()
    for ids in ids_list:
        engine.run(ids, inputs=features and {FEATURES_IN: features(len(ids))})
    dt = (time.perf_counter() - t0) / len(ids_list)
    engine.truncate(n)
    return dt


def call_seconds(engine, past_ids: np.ndarray, n: int, calls: int, rng: np.random.Generator) -> list[float]:
    """Seconds of each of `calls` n-token calls (random ids) on top of `past_ids`, the cache rolled back
    after each: what one step (n = 1) or one verify costs at that past (tools/lab's profilers)."""
    engine.truncate(0)
    engine.run(past_ids, keep=1)
    walls = []
    for _ in range(calls):
        ids = rng.integers(0, engine.vocab_size, size=n)
        t0 = time.perf_counter()
        engine.run(ids, keep=n)
        walls.append(time.perf_counter() - t0)
        engine.truncate(len(past_ids))
    return walls


def step_costs(dec, *, past: int, ks, reps: int = 30, run: int = 4) -> dict:
    """c and r(k) for k in ks, measured on the decoder's engines at `past` cached tokens: runs of
    `run` consecutive calls, the runs of each kind interleaved, medians. Leaves both caches holding
    `past` random tokens (a request starts by resetting them)."""
    rng = np.random.default_rng(0)
    ctx = rng.integers(0, dec.vocab_size, size=past)
    features = None
    if dec.draft_kind == "eagle":     # a head reads the target's hidden states: random ones of its width
        width = dec.target.hidden_size
        features = lambda n: rng.standard_normal((1, n, width)).astype(np.float32)
    for e, f in ((dec.target, None), (dec.draft, features)):
        e.truncate(0)
        e.run(ctx, inputs=f and {FEATURES_IN: f(len(ctx))})
    tokens = lambda n: [rng.integers(0, dec.vocab_size, size=n) for _ in range(run)]
    times = {"draft": [], "target": [], **{k: [] for k in ks}}
    for _ in range(reps):
        times["draft"].append(_timed_run(dec.draft, tokens(1), features))
        times["target"].append(_timed_run(dec.target, tokens(1)))
        for k in ks:
            times[k].append(_timed_run(dec.target, [rng.integers(0, dec.vocab_size, size=k + 1)]))
    med = {name: statistics.median(v) for name, v in times.items()}
    return {"c": med["draft"] / med["target"], "r": {k: med[k] / med["target"] for k in ks},
            "target_step_ms": 1e3 * med["target"], "draft_step_ms": 1e3 * med["draft"]}


def measure(dec, prompts: list[str], *, ks, sampling: dict, max_new_tokens: int, repeats: int) -> dict:
    """Run every prompt target-only, with each fixed K (every round drafts K: the bound's premise),
    and with the loop's defaults (up to the decoder's k drafts, fewer after an unconfident one),
    `repeats` times; return per-variant figures. Fixed K means the draft model alone (no prompt
    lookup); the defaults keep the decoder's config, prompt lookup (`ngram`) included."""
    fixed = {"draft_confidence": 0.0, "ngram": 0}
    variants = ([("plain", None, {"speculative": False, **fixed})] + [(f"k{k}", k, fixed) for k in ks]
                + [("default", dec.default_k, {})])          # name, k, overrides of the decoder's config
    gen = lambda prompt, k, over, seed: dec.generate(prompt, max_new_tokens=max_new_tokens, seed=seed, k=k or 1,
                                                     ignore_eos=True, prefix_cache=False, **sampling, **over)
    for _, k, over in variants:
        gen(prompts[0], k, over, 0)
    per_rep = {name: [] for name, _, _ in variants}
    agg = {name: {"drafted": 0, "accepted": 0, "evaluated": 0, "target_calls": 0, "draft_calls": 0, "tokens": 0,
                  "lookup_rounds": 0, "seconds_draft": 0.0, "seconds_target": 0.0, "seconds_host": 0.0, "seconds": 0.0}
           for name, _, _ in variants}
    for rep in range(repeats):
        tokens = {name: 0 for name in per_rep}
        seconds = {name: 0.0 for name in per_rep}
        for i, prompt in enumerate(prompts):
            order = variants if (rep + i) % 2 == 0 else variants[::-1]
            for name, k, over in order:
                t0 = time.perf_counter()
                res = gen(prompt, k, over, 1000 * rep + i)
                dt = time.perf_counter() - t0
                s, a = res.stats, agg[name]
                tokens[name] += s.new_tokens
                seconds[name] += dt
                for key in ("drafted", "accepted", "evaluated", "target_calls", "draft_calls", "lookup_rounds",
                            "seconds_draft", "seconds_target", "seconds_host"):
                    a[key] += getattr(s, key)
                a["tokens"] += s.new_tokens
                a["seconds"] += dt
        for name in per_rep:
            per_rep[name].append(tokens[name] / seconds[name])
    out = {}
    for name, k, over in variants:
        conf = over.get("draft_confidence", dec.config.draft_confidence)
        a, tps = agg[name], per_rep[name]
        out[name] = {"k": k, "draft_confidence": conf, "ngram": over.get("ngram", dec.config.ngram),
                     "tps": statistics.median(tps), "tps_min": min(tps), "tps_max": max(tps),
                     "drafts_per_round": a["drafted"] / a["target_calls"],
                     "alpha": a["accepted"] / a["evaluated"] if a["evaluated"] else None,
                     "acceptance_rate": a["accepted"] / a["drafted"] if a["drafted"] else None,
                     "tokens_per_target_call": a["tokens"] / a["target_calls"],
                     "lookup_round_fraction": a["lookup_rounds"] / a["target_calls"],
                     # host = decode-phase time outside the engines (prefill excluded): the loop's own cost
                     "host_fraction": a["seconds_host"] / max(1e-12, a["seconds_host"] + a["seconds_draft"]
                                                              + a["seconds_target"]),
                     "host_ms_per_round": 1e3 * a["seconds_host"] / a["target_calls"],
                     # engine calls as the loop sees them (caches cold after the other model ran, rollbacks)
                     "target_ms_per_call": 1e3 * a["seconds_target"] / a["target_calls"],
                     "draft_ms_per_call": 1e3 * a["seconds_draft"] / a["draft_calls"] if a["draft_calls"] else None}
    return out


def summarize(variants: dict, costs: dict) -> dict:
    """The summary keys for one mode: plain/spec tokens/s at the best K, speedup, alpha, bound, efficiency."""
    plain = variants["plain"]["tps"]
    per_k = {}
    step = variants["plain"]["target_ms_per_call"]
    for name, v in variants.items():
        if v["k"] is None or name == "default":
            continue
        k, alpha = v["k"], v["alpha"] or 0.0
        bound = leviathan_bound(alpha, k, costs["r"][k], costs["c"])
        speedup = v["tps"] / plain
        # the same bound from the costs measured inside the loop: what separates the two is the engines'
        # in-loop slowdown; what separates this one from the measured speedup is the host code
        c_loop, r_loop = v["draft_ms_per_call"] / step, v["target_ms_per_call"] / step
        per_k[k] = {**v, "speedup": speedup, "bound": bound, "efficiency": speedup / bound, "r": costs["r"][k],
                    "c_loop": c_loop, "r_loop": r_loop, "bound_loop": leviathan_bound(alpha, k, r_loop, c_loop)}
    best = max(per_k, key=lambda k: per_k[k]["tps"])
    b, d = per_k[best], variants["default"]
    # the loop's defaults: rounds of varying length, so no Leviathan bound; what users get untuned
    default = {**d, "speedup": d["tps"] / plain, "c_loop": d["draft_ms_per_call"] / step,
               "r_loop": d["target_ms_per_call"] / step}
    return {"plain_tps": plain, "spec_tps": b["tps"], "best_k": best, "speedup": b["speedup"], "alpha": b["alpha"],
            "bound": b["bound"], "efficiency": b["efficiency"], "c": costs["c"],
            "c_loop": b["c_loop"], "r_loop": b["r_loop"], "bound_loop": b["bound_loop"],
            "host_ms_per_round": b["host_ms_per_round"], "per_k": per_k, "default": default,
            "default_tps": default["tps"], "default_speedup": default["speedup"],
            "plain_tps_min": variants["plain"]["tps_min"], "plain_tps_max": variants["plain"]["tps_max"]}
