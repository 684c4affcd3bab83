"""Tiny random-weight models built from a config (no downloads) and bundles exported from them."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
VOCAB = 320          # > the 257-token byte tokenizer: the rows beyond it are padding, as in Qwen


def byte_tokenizer_json(swap: tuple[int, int] | None = None) -> str:
    """A byte-level BPE with no merges: 256 byte tokens + <|endoftext|> (id 256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: ord(ch))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    if swap:
        a, b = (alphabet[i] for i in swap)
        vocab[a], vocab[b] = vocab[b], vocab[a]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok.to_str()


def tiny_config(arch: str, *, vocab: int = VOCAB, layers: int = 2, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2, positions: int = 512):
    import transformers as tf
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=positions,
                             bos_token_id=256, eos_token_id=256)
    cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config,
           "qwen3": tf.Qwen3Config, "phi3": tf.Phi3Config}[arch]
    extra = {"head_dim": hidden // heads} if arch == "qwen3" else {}
    return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
               bos_token_id=256, eos_token_id=256, pad_token_id=None, tie_word_embeddings=False, **extra)


def make_model(folder: Path, arch: str = "llama", *, seed: int = 0, dtype: str = "float32",
               perturb_from: Path | None = None, noise: float = 0.0, tokenizer: str | None = None,
               **dims) -> Path:
    """Write a Hugging Face folder with random weights; `perturb_from` copies a model and adds noise."""
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    if perturb_from is not None:
        model = tf.AutoModelForCausalLM.from_pretrained(perturb_from, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p) * p.std())
    else:
        model = tf.AutoModelForCausalLM.from_config(tiny_config(arch, **dims))
        with torch.no_grad():     # larger logits than the default init: fewer near-ties, peakier p
            model.get_output_embeddings().weight.mul_(8.0)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(tokenizer or byte_tokenizer_json())
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 256, "do_sample": False}))
    return folder


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def llama_target(models_dir) -> Path:
    return make_model(models_dir / "target", "llama", seed=1)


@pytest.fixture(scope="session")
def llama_drafts(models_dir, llama_target) -> dict[str, Path]:
    """A draft that mostly agrees with the target (a perturbed copy) and one that mostly disagrees."""
    return {"agree": make_model(models_dir / "draft_agree", perturb_from=llama_target, noise=0.02, seed=2),
            "disagree": make_model(models_dir / "draft_disagree", "llama", seed=3, layers=1, hidden=32)}


@pytest.fixture(scope="session")
def pair_bundles(tmp_path_factory, llama_target, llama_drafts) -> dict[str, Path]:
    from specedge.export import export_bundle
    root = tmp_path_factory.mktemp("bundles")
    out = {}
    for name, draft in llama_drafts.items():
        out[name] = root / name
        export_bundle(target=llama_target, draft=draft, out=out[name], k=8, max_context=256, quiet=True)
    return out
