"""An EAGLE-style draft head (Li et al. 2024): one decoder layer that reads the target's last hidden
state with the next token's embedding and predicts the next hidden state, with an LM head over the
most frequent tokens only.

    x_j  = fc([embed(t_{j+1}); f_j])          f_j: the target's final (normed) hidden state after token j
    h_j  = norm(layer(x_0..x_j))              the head's prediction of f_{j+1}
    q    = softmax(head(h_j))                 over `vocab_map` (q is 0 elsewhere: exact all the same)

Drafting feeds h_j back as the feature of the next position. The embedding is the target's (frozen).
"""
from __future__ import annotations

import torch
from torch import nn


def head_config(target_config, *, intermediate: int | None = None):
    """A one-layer Llama config with the target's width, heads and rotary settings."""
    from transformers import LlamaConfig
    d = target_config.to_dict()
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
            "rope_parameters", "rope_theta", "max_position_embeddings", "vocab_size", "hidden_act")
    cfg = LlamaConfig(**{k: d[k] for k in keep if k in d})
    cfg.num_hidden_layers = 1
    cfg.intermediate_size = intermediate or target_config.intermediate_size
    cfg.tie_word_embeddings = False
    return cfg


class EagleHead(nn.Module):
    def __init__(self, config, vocab_map: torch.Tensor):
        super().__init__()
        from transformers import LlamaModel
        self.config = config
        self.model = LlamaModel(config)    # embed_tokens (the frozen target embedding), 1 layer, a final norm:
                                           # its output is compared with the target's normed feature
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.register_buffer("vocab_map", vocab_map.long(), persistent=True)
        self.lm_head = nn.Linear(h, len(vocab_map), bias=False)

    @classmethod
    def from_target(cls, target, vocab_map: torch.Tensor, *, intermediate: int | None = None) -> "EagleHead":
        head = cls(head_config(target.config, intermediate=intermediate), vocab_map)
        with torch.no_grad():
            head.model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[vocab_map])
            head.model.norm.load_state_dict(target.model.norm.state_dict())
            eye = torch.eye(head.config.hidden_size)
            head.fc.weight.copy_(torch.cat([0.5 * eye, 0.5 * eye], 1))
            head.fc.bias.zero_()
        head.model.embed_tokens.weight.requires_grad_(False)
        return head

    def forward(self, input_ids, features, *, attention_mask=None, position_ids=None, cache=None):
        """input_ids [b, s] (t_{j+1}), features [b, s, h] (f_j) -> (logits over vocab_map [b, s, n], h [b, s, h])."""
        from .graph import cache_keyword
        dtype = self.fc.weight.dtype
        x = self.fc(torch.cat([self.model.embed_tokens(input_ids).to(dtype), features.to(dtype)], -1))
        out = self.model(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=cache is not None, **{cache_keyword(self.model): cache})
        h = out.last_hidden_state
        return self.lm_head(h), h


# -- a head as a folder, and its ONNX graph ----------------------------------------------------------
KIND = "specedge_eagle"      # config.json's model_type for a head folder
EMBEDDING = "model.embed_tokens.weight"


def save_head(head: EagleHead, folder, *, tokenizer_json: str, extra: dict | None = None) -> None:
    """A draft folder spec-export reads: config.json (model_type specedge_eagle), weights, tokenizer."""
    import json
    import os
    from pathlib import Path

    from safetensors.torch import save_file

    from specedge.runtime.files import write_atomic
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # the embedding is the target's own, frozen: export takes it from the target, the folder stays small
    state = {k: v.detach().contiguous().clone() for k, v in head.state_dict().items() if k != EMBEDDING}
    tmp = folder / "model.safetensors.tmp"        # each file whole or not at all: a folder may be overwritten
    save_file({k: (v.half() if v.is_floating_point() else v) for k, v in state.items()}, str(tmp),
              metadata={"format": "pt"})
    os.replace(tmp, folder / "model.safetensors")
    config = {"model_type": KIND, "architectures": ["EagleHead"], "draft_vocab": int(len(head.vocab_map)),
              "head": head.config.to_dict(), **(extra or {})}
    write_atomic(folder / "config.json", json.dumps(config, indent=2, sort_keys=True))
    write_atomic(folder / "tokenizer.json", tokenizer_json)


def load_head(folder, *, target=None, dtype=torch.float32) -> EagleHead:
    """A head folder as an EagleHead; its embedding comes from the `target` folder's weights."""
    import json
    from pathlib import Path

    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    if EMBEDDING not in state:
        for path in sorted(Path(target).glob("*.safetensors")) if target else ():
            with safe_open(str(path), "pt") as f:
                if EMBEDDING in f.keys():
                    state[EMBEDDING] = f.get_tensor(EMBEDDING)
                    break
        else:
            raise ValueError(f"{folder} takes its token embedding from the target, and none was found in {target}")
    head = EagleHead(LlamaConfig(**config["head"]), state["vocab_map"])
    head.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
    return head.to(dtype).eval()


class _Graph(nn.Module):
    """forward(input_ids, hidden_states, attention_mask, position_ids, past k, past v)
    -> (logits over the head's vocabulary, its hidden_states, present k, present v)."""

    def __init__(self, head: EagleHead):
        super().__init__()
        self.head = head

    def forward(self, input_ids, hidden_states, attention_mask, position_ids, past_key, past_value):
        from .graph import _flatten, make_cache
        cache = make_cache(self.head.model, (past_key, past_value))
        logits, h = self.head(input_ids, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                              cache=cache)
        return (logits.float(), h.float(), *_flatten(cache))


def export_head(head: EagleHead, path, *, opset: int = 20) -> None:
    """The head as an ONNX graph with the bundle's KV-cache contract, the target's features as input
    target_hidden_states [b, s, hidden] and its own prediction of the next as output hidden_states."""
    from torch.export import Dim

    from .graph import dynamo_export
    cfg = head.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    g = torch.Generator().manual_seed(0)
    b, s, past = 2, 3, 4
    args = (torch.randint(0, cfg.vocab_size, (b, s), generator=g), torch.randn(b, s, cfg.hidden_size, generator=g),
            torch.ones(b, past + s, dtype=torch.int64), torch.arange(past, past + s).expand(b, s).contiguous(),
            torch.randn(b, kv, past, hd, generator=g), torch.randn(b, kv, past, hd, generator=g))
    batch, seq = Dim("batch_size"), Dim("sequence_length")
    past_d, total = Dim("past_sequence_length"), Dim("total_sequence_length")
    kv_spec = {0: batch, 2: past_d}
    shapes = ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, kv_spec, kv_spec)
    names_in = ["input_ids", "target_hidden_states", "attention_mask", "position_ids", "past_key_values.0.key",
                "past_key_values.0.value"]
    names_out = ["logits", "hidden_states", "present.0.key", "present.0.value"]
    dynamo_export(_Graph(head), args, shapes=shapes, inputs=names_in, outputs=names_out, path=path, opset=opset)



def head_dims(folder) -> dict:
    """What the manifest records of a head folder, read from its config.json."""
    import json
    from pathlib import Path
    cfg = json.loads((Path(folder) / "config.json").read_text())["head"]
    heads = cfg["num_attention_heads"]
    return {"model_type": KIND, "num_layers": 1, "num_kv_heads": int(cfg["num_key_value_heads"]),
            "head_dim": int(cfg.get("head_dim") or cfg["hidden_size"] // heads), "vocab_size": int(cfg["vocab_size"]),
            "max_positions": int(cfg["max_position_embeddings"]), "hidden_size": int(cfg["hidden_size"])}


def parity(head: EagleHead, onnx_path, *, k: int, max_context: int, prompt_len: int = 7, seed: int = 0) -> dict:
    """ORT against PyTorch as the runtime runs the head: a prefill over real features, a one-step draft
    on its own prediction, a (k+1)-row catch-up, and a rollback (full-width logits on the head's ids)."""
    import numpy as np

    from specedge.engines.ort import OrtEngine
    from .graph import make_cache

    rng = np.random.default_rng(seed)
    cfg = head.config
    n = prompt_len + k + 2
    ids = rng.integers(0, cfg.vocab_size, size=n)
    feats = rng.standard_normal((n, cfg.hidden_size)).astype(np.float32)
    vmap = head.vocab_map.numpy()
    engine = OrtEngine(onnx_path, vocab_size=cfg.vocab_size, max_context=max_context)

    def ref(a: int, b: int, cache):
        with torch.no_grad():
            logits, h = head(torch.as_tensor(ids[a:b])[None], torch.as_tensor(feats[a:b])[None],
                             position_ids=torch.arange(a, b)[None], cache=cache)
        return logits[0].numpy(), h[0].numpy()

    def ours(a: int, b: int, keep=None):
        logits = engine.run(ids[a:b], keep=keep, inputs={"target_hidden_states": feats[None, a:b]})
        return logits[:, vmap], engine.features[a:b].copy()

    def diff(x, y):
        d = float(np.abs(x - y).max())
        return {"max_abs_diff": d, "max_rel_diff": d / max(float(np.abs(y).max()), 1e-12)}

    out = {}
    cache = make_cache(head.model, ())
    rl, rh = ref(0, prompt_len, cache)
    ol, oh = ours(0, prompt_len)
    out["prefill"] = diff(np.concatenate([ol.ravel(), oh.ravel()]), np.concatenate([rl.ravel(), rh.ravel()]))
    rl, rh = ref(prompt_len, prompt_len + 1, cache)
    ol, oh = ours(prompt_len, prompt_len + 1, keep=1)
    out["decode"] = diff(np.concatenate([ol.ravel(), oh.ravel()]), np.concatenate([rl.ravel(), rh.ravel()]))
    engine.truncate(prompt_len)
    fresh = make_cache(head.model, ())
    ref(0, prompt_len, fresh)
    rl, rh = ref(prompt_len, prompt_len + k + 1, fresh)
    ol, oh = ours(prompt_len, prompt_len + k + 1)
    out["verify"] = diff(np.concatenate([ol.ravel(), oh.ravel()]), np.concatenate([rl.ravel(), rh.ravel()]))
    engine.truncate(prompt_len + 2)
    ol, _ = ours(prompt_len + 2, prompt_len + 3)
    rl, _ = ref(0, prompt_len + 3, None)
    out["rollback"] = diff(ol[-1:], rl[-1:])
    full = engine.run(ids[:1], inputs={"target_hidden_states": feats[None, :1]})
    outside = np.setdiff1d(np.arange(cfg.vocab_size), vmap)
    if outside.size and not np.all(full[:, outside] <= -1e29):
        raise AssertionError("the head's logits outside its vocabulary are not the fill value")
    return out


def export_eagle_one(src, dst, *, k: int, max_context: int | None, weights: str = "fp32", target=None):
    """Export a head folder into dst/model.onnx; returns (dims, parity, inputs, outputs). The embedding
    table (one row read a step) is kept in fp16; `weights` int8 quantizes the layer and the LM head
    (MatMulNBits, 8 bits): parity is then measured against the fp32 head and reported, not bounded."""
    import numpy as np

    from .heads import add_logits_to_keep, add_vocab_map
    head = load_head(src, target=target)
    head.model.embed_tokens.half()
    dims = head_dims(src)
    context = min(dims["max_positions"], max_context or 4096)
    export_head(head, dst / "model.onnx")
    add_logits_to_keep(dst / "model.onnx")
    add_vocab_map(dst / "model.onnx", head.vocab_map.numpy().astype(np.int64), dims["vocab_size"])
    if weights == "int8":
        quantize_int8(dst / "model.onnx")
    result = parity(head, dst / "model.onnx", k=k, max_context=context)
    inputs = ["input_ids", "target_hidden_states", "attention_mask", "position_ids", "past_key_values.0.key",
              "past_key_values.0.value", "logits_to_keep"]
    outputs = ["logits", "hidden_states", "present.0.key", "present.0.value"]
    return {**dims, "max_context": context}, result, inputs, outputs


def quantize_int8(path) -> None:
    """MatMul weights -> MatMulNBits with 8-bit blocks of 32 (onnxruntime's quantizer), rewritten in place."""
    import os

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    logging_level = __import__("logging").getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    logging_level.setLevel("WARNING")
    q = MatMulNBitsQuantizer(onnx.load(str(path)), bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
    q.process()
    os.remove(f"{path}.data")
    q.model.save_model_to_file(str(path), use_external_data_format=True)
