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


def make_gguf(path: Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
              arch: str = "llama", chat_template: str | None = None) -> Path:
    """Write a tiny random-weight Llama as a GGUF file (F32 tensors, the byte-level tokenizer as a
    "gpt2" BPE vocabulary), the shape llama.cpp's converter writes."""
    import gguf
    import numpy as np
    rng = np.random.default_rng(seed)
    vocab = json.loads(byte_tokenizer_json())["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get) + ["<|endoftext|>"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(2 * hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL])
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_merges([])
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    if chat_template:
        w.add_chat_template(chat_template)
    mlp = 2 * hidden
    kv = hidden // heads * kv_heads
    shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,),
              "output.weight": (len(tokens), hidden)}
    for i in range(layers):
        shapes |= {f"blk.{i}.attn_norm.weight": (hidden,), f"blk.{i}.ffn_norm.weight": (hidden,),
                   f"blk.{i}.attn_q.weight": (hidden, hidden), f"blk.{i}.attn_k.weight": (kv, hidden),
                   f"blk.{i}.attn_v.weight": (kv, hidden), f"blk.{i}.attn_output.weight": (hidden, hidden),
                   f"blk.{i}.ffn_gate.weight": (mlp, hidden), f"blk.{i}.ffn_up.weight": (mlp, hidden),
                   f"blk.{i}.ffn_down.weight": (hidden, mlp)}
    for name, shape in shapes.items():
        scale = 1.0 if name.endswith("norm.weight") else (0.5 if name == "output.weight" else 0.08)
        data = np.ones(shape, np.float32) if len(shape) == 1 else (rng.standard_normal(shape) * scale).astype(np.float32)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
