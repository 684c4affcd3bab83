"""Check a Hugging Face model folder and load it for export (safetensors unless pickles are allowed)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from .architectures import REGISTRY, Arch, supported

DTYPES = {"fp32": "float32", "fp16": "float16"}

from specedge.runtime.errors import ExportError


def read_config(folder: Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        hub = re.fullmatch(r"[\w.-]+/[\w.-]+", str(folder)) and not folder.parent.exists()
        hint = (f"; it looks like a Hugging Face hub id: download it first, e.g. `huggingface-cli download "
                f"{folder} --local-dir models/{folder.name}`, and pass that folder") if hub else ""
        raise ExportError(f"model folder {folder} does not exist; pass a Hugging Face model folder "
                          f"(config.json + *.safetensors + tokenizer) or a .gguf file{hint}")
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ExportError(f"{folder} has no config.json: not a Hugging Face model folder")
    return read_json_object(cfg)


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object (a model's config, generation or tokenizer settings)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ExportError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(d, dict):
        raise ExportError(f"{path} holds a JSON {type(d).__name__}, not an object")
    return d


def arch_of(folder: Path) -> tuple[str, Arch]:
    model_type = read_config(folder).get("model_type")
    if model_type not in REGISTRY:
        raise ExportError(f"{folder}: architecture {model_type!r} is not supported; supported model_type "
                          f"values: {supported()}")
    return model_type, REGISTRY[model_type]


def check_weights(folder: Path, *, allow_pickle: bool) -> bool:
    """Return True when the weights are safetensors; refuse pickles unless allowed."""
    if any(Path(folder).glob("*.safetensors")):
        return True
    pickles = sorted(p.name for p in Path(folder).glob("*.bin"))
    if pickles and allow_pickle:
        return False
    if pickles:
        raise ExportError(f"{folder} holds its weights only as pickled {pickles[0]}, which can run code "
                          f"when loaded; convert them to safetensors, or pass --allow-pickle if you trust "
                          f"the source")
    raise ExportError(f"{folder} has no weights (*.safetensors)")


def load_config(folder: Path):
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # each config class validates with its own code: any error means a bad file
        raise ExportError(f"transformers cannot read {folder}/config.json: {type(e).__name__}: {e}") from e


def check_source(folder: Path, *, dtype: str, max_context: int | None, allow_pickle: bool) -> dict:
    """Everything that can be refused about one model before any heavy work; returns its dims."""
    model_type, arch = arch_of(folder)
    check_weights(folder, allow_pickle=allow_pickle)
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    config = load_config(folder)
    try:
        dims = arch.dims(config)
    except (AttributeError, TypeError, ZeroDivisionError) as e:
        raise ExportError(f"{folder}/config.json lacks a field the {model_type} export needs: {e}") from e
    limit = dims.pop("max_positions")
    if max_context is None:
        max_context = min(limit, 4096)
    if max_context > limit:
        raise ExportError(f"--max-context {max_context} exceeds the model's position limit of {limit}; "
                          f"pass --max-context {limit} or less")
    if max_context < 2:
        raise ExportError(f"--max-context must be at least 2, got {max_context}")
    window = getattr(config, "sliding_window", None) if arch.sliding_window else None
    uses_window = window and getattr(config, "use_sliding_window", True)   # Qwen: off unless set
    if uses_window and max_context > window:
        raise ExportError(f"{folder} uses sliding-window attention ({window} tokens), which the exported "
                          f"full KV cache does not model; pass --max-context {window} or less")
    return {"model_type": model_type, **dims, "dtype": DTYPES[dtype], "max_context": max_context}


def load_model(folder: Path, *, dtype: str, max_context: int | None, allow_pickle: bool):
    """Load the model in `dtype` (fp32|fp16) whatever the stored dtype; return (model, dims)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dims = check_source(folder, dtype=dtype, max_context=max_context, allow_pickle=allow_pickle)
    config = load_config(folder)
    if getattr(config, "sliding_window", None) and REGISTRY[dims["model_type"]].sliding_window:
        # Within the window, sliding attention is full attention; this keeps every position in the cache.
        config.sliding_window = None
        if getattr(config, "layer_types", None):
            config.layer_types = ["full_attention"] * len(config.layer_types)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=getattr(torch, dims["dtype"]), local_files_only=True,
            use_safetensors=check_weights(folder, allow_pickle=allow_pickle), attn_implementation="sdpa")
    except ExportError:
        raise
    except Exception as e:  # safetensors, torch's unpickler and transformers each raise their own types
        raise ExportError(f"cannot load the weights of {folder} ({type(e).__name__}: {' '.join(str(e).split())[:300]}); "
                          f"the files are truncated, corrupt or do not match config.json -- download them again") from e
    model.eval()
    return model, dims
