"""spec-bench --peers: ours and every peer decode the same prompts, interleaved prompt by prompt.

For each mode, repeat and prompt, every system decodes that one prompt target-only and in its speculative
mode before the next prompt starts. The systems' order rotates by one place from one prompt to the next and
from one repeat to the next, so no system is always first, and each system's two variants alternate which
goes first: a drift of the shared machine hits every system alike instead of landing in a ratio.

Figures: a repeat's tokens/s = its new tokens over all prompts / their seconds (prefill included). Each system
and variant reports the median over repeats with min, max and every repeat; each peer gets the per-repeat
ratios ours/peer (target-only against target-only, speculative against speculative: repeat r against repeat
r, the same stretch of machine time) with their median, min and max.

Where each system runs, and whose clock times it:
- ours: in this process (numpy + onnxruntime, never torch), timed around generate(); speculative = the
  draft model alone proposing the sweep's best K every round, as the peers' speculative modes do.
- onnxruntime-genai, HF transformers: each in its own worker process (bench/peers.py) that loads its models
  once and answers one JSON request a line; timed in the worker around its generate call.
- llama.cpp: its binaries, one run per request (bench/llamacpp.py), timed by llama.cpp's own clocks, which
  exclude process start and model load.
Before each mode's timed requests every system runs each variant once, untimed, on the first prompt.
A peer that fails (will not load, errs, dies, hangs) loses its figures, null, with a one-line error; the
schedule goes on without it.
"""
from __future__ import annotations

import json
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .llamacpp_tools import PeerError, one_line, tail

VARIANTS = ("plain", "spec")
# what a peer's failure can raise; it costs that peer its figures, never the run
FAILURES = (PeerError, OSError, ValueError, subprocess.SubprocessError)


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def schedule(systems: dict[str, tuple[str, ...]], n_prompts: int, repeats: int) -> list[tuple[int, int, str, str]]:
    """(repeat, prompt, system, variant) in run order: every system and variant once per prompt and repeat;
    the systems rotate by one place per prompt and per repeat, each system's variants swap order likewise."""
    names = list(systems)
    out = []
    for rep in range(repeats):
        for i in range(n_prompts):
            shift = (rep + i) % max(1, len(names))
            for name in names[shift:] + names[:shift]:
                variants = systems[name] if (rep + i) % 2 == 0 else systems[name][::-1]
                out += [(rep, i, name, v) for v in variants]
    return out


def spread(values: list[float] | None) -> dict | None:
    """median, min, max and the values themselves; None when there are none."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def ratios(ours: list[float] | None, peer: list[float] | None) -> dict | None:
    """The per-repeat ratios ours/peer and their spread; None unless both have every repeat."""
    if not ours or not peer or len(ours) != len(peer):
        return None
    return spread([a / b for a, b in zip(ours, peer)])


def same_output(a: dict, b: dict) -> bool:
    """Two runs' outputs agree: token ids where both have them, else text up to the shorter, less its tail
    (llama.cpp's text may lose its end to its log thread, and a run cut at n tokens may end mid-character)."""
    from .llamacpp import same_prefix
    if isinstance(a["output"], list) and isinstance(b["output"], list):
        return a["output"] == b["output"]
    text = lambda r: r["output"] if isinstance(r["output"], str) else r.get("text", "")
    return same_prefix([text(a)], [text(b)])


# ---------------------------------------------------------------------------------------------------------
# the systems: name, variants, start(), run(variant, i, mode=, temperature=, k=, seed=), summary(stats),
# info(), close()

class Ours:
    """specedge in this process, on the decoder spec-bench loaded."""
    name = "ours"
    variants = VARIANTS

    def __init__(self, dec, prompts: list[str], *, max_new_tokens: int) -> None:
        self.dec, self.prompts, self.max_new_tokens = dec, prompts, max_new_tokens

    def start(self) -> None:
        pass

    def run(self, variant: str, i: int, *, mode: str, temperature: float, k: int, seed: int) -> dict:
        over = {"speculative": False} if variant == "plain" else {}
        t0 = time.perf_counter()
        res = self.dec.generate(self.prompts[i], max_new_tokens=self.max_new_tokens, seed=seed, k=k,
                                temperature=temperature, ignore_eos=True, prefix_cache=False, draft_confidence=0.0,
                                ngram=0, **over)
        dt = time.perf_counter() - t0
        s = res.stats
        return {"new_tokens": s.new_tokens, "seconds": dt, "output": list(res.token_ids), "text": res.text,
                "prompt_tokens": s.prompt_tokens,
                "stats": {"drafted": s.drafted, "accepted": s.accepted, "evaluated": s.evaluated,
                          "target_calls": s.target_calls}}

    def summary(self, stats: list[dict]) -> dict:
        tot = {key: sum(s[key] for s in stats) for key in ("drafted", "accepted", "evaluated", "target_calls")}
        tot["generations"] = len(stats)
        tot["alpha"] = tot["accepted"] / tot["evaluated"] if tot["evaluated"] else None
        return tot

    def info(self) -> dict:
        return {"where": "this process"}

    def close(self) -> None:
        pass


class Worker:
    """A worker process speaking bench/peers.py's protocol: a JSON request a line on its stdin, one answer a
    line on its stdout. Its stderr goes to a file (a pipe nobody reads could fill and stall it), whose
    last lines say why when it dies."""

    def __init__(self, name: str, cmd: list[str]) -> None:
        self.name = name
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        # a reader thread: the only portable way to wait for a line with a timeout
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)          # end of its stdout: it exited

    def _died(self) -> PeerError:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.err.seek(0)
        why = tail(self.err.read().decode("utf-8", "replace"), 2) or "no message"
        return PeerError(f"{self.name} exited {rc}: {why}")

    def receive(self, timeout: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            raise PeerError(f"{self.name} gave no answer in {timeout:.0f} s and was killed") from None
        if line is None:
            raise self._died()
        try:
            return json.loads(line)
        except ValueError:
            raise PeerError(f"{self.name} wrote a line that is not JSON: {line[:200]!r}") from None

    def request(self, req: dict, timeout: float) -> dict:
        if self.proc.poll() is not None:
            raise self._died()
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except OSError:                # BrokenPipeError: it died since the last answer
            raise self._died() from None
        ans = self.receive(timeout)
        if ans.get("error"):
            raise PeerError(ans["error"])
        return ans

    def close(self) -> None:
        try:
            self.proc.stdin.close()    # end of its stdin ends the worker
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.err.close()


class PeerProcess:
    """onnxruntime-genai or HF transformers in a worker process (bench/peers.py), kept loaded throughout."""

    def __init__(self, name: str, cmd: list[str], prompts: list[str], *, max_new_tokens: int,
                 start_timeout: float = 1800, request_timeout: float = 600) -> None:
        self.name, self.prompts, self.max_new_tokens = name, prompts, max_new_tokens
        self.start_timeout, self.request_timeout = start_timeout, request_timeout
        self.variants: tuple[str, ...] = VARIANTS
        self.hello: dict = {}
        self.worker = Worker(name, cmd)       # it starts loading now, beside the others

    def start(self) -> None:
        self.hello = self.worker.receive(self.start_timeout)
        if not self.hello.get("ready"):
            raise PeerError(self.hello.get("error") or f"{self.name} did not get ready")
        if self.hello.get("spec_error"):
            self.variants = ("plain",)

    def run(self, variant: str, i: int, *, mode: str, temperature: float, k: int, seed: int) -> dict:
        ans = self.worker.request({"op": "generate", "variant": variant, "prompt": self.prompts[i], "mode": mode,
                                   "temperature": temperature, "k": k, "seed": seed,
                                   "max_new_tokens": self.max_new_tokens}, self.request_timeout)
        ans["output"] = ans.pop("tokens", None)
        return ans

    def summary(self, stats: list[dict]) -> dict:
        if self.name == "ortgenai":
            from .peers import sum_stats       # plain arithmetic: peers.py imports its libraries lazily
            return sum_stats(stats)
        # HF reports no acceptance counters: forward calls (the prefill's included) are what it can show
        tot = {"target_forward_calls": sum(s.get("target", 0) for s in stats),
               "draft_forward_calls": sum(s.get("draft", 0) for s in stats),
               "new_tokens": sum(s["new_tokens"] for s in stats), "generations": len(stats)}
        tot["tokens_per_target_call"] = tot["new_tokens"] / max(1, tot["target_forward_calls"])
        return tot

    def info(self) -> dict:
        out = {k: v for k, v in self.hello.items() if k not in ("ready", "error", "system")}
        try:
            out["memory"] = self.worker.request({"op": "memory"}, 60)
        except PeerError:
            pass
        return out

    def close(self) -> None:
        self.worker.close()


class LlamaCpp:
    """llama.cpp's binaries, one process per request, on GGUFs prepared at start()."""
    name = "llamacpp"

    def __init__(self, bin_dir: Path, prompts: list[str], *, target: Path, draft: Path | None, precision: str,
                 draft_precision: str, max_new_tokens: int, threads: int, draft_threads: int) -> None:
        self.bin_dir, self.prompts, self.max_new_tokens = bin_dir, prompts, max_new_tokens
        self.threads, self.draft_threads = threads, draft_threads
        self.source = {"target": target, "draft": draft, "precision": precision, "draft_precision": draft_precision}
        self.variants: tuple[str, ...] = ("plain",)
        self.details: dict = {"log_lost_reruns": 0, "spec_error": None}

    def start(self) -> None:
        from .llamacpp import build_info, prepare_gguf
        t0 = time.perf_counter()
        self.details["versions"] = {"llama.cpp": build_info(self.bin_dir).get("version"),
                                    "llama_cpp_bin_dir": str(self.bin_dir)}
        s = self.source
        self.target = prepare_gguf(s["target"], s["precision"], bin_dir=self.bin_dir)
        self.details["target_gguf"] = str(self.target)
        if s["draft"] is not None:
            try:
                self.draft = prepare_gguf(s["draft"], s["draft_precision"], bin_dir=self.bin_dir)
                self.details["draft_gguf"] = str(self.draft)
                self.variants = VARIANTS
            except FAILURES as e:              # the target-only figures still count
                self.details["spec_error"] = f"draft: {one_line(e) if not isinstance(e, PeerError) else e}"
        self.details["setup_s"] = time.perf_counter() - t0

    def run(self, variant: str, i: int, *, mode: str, temperature: float, k: int, seed: int) -> dict:
        from .llamacpp import request_plain, request_spec
        kw = dict(n=self.max_new_tokens, threads=self.threads, mode=mode, temperature=temperature, seed=seed,
                  lost=self.details)
        if variant == "plain":
            r = request_plain(self.bin_dir, self.target, self.prompts[i], **kw)
        else:
            r = request_spec(self.bin_dir, self.target, self.draft, prompt=self.prompts[i], k=k,
                             draft_threads=self.draft_threads, **kw)
        return {"new_tokens": r["new_tokens"], "seconds": r["seconds"], "output": r["text"],
                "prompt_tokens": r["prompt_tokens"],
                "stats": {"n_drafted": r.get("n_drafted") or 0, "n_accept": r.get("n_accept") or 0}}

    def summary(self, stats: list[dict]) -> dict:
        tot = {key: sum(s[key] for s in stats) for key in ("n_drafted", "n_accept", "new_tokens")}
        tot["generations"] = len(stats)
        tot["acceptance_rate"] = tot["n_accept"] / tot["n_drafted"] if tot["n_drafted"] else None
        # each round emits its accepted drafts + 1: tokens per target verify call
        tot["tokens_per_target_call"] = tot["new_tokens"] / max(1, tot["new_tokens"] - tot["n_accept"])
        return tot

    def info(self) -> dict:
        return dict(self.details)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------

def run_mode(systems: list, n_prompts: int, *, mode: str, temperature: float, k: int, repeats: int) -> dict:
    """One mode's interleaved requests: per system {"plain", "spec": spread of tokens/s or None, ...}, the
    errors (system -> one line), and per peer the ratios ours/peer."""
    live = {(s.name, v) for s in systems for v in s.variants}
    errors: dict[str, list[str]] = {}
    by_name = {s.name: s for s in systems}
    kw = dict(mode=mode, temperature=temperature, k=k)

    def attempt(name: str, v: str, i: int, seed: int) -> dict | None:
        try:
            return by_name[name].run(v, i, seed=seed, **kw)
        except FAILURES as e:
            live.discard((name, v))
            errors.setdefault(name, []).append(f"{v}: {e if isinstance(e, PeerError) else one_line(e)}")
            return None

    for name, v in sorted(live):                      # warm-ups, untimed
        attempt(name, v, 0, 0)
    acc = {key: [[0, 0.0] for _ in range(repeats)] for key in live}
    first: dict[tuple, dict[int, dict]] = {key: {} for key in live}
    stats: dict[tuple, list] = {key: [] for key in live}
    counts: dict[str, list[int]] = {}
    prompt_tokens: dict[str, dict[int, int]] = {}
    for rep, i, name, v in schedule({s.name: s.variants for s in systems}, n_prompts, repeats):
        if (name, v) not in live:
            continue
        r = attempt(name, v, i, 1000 * rep + i + 1)     # the same seed for every system; never -1 (genai: random)
        if r is None:
            continue
        a = acc[(name, v)][rep]
        a[0] += r["new_tokens"]
        a[1] += r["seconds"]
        counts.setdefault(name, []).append(r["new_tokens"])
        prompt_tokens.setdefault(name, {})[i] = r.get("prompt_tokens")
        stats[(name, v)].append({**(r.get("stats") or {}), "new_tokens": r["new_tokens"]})
        if rep == 0:
            first[(name, v)][i] = r
    out: dict = {"systems": {}, "errors": {n: "; ".join(e) for n, e in errors.items()}, "ratios": {}}
    for s in systems:
        fig = {v: spread([n / secs for n, secs in acc[(s.name, v)]]) if (s.name, v) in live else None
               for v in VARIANTS}
        fig["new_tokens"] = min(counts[s.name]) if s.name in counts else None
        fig["new_tokens_max"] = max(counts[s.name]) if s.name in counts else None
        fig["prompt_tokens"] = [prompt_tokens.get(s.name, {}).get(i) for i in range(n_prompts)]
        fig["spec_stats"] = s.summary(stats[(s.name, "spec")]) if (s.name, "spec") in live else {}
        if mode == "greedy":
            fig["greedy_identical"] = _agree(first, (s.name, "plain"), (s.name, "spec"))
            if s.name != "ours":
                fig["greedy_identical_to_ours"] = _agree(first, (s.name, "plain"), ("ours", "plain"))
        out["systems"][s.name] = fig
    ours = out["systems"].get("ours", {})
    for s in systems:
        if s.name != "ours":
            peer = out["systems"][s.name]
            out["ratios"][s.name] = {v: ratios((ours.get(v) or {}).get("runs"), (peer.get(v) or {}).get("runs"))
                                     for v in VARIANTS}
    return out


def _agree(first: dict, a: tuple, b: tuple) -> bool | None:
    """Greedy: a's outputs equal b's on every prompt of the first repeat; None when either did not run."""
    if a not in first or b not in first or not first[a] or set(first[a]) != set(first[b]):
        return None
    return all(same_output(first[a][i], first[b][i]) for i in first[a])


def run(systems: list, n_prompts: int, *, modes: dict[str, dict], repeats: int) -> tuple[dict, dict]:
    """Start every system (the peers load side by side), then each mode's interleaved requests (modes:
    mode -> {"temperature", "k"}). Returns (per mode results, per system info); closes every system."""
    started, results, infos = [], {}, {}
    try:
        for s in systems:
            try:
                s.start()
                started.append(s)
            except FAILURES as e:
                msg = str(e) if isinstance(e, PeerError) else one_line(e)
                log(f"{s.name} cannot run: {msg}")
                infos[s.name] = {"error": msg}
        for mode, m in modes.items():
            who = ", ".join(f"{s.name} ({'+'.join(s.variants)})" for s in started)
            log(f"{mode}: {who} over {n_prompts} prompts x {repeats} repeats, interleaved, K={m['k']}")
            results[mode] = run_mode(started, n_prompts, mode=mode, repeats=repeats, **m)
        for s in started:
            infos[s.name] = s.info()
    finally:
        for s in systems:
            s.close()
    return results, infos


def report(results: dict, infos: dict, keys: dict[str, tuple[str, str]], *,
           k_by_mode: dict[str, int]) -> tuple[dict, dict]:
    """spec-bench's "peers" and "peers_error" from run()'s results: per mode `<system>_plain` / `_spec` (the
    medians; keys: system -> its two key names), `<system>_detail`, `ours_plain` / `ours_spec` (ours,
    interleaved), `ours_over_<system>_plain` / `_spec` (the median ratios) and `ratios` (system -> variant ->
    median, min, max, runs)."""
    peers: dict = {}
    errors: dict = {}
    for mode, res in results.items():
        section: dict = {}
        for name, fig in res["systems"].items():
            plain_key, spec_key = keys.get(name, (f"{name}_plain", f"{name}_spec"))
            info = infos.get(name, {})
            err = res["errors"].get(name) or info.get("spec_error")
            section[plain_key] = fig["plain"] and fig["plain"]["median"]
            section[spec_key] = fig["spec"] and fig["spec"]["median"]
            detail = {"system": name, "mode": mode, "k": k_by_mode[mode], **info, "error": err}
            for v in VARIANTS:
                f = fig[v] or {}
                detail.update({f"{v}_tps": f.get("median"), f"{v}_tps_min": f.get("min"),
                               f"{v}_tps_max": f.get("max"), f"{v}_tps_runs": f.get("runs")})
            detail.update({key: fig[key] for key in fig if key not in VARIANTS})
            section[f"{name}_detail"] = detail
            if err:
                errors[f"{name}_{mode}"] = err
        for name, rs in res["ratios"].items():
            for v in VARIANTS:
                section[f"ours_over_{name}_{v}"] = rs[v] and rs[v]["median"]
        section["ratios"] = res["ratios"]
        peers[mode] = section
    for name, info in infos.items():          # a peer that never started: null figures in every mode
        if info.get("error"):
            for mode in results:
                plain_key, spec_key = keys.get(name, (f"{name}_plain", f"{name}_spec"))
                peers[mode].update({plain_key: None, spec_key: None, f"ours_over_{name}_plain": None,
                                    f"ours_over_{name}_spec": None,
                                    f"{name}_detail": {"system": name, "mode": mode, "error": info["error"],
                                                       "plain_tps": None, "spec_tps": None}})
                peers[mode]["ratios"][name] = {v: None for v in VARIANTS}
                errors[f"{name}_{mode}"] = info["error"]
    return peers, errors
