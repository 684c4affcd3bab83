"""spec-check BUNDLE: an exactness certificate for a bundle, on this machine and its providers.

Speculative decoding promises the target's own output, whatever the draft. These checks test that
promise where the bundle runs: a provider, a dtype or an onnxruntime build can break what CPU fp32
keeps.

    greedy    speculative greedy output == target-only greedy output, token for token, at every k
              checked and with prompt lookup, on the bundle's prompts. A divergence is diagnosed by
              the target's top-2 logit margin there: a near-tie is numerics, a clear winner a bug.
    numerics  the target's (k+1)-token verify call gives the argmax of k+1 one-token calls, and a
              rollback (truncate, run again) gives the first run's: max |logit diff| reported.
              int8/int4 targets quantize activations per call, so their logits depend on the batching
              by more than rounding: there near-ties may flip (greedy), and the verify-vs-step move must
              stay within the graph's own export parity against fp32 PyTorch, with an exact rollback.
    sampling  the first two tokens of speculative sampling follow the law that the target alone
              gives (chi-square; p = target probs computed one token at a time, never by the loop).
    accept    accept() alone on fixed p and q whose output law is enumerated exactly.

Statistical checks share one false-alarm budget (family_alpha, split by Bonferroni). The JSON
certificate records the bundle's file hashes, providers, versions, every figure and the verdict.
spec-check exits 0 when every check passes, 1 when one fails, 2 on bad input.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


from .console import ENGINE_HELP, PROVIDERS_HELP
from .config import ConfigError, SamplingParams
from .errors import SpecedgeError
from .files import write_atomic
from .gof import MIN_EXPECTED, chi2_fit, accept_law
from .manifest import Manifest, read_prompts
from .sampling import accept, probs

TIE_SLACK = 4.0      # a divergence is put down to numerics where the target's top-2 margin is within
TIE_FLOOR = 1e-5     # TIE_SLACK x the verify-vs-step logit difference measured (at least TIE_FLOOR)


@dataclass(frozen=True)
class CheckConfig:
    prompts: int = 4                 # bundle prompts for the greedy check (numerics uses the first)
    new_tokens: int = 48             # greedy tokens per request
    ks: tuple[int, ...] = ()         # () = 1, the default k and the bundle's max draft tokens
    lookup: int = 3                  # prompt-lookup n-gram of the greedy check's lookup mode (0 = none)
    samples: int = 2000              # sampled requests per sampling prompt (0 = no sampling check)
    sampling_prompts: int = 2
    prompt_tokens: int = 48          # sampling prompts keep their last this many tokens: prefill is most of a request
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    heads: int = 16                  # most first tokens whose second token is tested too
    family_alpha: float = 1e-3       # chance that a correct bundle fails the statistical checks
    seed: int = 0

    def __post_init__(self):
        for name in ("prompts", "new_tokens", "sampling_prompts", "prompt_tokens", "heads"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("samples", "lookup", "seed"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise ConfigError(f"{name} must be an integer >= 0 (0 = off), got {getattr(self, name)!r}")
        if 0 < self.samples < 100:
            raise ConfigError(f"samples must be 0 (no sampling check) or >= 100: fewer leave the chi-square "
                              f"one bin and nothing tested, got {self.samples}")
        if self.lookup == 1:
            raise ConfigError("lookup must be 0 (off) or an n-gram length >= 2")
        if any(not (isinstance(k, int) and k >= 1) for k in self.ks):
            raise ConfigError(f"ks must be integers >= 1, got {self.ks!r}")
        if not 0 < self.family_alpha < 1:
            raise ConfigError(f"family_alpha must be in (0, 1), got {self.family_alpha}")
        if not self.temperature > 0:
            raise ConfigError(f"the sampling check needs temperature > 0, got {self.temperature}")
        SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)   # its checks

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


# -- greedy ---------------------------------------------------------------------------------------
def _greedy(dec, ids, new_tokens, **kw):
    """Plain greedy decoding (no penalty, no stop, EOS ignored): the Result."""
    return dec.generate(ids, max_new_tokens=new_tokens, temperature=0.0, top_k=0, top_p=1.0,
                        repetition_penalty=1.0, ignore_eos=True, stop=(), **kw)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (one ending early counts), None if equal."""
    if a == b:
        return None
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def feed(engine, ids: list[int], *, chunk: int = 256) -> np.ndarray:
    """Append `ids` in calls of at most `chunk` tokens (as the decoder prefills: a graph without
    logits_to_keep returns every position's logits); a copy of the last position's logits [vocab]."""
    out = None
    for s in range(0, len(ids), chunk):
        out = engine.run(np.asarray(ids[s:s + chunk]), keep=1)
    return np.array(out[0])


def top2_margin(engine, ids: list[int]) -> float:
    """The target's top-1 minus top-2 logit after `ids`, from one prefill (cache left empty)."""
    engine.truncate(0)
    logits = feed(engine, ids)
    engine.truncate(0)
    top = np.partition(logits, -2)[-2:]
    return float(abs(top[1] - top[0]))


def greedy_modes(dec, ks, lookup: int) -> dict[str, dict]:
    """name -> generate() overrides: fixed k (no early stops, so every k is reached) and lookup."""
    modes = {f"k={k}": dict(k=k, draft_confidence=0.0, ngram=0) for k in ks} if dec.draft is not None else {}
    if lookup:
        modes[f"lookup n={lookup}"] = dict(k=max(ks), ngram=lookup, ngram_min=2)
    return modes


def check_greedy(dec, prompts: list[list[int]], *, modes: dict[str, dict], new_tokens: int,
                 noise: float = 0.0, ties_pass: bool = False) -> dict:
    """`noise`: the target's verify-vs-step max |logit diff| (check_numerics): a divergence where the
    top-2 margin is within TIE_SLACK of it is a near-tie, flipped by how the call was batched.
    `ties_pass`: near-ties do not fail the check (a target whose logits depend on the batching by
    more than rounding: int8/int4 weights, whose activations are quantized per call)."""
    tie = max(TIE_FLOOR, TIE_SLACK * noise)
    mismatches, accepted, evaluated = [], 0, 0
    for i, ids in enumerate(prompts):
        base = _greedy(dec, ids, new_tokens, speculative=False).token_ids
        for name, kw in modes.items():
            res = _greedy(dec, ids, new_tokens, speculative=True, **kw)
            accepted, evaluated = accepted + res.stats.accepted, evaluated + res.stats.evaluated
            got = res.token_ids
            at = first_divergence(base, got)
            if at is not None:
                margin = top2_margin(dec.target, ids + base[:at])
                mismatches.append({"prompt": i, "mode": name, "position": at,
                                   "target_token": base[at] if at < len(base) else None,
                                   "speculative_token": got[at] if at < len(got) else None,
                                   "top2_margin": margin, "near_tie": margin <= tie})
    return {"passed": greedy_passes(mismatches, ties_pass=ties_pass), "ties_pass": ties_pass,
            "prompts": len(prompts), "modes": list(modes), "new_tokens": new_tokens,
            "requests": len(prompts) * len(modes), "mismatches": mismatches,
            "alpha": accepted / evaluated if evaluated else None}


# -- numerics -------------------------------------------------------------------------------------
def engine_numerics(engine, ids: list[int], cont: list[int]) -> dict:
    """A (len(cont)+1)-token call after `ids[:-1]` against one-token calls and against itself after a
    rollback. Copies every result: an in-place engine reuses its logits buffer."""
    block = [ids[-1]] + cont
    engine.truncate(0)
    if len(ids) > 1:
        feed(engine, ids[:-1])
    n = engine.length
    verify = np.array(engine.run(np.asarray(block)), dtype=np.float64)              # [k+1, vocab]
    engine.truncate(n)
    again = np.array(engine.run(np.asarray(block)), dtype=np.float64)               # [k+1, vocab]
    engine.truncate(n)
    steps = np.stack([np.array(engine.run(np.asarray([t]), keep=1)[0], dtype=np.float64)
                      for t in block])                                               # [k+1, vocab]
    engine.truncate(0)
    moved = float(np.abs(verify - steps).max())
    return {"positions": len(block), "verify_vs_steps_max_abs": moved,
            "verify_vs_steps_max_rel": moved / max(float(np.abs(steps).max()), 1e-12),
            "rollback_max_abs": float(np.abs(verify - again).max()),
            "argmax_equal": bool((verify.argmax(1) == steps.argmax(1)).all()
                                 and (again.argmax(1) == verify.argmax(1)).all())}


def check_numerics(dec, ids: list[int], *, k: int, bound: float | None = None) -> dict:
    """The target's argmax must not depend on how a position is batched (greedy identity rests on it);
    the draft's figures are reported only: accept() reads the very q the draft produced. A hidden-state
    head is fed the target's features, not tokens alone: its numerics are the export's parity figures.
    `bound` (quantized targets): the batching may move the logits, relative to their largest, by up to
    this much (the graph's own parity against fp32 PyTorch) if a rollback stays exact."""
    cont = _greedy(dec, ids, k, speculative=False).token_ids
    draft = dec.draft if dec.draft_kind != "eagle" else None
    out = {role: engine_numerics(e, ids, cont) for role, e in (("target", dec.target), ("draft", draft))
           if e is not None}
    return {"passed": numerics_pass(out["target"], bound), "k": k, "bound_rel": bound, **out}


def greedy_passes(mismatches: list[dict], *, ties_pass: bool) -> bool:
    return all(m["near_tie"] for m in mismatches) if ties_pass else not mismatches


def numerics_pass(target: dict, bound: float | None) -> bool:
    """Argmax unmoved by the batching; or, with a bound (quantized weights), an exact rollback and logits
    moved by at most `bound` relative to their largest."""
    return target["argmax_equal"] or (bound is not None and target["rollback_max_abs"] == 0.0
                                      and target["verify_vs_steps_max_rel"] <= bound)


# -- sampling -------------------------------------------------------------------------------------
def _law_row(engine, ids: list[int], params: SamplingParams) -> np.ndarray:
    # a token at a top_k / top_p cut within ~1e-5 of a logit is the one way a correct loop can show an
    # "impossible" outcome: its verify logits differ from these by that much (none at the defaults)
    p = probs(feed(engine, ids)[None], params)[0].astype(np.float64)
    return p / p.sum()                                                               # [vocab]


def two_token_law(engine, ids: list[int], params: SamplingParams, *, heads: int, n: int) -> dict:
    """The exact law of the first two sampled tokens on a partition of outcomes: (a, b) for the
    `heads` likeliest first tokens a that n samples reach often enough to test b, (a, None) for the
    other first tokens. Computed one target call at a time, independent of the loop under test."""
    engine.truncate(0)
    p1 = _law_row(engine, ids, params)                                               # [vocab]
    top = [int(a) for a in np.argsort(p1)[::-1][:heads] if p1[a] * n >= 2 * MIN_EXPECTED]
    law = {(int(a), None): float(p1[a]) for a in np.flatnonzero(p1) if int(a) not in top}
    for a in top:
        engine.truncate(len(ids))
        p2 = _law_row(engine, [a], params)                                           # [vocab]
        law.update({(a, int(b)): float(p1[a] * p2[b]) for b in np.flatnonzero(p2)})
    engine.truncate(0)
    return law


def sample_two_tokens(dec, ids: list[int], *, params: SamplingParams, samples: int, tested: set, seed):
    """`samples` speculative requests of k+1 = 3 tokens (the first round drafts k = 2, so each of the
    first two tokens can be an accepted draft, a recovered token or a bonus): the counts of the
    outcomes of two_token_law's partition, and the first rounds by drafts accepted."""
    k = min(2, dec.max_draft_tokens)
    seen, hist = Counter(), np.zeros(k + 1, dtype=int)
    for s in np.random.default_rng(seed).integers(1 << 62, size=samples).tolist():   # independent across --seed
        res = dec.generate(ids, max_new_tokens=k + 1, k=k, seed=s, speculative=True, draft_confidence=0.0,
                           ngram=0, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                           repetition_penalty=1.0, ignore_eos=True, stop=())
        a, b = res.token_ids[:2]
        seen[(a, b if a in tested else None)] += 1
        if res.stats.drafted:
            hist += res.stats.accepted_hist[:k + 1]
    return seen, hist


def check_sampling(dec, ids: list[int], *, params: SamplingParams, samples: int, heads: int, seed,
                   threshold: float) -> dict:
    law = two_token_law(dec.target, ids, params, heads=heads, n=samples)
    tested = {a for a, b in law if b is not None}
    seen, hist = sample_two_tokens(dec, ids, params=params, samples=samples, tested=tested, seed=seed)
    fit = chi2_fit(law, seen)
    return {"passed": fit.passes(threshold), "samples": samples, "prompt_tokens": len(ids),
            "draft_model": dec.draft is not None, "k": min(2, dec.max_draft_tokens), "first_tokens_tested_to_the_second": len(tested), "chi2": fit.stat,
            "df": fit.df, "p_value": fit.p_value, "threshold": threshold,
            "impossible_outcomes": {str(c): m for c, m in fit.impossible.items()},
            "first_rounds_by_drafts_accepted": hist.tolist()}


# -- accept() alone -------------------------------------------------------------------------------
def accept_cases(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(q [k, V], p [k+1, V]) with V = 5: unrelated peaky rows, and one-hot (lookup) drafts."""
    rows = lambda n: rng.dirichlet(np.full(5, 0.3), n)
    return {"far": (rows(2), rows(3)), "one-hot drafts": (np.eye(5)[[1, 3]], rows(3))}


def check_accept(*, samples: int, seed: int, threshold: float) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (q, p) in accept_cases(rng).items():
        law, seen = accept_law(q, p), Counter()
        for _ in range(samples):
            drafts = [int(rng.choice(q.shape[1], p=row)) for row in q]           # x_i ~ q_i
            tokens, _ = accept(drafts, q, p, rng)
            seen[tuple(tokens)] += 1
        fit = chi2_fit(law, seen)
        out[name] = {"passed": fit.passes(threshold), "samples": samples, "chi2": fit.stat, "df": fit.df,
                     "p_value": fit.p_value, "impossible_outcomes": len(fit.impossible)}
    return {"passed": all(v["passed"] for v in out.values()), "threshold": threshold, "cases": out}


# -- the certificate ------------------------------------------------------------------------------
def bundle_files(folder: Path) -> dict[str, str]:
    """sha256 of every file of the bundle: the certificate names exactly what it tested."""
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out[f.relative_to(folder).as_posix()] = h.hexdigest()
    return out


def check_prompts(dec, texts: list[str], *, n: int, room: int) -> list[list[int]]:
    """The first n prompts as ids, each cut to its last tokens so that `room` more fit the context."""
    out = []
    for text in texts[:n]:
        ids = dec.tokenizer.encode(text).ids[-(dec.max_context - room):]
        if ids:
            out.append(ids)
    return out


def certify(bundle: str | Path, cfg: CheckConfig = CheckConfig(), *, providers: list[str] | None = None,
            threads: int = 0, prompts: list[str] | None = None, log=print, engine: str = "onnxruntime") -> dict:
    """Run every check on `bundle` and return the certificate (a JSON-ready dict; "passed" is the verdict)."""
    from specedge import runtime
    from specedge.engines.ort import import_onnxruntime

    from .decoder import SpeculativeDecoder
    bundle = Path(bundle)
    m = Manifest.load(bundle)
    t0 = time.perf_counter()
    dec = SpeculativeDecoder.from_bundle(bundle, providers=providers, threads=threads, speculative=True, engine=engine)
    ks = sorted(set(cfg.ks or (1, dec.default_k, dec.max_draft_tokens)))
    if ks[-1] > dec.max_draft_tokens:
        raise ConfigError(f"k={ks[-1]} exceeds the bundle's max draft tokens ({dec.max_draft_tokens}); "
                          f"check k <= {dec.max_draft_tokens} or re-export with --max-draft-tokens {ks[-1]}")
    room = cfg.new_tokens + ks[-1] + 2
    if room >= dec.max_context:
        raise ConfigError(f"--new-tokens {cfg.new_tokens} plus a {ks[-1] + 1}-token verify leave no room for a "
                          f"prompt in the bundle's max context ({dec.max_context}); use fewer new tokens")
    if prompts is None:
        prompts = read_prompts(bundle / m.prompts) if m.prompts else []
    if not prompts:
        raise ConfigError(f"bundle {bundle} ships no prompts: give some with --prompts FILE "
                          f"(JSONL, one {{\"prompt\": ...}} a line)")
    greedy_ids = check_prompts(dec, prompts, n=cfg.prompts, room=room)
    if not greedy_ids:
        raise ConfigError("the prompts encode to no tokens; give non-empty prompts")
    alpha_each = cfg.family_alpha / (cfg.sampling_prompts * (cfg.samples > 0) + 2)
    checks = {}
    modes = greedy_modes(dec, ks, cfg.lookup)
    if not modes:
        raise ConfigError(f"bundle {bundle} has no draft model and --lookup is 0: there is no speculative path "
                          f"to check; give --lookup 3 to check prompt lookup")
    target = m.models["target"]
    # int8/int4 graphs quantize activations per call: how positions are batched moves their logits by more
    # than rounding, so near-ties may flip; bounded by what the export accepted against fp32 PyTorch
    bound = max((c["max_rel_diff"] for c in target.parity.values()), default=None) if target.quantized else None
    log(f"numerics: a {ks[-1] + 1}-token call against one-token calls and a rollback")
    checks["numerics"] = check_numerics(dec, greedy_ids[0], k=ks[-1], bound=bound)
    log(f"greedy: {len(greedy_ids)} prompts x {len(modes)} modes ({', '.join(modes)}), {cfg.new_tokens} tokens")
    checks["greedy"] = check_greedy(dec, greedy_ids, modes=modes, new_tokens=cfg.new_tokens,
                                    noise=checks["numerics"]["target"]["verify_vs_steps_max_abs"],
                                    ties_pass=target.quantized)
    if cfg.samples:
        sampled = [ids[-cfg.prompt_tokens:] for ids in
                   check_prompts(dec, prompts, n=cfg.sampling_prompts, room=4)]
        log(f"sampling: {len(sampled)} prompts x {cfg.samples} requests at temperature {cfg.temperature}")
        runs = [check_sampling(dec, ids, params=cfg.sampling, samples=cfg.samples, heads=cfg.heads,
                               seed=[cfg.seed, i], threshold=alpha_each) for i, ids in enumerate(sampled)]
        checks["sampling"] = {"passed": all(r["passed"] for r in runs), "prompts": runs}
    log("accept: accept() alone against its enumerated law")
    checks["accept"] = check_accept(samples=20_000, seed=cfg.seed, threshold=alpha_each)
    ort = import_onnxruntime()
    return {"certificate": "specedge exactness", "format": 1, "passed": all(c["passed"] for c in checks.values()),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.perf_counter() - t0, 2),
            "bundle": {"path": str(bundle.resolve()), "format_version": m.format_version,
                       "has_draft": dec.draft is not None, "max_draft_tokens": dec.max_draft_tokens,
                       "dtypes": {role: info.dtype for role, info in m.models.items()}, "files": bundle_files(bundle)},
            "environment": {"providers": dec.target.providers, "specedge": runtime.__version__,
                            "onnxruntime": ort.__version__, "numpy": np.__version__,
                            "python": platform.python_version(), "machine": platform.machine(),
                            "platform": platform.platform(), "threads": threads},
            "config": asdict(cfg), "checks": checks}


def summary(cert: dict) -> str:
    c, mark = cert["checks"], lambda ok: "PASS" if ok else "FAIL"
    g = c["greedy"]
    lines = [f"greedy    {mark(g['passed'])}  {g['requests']} speculative requests ({', '.join(g['modes'])}; "
             f"{g['prompts']} prompts x {g['new_tokens']} tokens): "
             + (f"{len(g['mismatches'])} diverged" if g["mismatches"] else "identical to target-only decoding")
             + (", each at a near-tie (int8/int4 weights: allowed)" if g["mismatches"] and g["passed"] else "")]
    for mm in g["mismatches"][:5]:
        why = ("no near-tie: a bug, please report it with this certificate" if not mm["near_tie"] else
               "a near-tie flipped by the batch-dependent numerics of quantized activations" if g.get("ties_pass")
               else "a near-tie flipped by the numerics of batched calls: a float32 export keeps greedy token-exact")
        lines.append(f"          prompt {mm['prompt']} {mm['mode']}: token {mm['position']} is "
                     f"{mm['speculative_token']} not {mm['target_token']}; top-2 margin {mm['top2_margin']:.2g} ({why})")
    n = c["numerics"]
    lines.append(f"numerics  {mark(n['passed'])}  {n['k'] + 1}-token call vs one-token calls, max |logit diff|: "
                 + ", ".join(f"{role} {n[role]['verify_vs_steps_max_abs']:.2g} (rollback "
                             f"{n[role]['rollback_max_abs']:.2g})" for role in ("target", "draft") if role in n)
                 + ("; argmax equal" if n["target"]["argmax_equal"] else
                    f"; the target's argmax changed, within the bound for its quantized weights (relative "
                    f"{n['target']['verify_vs_steps_max_rel']:.2g} <= {n['bound_rel']:.2g})" if n["passed"]
                    else "; the target's argmax CHANGED"))
    if "sampling" in c:
        runs = c["sampling"]["prompts"]
        who = "" if runs[0]["draft_model"] else " (no draft model: the target's own sampling through the loop)"
        lines.append(f"sampling  {mark(c['sampling']['passed'])}  {len(runs)} prompts x {runs[0]['samples']} requests{who}, "
                     f"first two tokens vs the target's law: chi-square p = "
                     + ", ".join(f"{r['p_value']:.3g}" for r in runs) + f" (fails below {runs[0]['threshold']:.2g})"
                     + "".join(f"; {len(r['impossible_outcomes'])} impossible outcomes seen" for r in runs
                               if r["impossible_outcomes"]))
    a = c["accept"]
    lines.append(f"accept    {mark(a['passed'])}  accept() alone, p = "
                 + ", ".join(f"{v['p_value']:.3g} ({name})" for name, v in a["cases"].items()))
    lines.append(f"verdict   {mark(cert['passed'])}  ({cert['seconds']:.0f} s; {', '.join(cert['environment']['providers'])})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from specedge.runtime.console import guarded
    return guarded(_main, argv, prog="spec-check")


def _main(argv: list[str] | None = None) -> int:
    d = CheckConfig()
    ap = argparse.ArgumentParser(prog="spec-check", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", help="bundle folder written by spec-export")
    ap.add_argument("--json", type=Path, help="write the certificate here (JSON)")
    ap.add_argument("--prompts", "--prompts-file", dest="prompts_file", type=Path,
                    help="JSONL prompts (default: the bundle's own)")
    ap.add_argument("--n-prompts", type=int, default=d.prompts, dest="n_prompts",
                    help=f"prompts for the greedy check (default {d.prompts})")
    ap.add_argument("--new-tokens", type=int, default=d.new_tokens, help=f"greedy tokens per request (default {d.new_tokens})")
    ap.add_argument("--k", default="", help="comma list of k to check (default: 1, the default k, the bundle's max)")
    ap.add_argument("--lookup", type=int, default=d.lookup, help=f"n-gram of the prompt-lookup mode (0 = none; default {d.lookup})")
    ap.add_argument("--samples", type=int, default=d.samples,
                    help=f"sampled requests per sampling prompt (0 = skip the sampling check; default {d.samples})")
    ap.add_argument("--sampling-prompts", type=int, default=d.sampling_prompts, help=f"default {d.sampling_prompts}")
    ap.add_argument("--temperature", type=float, default=d.temperature, help=f"of the sampling check (default {d.temperature})")
    ap.add_argument("--top-k", type=int, default=d.top_k, help="of the sampling check (0 = off)")
    ap.add_argument("--top-p", type=float, default=d.top_p, help="of the sampling check (1 = off)")
    ap.add_argument("--family-alpha", type=float, default=d.family_alpha,
                    help=f"chance that a correct bundle fails the statistical checks (default {d.family_alpha:g})")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--providers", default="cpu", help=PROVIDERS_HELP)
    ap.add_argument("--engine", default="onnxruntime", choices=["onnxruntime", "tensorrt"], help=ENGINE_HELP)
    ap.add_argument("--threads", type=int, default=0, help="the target's intra-op threads (0 = all cores)")
    args = ap.parse_args(argv)
    try:
        try:
            ks = tuple(int(k) for k in args.k.split(",") if k.strip())
        except ValueError:
            raise ConfigError(f"--k takes a comma list of integers such as 1,4, not {args.k!r}") from None
        cfg = CheckConfig(prompts=args.n_prompts, new_tokens=args.new_tokens, ks=ks, lookup=args.lookup,
                          samples=args.samples, sampling_prompts=args.sampling_prompts, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, family_alpha=args.family_alpha, seed=args.seed)
        prompts = read_prompts(args.prompts_file) if args.prompts_file else None
        if args.json and not args.json.parent.is_dir():
            raise ConfigError(f"--json: folder {args.json.parent} does not exist; create it first")
        cert = certify(args.bundle, cfg, providers=args.providers.split(","), threads=args.threads,
                       prompts=prompts, log=lambda msg: print(f"spec-check: {msg}", file=sys.stderr),
                       engine=args.engine)
    except (SpecedgeError, ImportError, OSError) as e:
        print(f"spec-check: error: {e}", file=sys.stderr)
        return 2
    print(summary(cert))
    if args.json:
        write_atomic(args.json, json.dumps(cert, indent=2) + "\n")
        print(f"certificate written to {args.json}")
    return 0 if cert["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
