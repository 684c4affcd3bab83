"""A GGUF file -> a Hugging Face folder (fp32 safetensors, config, tokenizer with its chat template).

transformers' GGUF loader dequantizes the weights; the folder it yields is then exported like any
other. `save_pretrained` refuses a model loaded from GGUF, so the state dict is written directly.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .loader import ExportError

_NEEDS = "pip install 'specedge[export]' (it brings the gguf and accelerate packages)"


def is_gguf(path: Path) -> bool:
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _architecture(path: Path) -> str:
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ExportError(f"reading {path.name} needs the gguf package: {_NEEDS}") from e
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except (KeyError, ValueError, IndexError, OSError) as e:
        raise ExportError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); "
                          f"pass a complete .gguf model file") from e


def gguf_to_folder(path: Path, out: Path) -> Path:
    """Write `out` (a new folder) holding the GGUF model as a Hugging Face folder; return `out`."""
    path, out = Path(path), Path(out)
    if not is_gguf(path):
        raise ExportError(f"{path} is not a GGUF file (no GGUF magic); pass a .gguf model file or a "
                          f"Hugging Face model folder")
    arch = _architecture(path)
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        raise ExportError(f"converting a GGUF file needs {e.name}: {_NEEDS}") from e
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES as known
    except ImportError:
        known = None
    if known is not None and arch not in known:
        raise ExportError(f"{path.name} holds a {arch!r} model, which transformers' GGUF loader does not read "
                          f"(it reads: {', '.join(sorted(known))}); convert the model to a Hugging Face folder "
                          f"another way, or pick a supported architecture")
    os.environ.setdefault("TQDM_DISABLE", "1")     # the loader's per-tensor progress bar
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32, local_files_only=True)
    except ImportError as e:
        raise ExportError(f"converting a GGUF file needs {e.name or e}: {_NEEDS}") from e
    except (ValueError, KeyError, NotImplementedError, RuntimeError, OSError, TypeError) as e:
        raise ExportError(f"transformers cannot load {path.name} (architecture {arch!r}): "
                          f"{type(e).__name__}: {str(e)[-300:]}; it reads GGUF files of the architectures "
                          f"and quantization types its GGUF loader lists") from e
    out.mkdir(parents=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)   # shared with the embedding; safetensors refuses aliases
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        config.pop(key, None)
    config["dtype"] = "float32"
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    model.generation_config.to_json_file(out / "generation_config.json")
    tok.save_pretrained(out)
    (out / "SOURCE").write_text(f"converted from {path.name} by specedge.export.gguf\n")
    return out
