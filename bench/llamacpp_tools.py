"""The llama.cpp peer's plumbing: where the binaries are, running them, and reading their output (the
parsers are tested on output captured from the built binaries, tests/data/llamacpp)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BINARIES = ("llama-bench", "llama-completion", "llama-speculative-simple", "llama-tokenize", "llama-quantize")
BUILD_HINT = "python tools/lab/build_llama_cpp.py"
PRECISIONS = ("f32", "f16", "q8_0", "q4_0", "as-is")
# a bundle's weight precision -> the GGUF type with the same weights' precision
BUNDLE_TO_GGUF = {"fp32": "f32", "fp16": "f16", "int8": "q8_0", "int4": "q4_0"}
RUN_TIMEOUT = 600.0


class PeerError(RuntimeError):
    """A peer that cannot run: its message is one line, meant for the JSON's "error"."""


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]


def log(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------
# where the build is

def cache_root() -> Path:
    """As tools/lab/build_llama_cpp.py caches it ($SPECEDGE_CACHE moves ~/.cache/specedge)."""
    base = Path(os.environ.get("SPECEDGE_CACHE", Path.home() / ".cache" / "specedge"))
    return base / "llama.cpp"


def _version_key(name: str) -> list[int]:
    return [int(x) if x.isdigit() else 0 for x in re.split(r"[.\-]", name)]


def find_bin_dir(explicit: str | Path | None = None, root: Path | None = None) -> Path | None:
    """The folder holding llama.cpp's binaries: explicit, else $SPECEDGE_LLAMA_CPP_BIN, else the newest
    complete build in the cache (root: cache_root()); None when there is none."""
    explicit = explicit or os.environ.get("SPECEDGE_LLAMA_CPP_BIN")
    if explicit:
        d = Path(explicit).expanduser()
        return d if all((d / b).is_file() for b in BINARIES) else None
    root = root or cache_root()
    if not root.is_dir():
        return None
    builds = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")
              and all((d / "bin" / b).is_file() for b in BINARIES)]
    return max(builds, key=lambda d: _version_key(d.name)) / "bin" if builds else None


def not_built_message() -> str:
    return (f"llama.cpp is not built (no binaries under {cache_root()}): run `{BUILD_HINT}` once "
            "(a few minutes of compiling) to add it")


def build_info(bin_dir: Path) -> dict:
    f = bin_dir.parent / "build.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------------------------
# running a binary

def run_tool(argv: list, *, timeout: float = RUN_TIMEOUT) -> tuple[int, str, str]:
    """Run a binary; (exit status, stdout, stderr). Output goes through files, not pipes, so a chatty
    binary can never block; a binary past `timeout` is killed and says so in its stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            rc = subprocess.run([str(a) for a in argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                timeout=timeout).returncode
            note = ""
        except subprocess.TimeoutExpired:
            rc, note = -9, f"\n{Path(str(argv[0])).name} killed after {timeout:.0f} s"
        out.seek(0)
        err.seek(0)
        return rc, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace") + note


def tail(text: str, n: int = 1) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-300:]


def check(argv: list, what: str, timeout: float = RUN_TIMEOUT) -> tuple[str, str]:
    rc, out, err = run_tool(argv, timeout=timeout)
    if rc != 0:
        why = tail(err, 2) or tail(out, 2)
        if not why:     # llama.cpp logs from a thread that an early exit can cut off before it writes
            why = "no message (llama.cpp's log thread lost it); run by hand: " + " ".join(map(str, argv))[:200]
        raise PeerError(f"{what} exited {rc}: {why}")
    return out, err


# ---------------------------------------------------------------------------------------------------------
# parsers of llama.cpp's output (tests/test_llamacpp.py runs them on captured output)

_NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"


def parse_perf(stderr: str) -> dict:
    """common_perf_print / llama_perf_context_print lines -> milliseconds and counts:
    "... prompt eval time =   12.34 ms /    10 tokens (...)", "... eval time = 56.78 ms / 63 runs (...)",
    "load time", "sampling time", "total time". The last occurrence wins (the target's, when a draft's
    figures come first)."""
    out: dict = {}
    for line in stderr.splitlines():
        m = re.search(r"(load time|prompt eval time|(?<!prompt )eval time|sampling time|total time)\s*=\s*"
                      rf"{_NUM}\s*ms(?:\s*/\s*{_NUM}\s*(tokens|runs))?", line)
        if not m:
            continue
        key = m.group(1).replace(" time", "").replace(" ", "_")
        out[f"{key}_ms"] = float(m.group(2))
        if m.group(3) is not None:
            out[f"{key}_{m.group(4)}"] = int(float(m.group(3)))
    return out


def parse_completion(stderr: str) -> dict:
    """llama-completion's stderr -> prompt_tokens, new_tokens, seconds and the raw perf figures.
    seconds: its "total time" (prompt eval + eval + sampling + the rest of the request; model load and
    warm-up are before its timers start), else prompt eval + eval. The first new token comes from the
    prompt's own pass, so new tokens = eval runs + 1."""
    perf = parse_perf(stderr)
    if "eval_ms" not in perf or "prompt_eval_ms" not in perf:
        raise PeerError(f"llama-completion printed no timings: {tail(stderr, 2)}")
    new = perf.get("eval_runs", 0) + 1
    ms = perf.get("total_ms") or perf["prompt_eval_ms"] + perf["eval_ms"] + perf.get("sampling_ms", 0.0)
    return {"prompt_tokens": perf.get("prompt_eval_tokens"), "new_tokens": new, "seconds": ms / 1e3,
            "perf": perf}


def parse_speculative(stderr: str) -> dict:
    """llama-speculative-simple's stderr -> prompt_tokens, new_tokens, seconds (encode + decode),
    n_draft (K), n_drafted, n_accept, acceptance_rate."""
    enc = re.search(rf"encoded\s+(\d+)\s+tokens in\s+{_NUM}\s+seconds", stderr)
    dec = re.search(rf"decoded\s+(\d+)\s+tokens in\s+{_NUM}\s+seconds", stderr)
    if not (enc and dec):
        raise PeerError(f"llama-speculative-simple printed no timings: {tail(stderr, 2)}")
    res = {"prompt_tokens": int(enc.group(1)), "new_tokens": int(dec.group(1)),
           "encode_seconds": float(enc.group(2)), "decode_seconds": float(dec.group(2)),
           "seconds": float(enc.group(2)) + float(dec.group(2))}
    for key in ("n_draft", "n_predict", "n_drafted", "n_accept"):
        m = re.search(rf"\b{key}\s*=\s*(\d+)", stderr)
        res[key] = int(m.group(1)) if m else None
    res["acceptance_rate"] = (res["n_accept"] / res["n_drafted"]) if res.get("n_drafted") else None
    return res


def parse_bench_json(stdout: str) -> dict:
    """llama-bench -o json -> the decode test's tokens/s (avg, stddev, samples) and its setup."""
    start = stdout.find("[")
    try:
        rows = json.loads(stdout[start:]) if start >= 0 else None
    except ValueError:
        rows = None
    if not rows:
        raise PeerError(f"llama-bench printed no JSON: {tail(stdout, 2)}")
    row = next((r for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0), rows[0])
    return {"decode_tps": row.get("avg_ts"), "decode_tps_stddev": row.get("stddev_ts"),
            "decode_tps_samples": row.get("samples_ts"), "n_gen": row.get("n_gen"),
            "n_threads": row.get("n_threads"), "type_k": row.get("type_k"), "model_type": row.get("model_type"),
            "model_size": row.get("model_size"), "build_commit": row.get("build_commit"),
            "build_number": row.get("build_number"), "cpu_info": row.get("cpu_info"),
            "flash_attn": row.get("flash_attn")}


def generated_text(stdout: str, prompt: str) -> str:
    """What follows the prompt in a binary's stdout (llama-speculative-simple echoes the prompt first)."""
    i = stdout.find(prompt)
    return stdout[i + len(prompt):] if i >= 0 else stdout


def parse_tokenize(stdout: str) -> list[int]:
    """llama-tokenize --ids --log-disable: "[1, 2, 3]"."""
    m = re.search(r"\[([\d,\s]*)\]\s*$", stdout.strip())
    if not m:
        raise PeerError(f"llama-tokenize printed no ids: {tail(stdout)}")
    return [int(x) for x in m.group(1).replace(",", " ").split()]
