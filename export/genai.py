"""Fused graphs from onnxruntime-genai's model builder, under our manifest and parity checks.

The builder writes GroupQueryAttention / SkipSimplifiedLayerNorm / fused-QKV graphs (and int4
MatMulNBits weights) with the same I/O names as ours, minus `position_ids` (positions come from the
mask) and with head_dim left symbolic; the runtime's engine handles both. It runs offline on a
local Hugging Face folder.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .loader import ExportError

PRECISIONS = {"fp32": "fp32", "fp16": "fp16", "int8": "int8", "int4": "int4"}


def run_builder(src: Path, out: Path, *, precision: str, extra_options: dict[str, str] | None = None,
                timeout: int = 3600) -> None:
    """Build `src` into `out` (model.onnx, model.onnx.data, genai_config.json, tokenizer files);
    `extra_options` go to the builder's --extra_options (e.g. {"block_size": "128"})."""
    if importlib.util.find_spec("onnxruntime_genai") is None:
        raise ExportError("--builder genai needs onnxruntime-genai: pip install 'specedge[bench]' "
                          "or pip install onnxruntime-genai")
    if precision not in PRECISIONS:
        raise ExportError(f"the genai builder takes --dtype {', '.join(PRECISIONS)}, not {precision!r}")
    src, out = Path(src).resolve(), Path(out).resolve()    # the builder runs in a scratch cwd
    with tempfile.TemporaryDirectory(prefix="genai-build-") as scratch:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(out),
               "-p", PRECISIONS[precision], "-e", "cpu", "-c", str(Path(scratch) / "hf_cache")]
        if extra_options:
            cmd += ["--extra_options"] + [f"{k}={v}" for k, v in extra_options.items()]
        # cwd=scratch: the builder may drop files in its working directory
        proc = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0 or not (out / "model.onnx").is_file():
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()] or ["no output"]
        # the exception line, not the advice that transformers appends to it
        tail = [ln for ln in lines if re.match(r"[\w.]*(Error|Exception)\b", ln)][-1:] or lines[-1:]
        raise ExportError(f"the onnxruntime-genai builder failed on {src} (exit {proc.returncode}): "
                          f"{tail[0]}; export with --builder torch instead")


def export_genai(src: Path, dst: Path, *, precision: str,
                 extra_options: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """Build into dst/ keeping only the graph, its weights and genai_config.json; return I/O names."""
    import onnx

    build = dst / ".build"
    run_builder(src, build, precision=precision, extra_options=extra_options)
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        if (build / name).is_file():
            shutil.move(str(build / name), str(dst / name))
    shutil.rmtree(build, ignore_errors=True)
    graph = onnx.load(str(dst / "model.onnx"), load_external_data=False).graph
    return [i.name for i in graph.input], [o.name for o in graph.output]
