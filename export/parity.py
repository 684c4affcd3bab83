"""Parity measured at export time: the ONNX graph, run by the runtime's own engine, against PyTorch.

Cases (batch 1, as the runtime runs them):
  prefill   P prompt tokens into an empty cache (all logits, and the last one alone: logits_to_keep)
  decode    1 token on top of the prefill (past P)
  verify    K+1 tokens on top of the prefill (past P)
  rollback  prefill -> verify K+1 -> truncate the cache to keep j of them -> decode 1 token,
            compared with a no-cache PyTorch forward over the committed sequence
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specedge.engines.ort import OrtEngine

from .graph import cache_keyword, make_cache


def _diff(ours: np.ndarray, ref: np.ndarray) -> dict:
    abs_diff = float(np.abs(ours - ref).max())
    return {"max_abs_diff": abs_diff, "max_rel_diff": abs_diff / max(float(np.abs(ref).max()), 1e-12)}


def measure(model, onnx_path: Path, *, vocab_size: int, k: int, num_kv_heads: int, head_dim: int,
            in_place: bool = False, max_context: int = 1 << 20, prompt_len: int = 7, seed: int = 0) -> dict:
    """Max logit differences per case, with the KV cache kept as the runtime will keep it (`in_place`:
    one buffer for past and present, see OrtEngine)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=prompt_len + k + 2)
    prompt, draft, nxt = ids[:prompt_len], ids[prompt_len:prompt_len + k + 1], ids[-1:]
    kw = cache_keyword(model)

    def torch_logits(tokens, past=None):
        with torch.no_grad():
            t = torch.as_tensor(np.asarray(tokens))[None]
            extra = {kw: past, "use_cache": True} if past is not None else {}
            start = past.get_seq_length() if past is not None else 0
            pos = torch.arange(start, start + t.shape[1])[None]
            out = model(input_ids=t, position_ids=pos, **extra)
            return out.logits[0].float().numpy()[:, :vocab_size]

    engine = OrtEngine(onnx_path, vocab_size=vocab_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       share_buffer=in_place, max_context=max_context)
    result = {}

    def fresh_cache():
        cache = make_cache(model, ())
        torch_logits(prompt, cache)
        return cache

    full = torch_logits(prompt)
    last = engine.run(prompt, keep=1)           # [1, vocab]: a graph with logits_to_keep slices before its head
    engine.truncate(0)
    result["prefill"] = _diff(np.concatenate([engine.run(prompt), last]), np.concatenate([full, full[-1:]]))
    result["decode"] = _diff(engine.run(draft[:1]), torch_logits(draft[:1], fresh_cache()))
    engine.truncate(prompt_len)
    result["verify"] = _diff(engine.run(draft), torch_logits(draft, fresh_cache()))
    keep = prompt_len + 1 + k // 2
    engine.truncate(keep)
    committed = np.concatenate([ids[:keep], nxt])
    result["rollback"] = _diff(engine.run(nxt), torch_logits(committed)[-1:])
    return result
