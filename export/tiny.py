"""Tiny random-weight Hugging Face models built from a config: tests, smoke checks, the fallback demo.

No download: a byte-level tokenizer (256 byte tokens + <|endoftext|>) and random weights.
"""
from __future__ import annotations

import json
from pathlib import Path

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
