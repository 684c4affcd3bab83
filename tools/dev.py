#!/usr/bin/env python3
"""The README's two commands. Each creates ./.venv if needed and installs what it needs into it.

    python3 tools/dev.py demo [prompt]   export the demo pair (cached) and complete a code prompt
    python3 tools/dev.py test [pytest args]   run the test suite

Only python3 (>= 3.9) is needed on the machine. torch is installed first, pinned, so that pip takes
the CPU build where one is provided instead of pulling a multi-GB CUDA build.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
TORCH = "torch==2.13.0"
EXTRAS = ".[cpu,export,dev]"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv() -> Path:
    py = venv_python()
    if not py.exists():
        print(f"creating virtualenv {VENV}", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + TORCH.encode()).hexdigest()
    stamp = VENV / ".specedge-installed"
    if not stamp.exists() or stamp.read_text() != key:
        pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "on"]
        print("[1/2] installing torch (CPU build) into .venv ...", flush=True)
        subprocess.check_call(pip + [TORCH])
        print("[2/2] installing specedge[cpu,export,dev] (onnxruntime, transformers, onnx, pytest, ...) ...", flush=True)
        subprocess.check_call(pip + ["-e", EXTRAS], cwd=ROOT)
        stamp.write_text(key)
    return py


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test"):
        print(__doc__)
        return 2
    py = str(ensure_venv())
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if argv[0] == "test":
        return subprocess.call([py, "-m", "pytest", "-q", *argv[1:]], cwd=ROOT, env=env)
    return subprocess.call([py, str(ROOT / "tools" / "demo.py"), *argv[1:]], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
