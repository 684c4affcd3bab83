"""The demo bundle: the demo pair's sources (configs/demo.toml), its export settings, and the one export
path (cached by a source key) that tools/demo.py (the README's main job), eval_demo_pair.py and the
tests share. tools/demo.py imports it as demo_pair.demo_bundle (its own folder, tools/, is on sys.path),
eval_demo_pair.py as a sibling module."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_demo_config() -> dict:
    try:
        import tomllib
    except ImportError:          # Python < 3.11
        import tomli as tomllib
    cfg = tomllib.loads((ROOT / "configs" / "demo.toml").read_text())
    return {k: ROOT / v for k, v in cfg.items()}


# The demo bundle's export settings, for every tool that exports the demo pair (demo, eval, bench):
# onnxruntime-genai's fused graphs are the faster fp32 ones here, and an int8 draft steps faster without
# moving the output's law (docs/benchmarks.md has the figures).
DEMO_EXPORT = {"k": 8, "max_context": 1024, "builder": "genai", "draft_dtype": "int8"}


def source_key(*paths: Path, settings: dict = DEMO_EXPORT) -> str:
    """Changes whenever a source file, the export settings or specedge's version change."""
    from specedge.runtime import __version__
    h = hashlib.sha256((__version__ + json.dumps(settings, sort_keys=True)).encode())
    for path in paths:
        for f in sorted(path.iterdir()) if path.is_dir() else [path]:
            if f.is_file():
                h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def ensure_bundle(bundle: Path, target: Path, draft: Path, prompts: Path | None, *,
                  settings: dict = DEMO_EXPORT) -> bool:
    """Export the pair into `bundle` unless it already holds exactly this export; True if reused."""
    from specedge.export import export_bundle
    key = source_key(target, draft, *([prompts] if prompts else []), settings=settings)
    stamp = bundle / "source-key.txt"
    if stamp.is_file() and stamp.read_text() == key:
        return True
    export_bundle(target=target, draft=draft, out=bundle, prompts=prompts, overwrite=True, **settings)
    stamp.write_text(key)
    return False
