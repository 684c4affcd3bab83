"""`spec-export triton BUNDLE OUT`: a Triton Inference Server model repository serving a bundle through
the Python backend (export/triton_model.py), in decoupled (streaming) mode, batch 1, no dynamic batching.

    OUT/specedge/config.pbtxt
    OUT/specedge/1/model.py
    OUT/specedge/1/bundle/...        a copy of the bundle (paths stay inside it)
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from specedge.runtime.errors import ExportError
from specedge.runtime.manifest import Manifest

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{
  decoupled: true
}}
input [
  {{
    name: "text_input"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }},
  {{
    name: "max_tokens"
    data_type: TYPE_INT32
    dims: [ 1 ]
    optional: true
  }},
  {{
    name: "temperature"
    data_type: TYPE_FP32
    dims: [ 1 ]
    optional: true
  }}
]
output [
  {{
    name: "text_output"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }}
]
instance_group [
  {{
    count: {instances}
    kind: KIND_CPU
  }}
]
parameters {{
  key: "bundle"
  value: {{ string_value: "bundle" }}
}}
parameters {{
  key: "threads"
  value: {{ string_value: "{threads}" }}
}}
"""


def export_triton(bundle: Path, out: Path, *, name: str = "specedge", instances: int = 1, threads: int = 0) -> Path:
    """Write the model repository `out` (a new folder, written whole: temp folder, then rename)."""
    bundle, out = Path(bundle), Path(out)
    Manifest.load(bundle)                    # a broken bundle is refused before anything is written
    if out.exists():
        raise ExportError(f"{out} already exists; choose a new folder for the model repository")
    if not name.replace("_", "").replace("-", "").isalnum():
        raise ExportError(f"model name {name!r} must be letters, digits, '-' or '_'")
    if instances < 1 or threads < 0:
        raise ExportError("--instances must be >= 1 and --threads >= 0")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        version = tmp / name / "1"
        version.mkdir(parents=True)
        (tmp / name / "config.pbtxt").write_text(CONFIG.format(name=name, instances=instances, threads=threads))
        shutil.copy2(Path(__file__).with_name("triton_model.py"), version / "model.py")
        shutil.copytree(bundle, version / "bundle", ignore=shutil.ignore_patterns("source-key.txt"))
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
