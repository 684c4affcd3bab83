#!/usr/bin/env python3
"""Bring onnxruntime-gpu to a lent GPU machine that has no network and takes at most 64 MiB of carried files
per call: download the wheel here once, split it into parts of at most 60 MiB in an ignored folder of the
work tree (.gpu_wheel/), carry one part per device call while the machine stays warm, then reassemble it
there (sha256-checked), install it into a folder (with tokenizers and specedge's own wheel, which the image
may lack) and run tools/gpu_check.py with that folder first on PYTHONPATH.

    python tools/gpu_wheel.py fetch [--version 1.31.1] [--python 3.12]   # here: download + split
    python tools/gpu_wheel.py plan                                        # here: the device calls, in order
    python tools/gpu_wheel.py assemble --target /tmp/ortgpu               # there: join, check, pip install

The calls must follow each other at once (a warm machine is given back after about 30 s idle, and a
fresh one has lost the parts): `plan` prints each call's command and its `carry` list.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / ".gpu_wheel"          # ignored by git; the device tool carries ignored paths named in `carry`
PART_BYTES = 60 << 20
CACHE = Path.home() / ".cache" / "specedge" / "gpu_wheel"


def fetch(version: str, python: str) -> Path:
    """Download onnxruntime-gpu's manylinux x86_64 wheel for `python` (no dependencies: the GPU image has
    CUDA, numpy and the rest) and split it into PARTS with a manifest of sizes and hashes."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tag = python.replace(".", "")
    wheels = sorted(CACHE.glob(f"onnxruntime_gpu-{version}-cp{tag}-*.whl"))
    if not wheels:
        subprocess.check_call([sys.executable, "-m", "pip", "download", f"onnxruntime-gpu=={version}", "--no-deps",
                               "--only-binary", ":all:", "--python-version", python, "--implementation", "cp",
                               "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
                               "--platform", "manylinux_2_17_x86_64", "-d", str(CACHE)])
        wheels = sorted(CACHE.glob(f"onnxruntime_gpu-{version}-cp{tag}-*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_wheel: pip found no onnxruntime-gpu {version} wheel for CPython {python} on x86_64")
    wheel = wheels[-1]
    data = wheel.read_bytes()
    PARTS.mkdir(exist_ok=True)
    for old in PARTS.glob("part*"):
        old.unlink()
    parts = []
    for i in range(0, len(data), PART_BYTES):
        name = f"part{i // PART_BYTES:02d}"
        (PARTS / name).write_bytes(data[i:i + PART_BYTES])
        parts.append(name)
    # small wheels the image may lack, installed beside it: tokenizers, and specedge itself (pure Python)
    extras = PARTS / "extras"
    extras.mkdir(exist_ok=True)
    subprocess.check_call([sys.executable, "-m", "pip", "download", "tokenizers", "--no-deps", "--only-binary",
                           ":all:", "--python-version", python, "--implementation", "cp", "--platform",
                           "manylinux_2_17_x86_64", "-d", str(extras)])
    subprocess.check_call([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                           str(extras), str(ROOT)])
    manifest = {"wheel": wheel.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": parts,
                "extras": sorted(w.name for w in extras.glob("*.whl"))}
    (PARTS / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{wheel.name}: {len(data) / 2**20:.0f} MiB in {len(parts)} parts under {PARTS.relative_to(ROOT)}/")
    return PARTS / "manifest.json"


def plan() -> list[dict]:
    """The device calls: one part each (with the small manifest), then assemble + install + check."""
    manifest = json.loads((PARTS / "manifest.json").read_text())
    rel = PARTS.relative_to(ROOT)
    calls = [{"command": f"ls -l {rel}/{p}", "carry": [f"{rel}/{p}", f"{rel}/manifest.json"], "timeout_s": 120}
             for p in manifest["parts"]]
    calls.append({"command": f"python3 tools/gpu_wheel.py assemble --target /tmp/ortgpu && "
                             f"PYTHONPATH=/tmp/ortgpu python3 tools/gpu_check.py --bundle bundles/demo --budget-s 300 "
                             f"--json $OUT/gpu_check.json",
                  "carry": [f"{rel}/manifest.json", f"{rel}/extras", "bundles/demo"], "timeout_s": 540})
    return calls


def assemble(target: Path) -> None:
    """There: join the parts, check size and sha256, pip install the wheel (no dependencies) into target."""
    manifest = json.loads((PARTS / "manifest.json").read_text())
    missing = [p for p in manifest["parts"] if not (PARTS / p).is_file()]
    if missing:
        raise SystemExit(f"gpu_wheel: parts {missing} are not here: the machine was given back between calls; "
                         f"carry them again, one call after another")
    data = b"".join((PARTS / p).read_bytes() for p in manifest["parts"])
    if len(data) != manifest["bytes"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise SystemExit("gpu_wheel: the joined parts do not match the manifest's size and sha256; fetch again")
    wheel = PARTS / manifest["wheel"]
    wheel.write_bytes(data)
    extras = [str(PARTS / "extras" / w) for w in manifest.get("extras", [])]
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
                           str(target), str(wheel), *extras])
    print(f"installed {manifest['wheel']} into {target}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--version", default="1.31.1")
    f.add_argument("--python", default="3.12", help="the GPU machine's Python (its image has 3.12)")
    sub.add_parser("plan")
    a = sub.add_parser("assemble")
    a.add_argument("--target", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "fetch":
        fetch(args.version, args.python)
    elif args.cmd == "plan":
        for i, call in enumerate(plan(), 1):
            print(f"{i}. {json.dumps(call)}")
    else:
        assemble(args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
