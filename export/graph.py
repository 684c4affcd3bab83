"""torch model -> ONNX graph with explicit KV-cache I/O and dynamic new-token and past lengths.

One graph serves prefill (past 0), 1-token decode and (K+1)-token verification. The wrapper turns
flat past tensors into a transformers `DynamicCache` and the returned cache back into flat tensors;
`torch.onnx.export(dynamo=True)` traces it with explicit `Dim`s.
"""
from __future__ import annotations

import inspect
import logging
import warnings
from pathlib import Path

import torch

from specedge.runtime.manifest import io_names


def cache_keyword(model) -> str:
    # transformers 5 renamed `past_key_values=` to `cache=`; 4.x only knows the former.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _flatten(cache) -> list[torch.Tensor]:
    if hasattr(cache, "layers"):          # transformers >= 4.56: per-layer objects
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t for i in range(len(cache.key_cache)) for t in (cache.key_cache[i], cache.value_cache[i])]


def make_cache(model, past: tuple[torch.Tensor, ...]):
    from transformers import DynamicCache
    pairs = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
    try:
        return DynamicCache(ddp_cache_data=pairs, config=model.config)
    except TypeError:                     # transformers 4.x
        return DynamicCache.from_legacy_cache(tuple(pairs))


class KVWrapper(torch.nn.Module):
    """forward(input_ids, attention_mask, position_ids, *past) -> (logits fp32, *present)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.cache_kw = cache_keyword(model)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, **{self.cache_kw: make_cache(self.model, past)})
        cache = out.get("cache", None) or out.get("past_key_values")
        return (out.logits.float(), *_flatten(cache))


def example_inputs(dims: dict, *, batch: int = 2, seq: int = 3, past: int = 4, dtype=torch.float32):
    """Trace inputs. seq >= 2 and past >= 1: at seq 1 sdpa specialises and the dim is frozen."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, dims["vocab_size"], (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq).expand(batch, seq).contiguous()
    kv = (batch, dims["num_kv_heads"], past, dims["head_dim"])
    cache = tuple(torch.randn(*kv, generator=g).to(dtype) for _ in range(2 * dims["num_layers"]))
    return (ids, mask, pos, *cache)


DEFAULT_OPSET = 20
OPSETS = (18, 19, 20, 21, 22, 23)


def export_onnx(model, dims: dict, path: Path, *, opset: int = DEFAULT_OPSET) -> None:
    """Write `path` (+ `path`.data external weights) following the manifest's graph contract.

    Opset 23 turns RMSNorm, rotary embedding and attention into single ONNX ops (RMSNormalization,
    RotaryEmbedding, Attention): about half the nodes, which is most of a small draft's cost on CPU.
    It needs onnxruntime >= 1.22; the portable default (20) runs on older builds (Jetson, TensorRT).
    """
    from torch.export import Dim

    batch, seq = Dim("batch_size"), Dim("sequence_length")
    past, total = Dim("past_sequence_length"), Dim("total_sequence_length")
    kv_spec = {0: batch, 2: past}
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
              tuple(kv_spec for _ in range(2 * dims["num_layers"])))
    inputs, outputs = io_names(dims["num_layers"])
    args = example_inputs(dims, dtype=next(model.parameters()).dtype)
    dynamo_export(KVWrapper(model), args, shapes=shapes, inputs=inputs, outputs=outputs, path=path, opset=opset)


def dynamo_export(module, args, *, shapes, inputs: list[str], outputs: list[str], path: Path, opset: int) -> None:
    """torch.onnx.export(dynamo=True) of `module` on `args` with these dynamic shapes and I/O names,
    saved with external weights."""
    # the exporter's warnings (torchvision absent, deprecations) say nothing about this graph
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, dynamic_shapes=shapes, input_names=inputs, output_names=outputs,
                                    dynamo=True, optimize=True, opset_version=opset, external_data=True,
                                    verbose=False)
    program.save(str(path), external_data=True)
