"""Supported architectures: a registry from Hugging Face `model_type` to how its config reads.

Adding an architecture whose transformers implementation takes a `Cache` is one entry here; the
export wrapper, parity checks and runtime need nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    layers: str = "num_hidden_layers"
    heads: str = "num_attention_heads"
    kv_heads: str | None = "num_key_value_heads"   # None: multi-head attention (kv heads = heads)
    hidden: str = "hidden_size"
    positions: str = "max_position_embeddings"
    sliding_window: bool = False                     # config may set a sliding attention window

    def dims(self, config) -> dict:
        heads = getattr(config, self.heads)
        kv = getattr(config, self.kv_heads, None) if self.kv_heads else None
        head_dim = getattr(config, "head_dim", None) or getattr(config, self.hidden) // heads
        return {"num_layers": int(getattr(config, self.layers)), "num_kv_heads": int(kv or heads),
                "head_dim": int(head_dim), "vocab_size": int(config.vocab_size),
                "max_positions": int(getattr(config, self.positions))}


LLAMA_LIKE = Arch()
REGISTRY: dict[str, Arch] = {
    "llama": LLAMA_LIKE,
    "mistral": Arch(sliding_window=True),
    "qwen2": Arch(sliding_window=True),
    "qwen3": Arch(sliding_window=True),
    "phi3": Arch(sliding_window=True),
    "gpt2": Arch(layers="n_layer", heads="n_head", kv_heads=None, hidden="n_embd", positions="n_positions"),
}


def supported() -> str:
    return ", ".join(sorted(REGISTRY))
