"""Peak host memory of decoding, each configuration in a fresh process: what a bundle costs on a board
whose RAM the GPU shares (Jetson), and what the draft adds to it.

Figures are MiB above the process's floor once numpy, onnxruntime, tokenizers and specedge are
imported: the graphs' weights, onnxruntime's arenas and the KV caches. Peak (the high-water mark) includes the
transient copies of loading, which is what an out-of-memory kill sees; held is what stays resident after
a request. Device memory (CUDA providers) is not in them.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path


def _status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status in MiB (Linux); None where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024            # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def held_mb() -> float | None:
    """This process's resident set now, in MiB (Linux; None elsewhere)."""
    return _status_mb("VmRSS")


def rss_mb() -> float:
    """This process's peak resident set so far, in MiB. Linux: VmHWM, which starts afresh at exec;
    ru_maxrss would carry the high-water mark of the parent that spawned the process (spec-bench's).
    Elsewhere ru_maxrss (bytes on macOS)."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


_CHILD = """
import json, sys
import numpy, onnxruntime, tokenizers
from specedge.bench.memory import held_mb, rss_mb
from specedge.runtime import SpeculativeDecoder
a = json.loads(sys.argv[1])
floor = held_mb()
dec = SpeculativeDecoder.from_bundle(a["bundle"], threads=a["threads"], draft_threads=a["draft_threads"],
                                     providers=a["providers"], speculative=a["speculative"])
res = dec.generate(a["prompt"], max_new_tokens=a["max_new_tokens"], temperature=0.0, ignore_eos=True)
print(json.dumps({"floor_mb": floor, "peak_mb": rss_mb(), "held_mb": held_mb(), "new_tokens": res.stats.new_tokens}))
"""


def _child(**kw) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kw)], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"memory probe exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(bundle: str | Path, *, prompt: str, max_new_tokens: int, threads: int = 1, draft_threads: int = 1,
            providers: list[str] | None = None) -> dict:
    """Target-only and speculative decoding of `prompt`, each in its own process: MiB above the floor."""
    runs = {name: _child(bundle=str(bundle), prompt=prompt, max_new_tokens=max_new_tokens, threads=threads,
                         draft_threads=draft_threads, providers=providers, speculative=spec)
            for name, spec in (("target_only", False), ("speculative", True))}
    # absolute MiB in the child; above its resting floor here (no /proc: the peak's own floor is unknown)
    above = lambda r, key: None if r["floor_mb"] is None or r[key] is None else r[key] - r["floor_mb"]
    peak = {name: above(r, "peak_mb") for name, r in runs.items()}
    held = {name: above(r, "held_mb") for name, r in runs.items()}
    return {"target_only_peak_mb": peak["target_only"], "speculative_peak_mb": peak["speculative"],
            "target_only_held_mb": held["target_only"], "speculative_held_mb": held["speculative"],
            "draft_extra_held_mb": None if None in held.values() else held["speculative"] - held["target_only"],
            "floor_mb": runs["target_only"]["floor_mb"], "runs": runs,
            "what": "MiB above the process's floor once the runtime is imported, one fresh process per "
                    "configuration: peak = the most resident at once (loading included), held = resident "
                    "after the request; host memory only, no device memory"}
