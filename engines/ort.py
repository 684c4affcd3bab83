"""An exported graph run by ONNX Runtime (CPU, CUDA or TensorRT execution providers), batch 1."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .base import EngineError

PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}
_NP_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(
            "specedge needs ONNX Runtime: pip install 'specedge[cpu]' (CPU) or 'specedge[gpu]' (CUDA); "
            "on Jetson install NVIDIA's onnxruntime-gpu wheel for your JetPack") from e
    return onnxruntime


def resolve_providers(requested: list[str] | None) -> list[str]:
    """Map aliases to provider names, keep the available ones (warning on the rest), end with CPU."""
    ort = import_onnxruntime()
    available = set(ort.get_available_providers())
    names = [PROVIDER_ALIASES.get(p.lower(), p) for p in (requested or ["cpu"])]
    chosen = [n for n in names if n in available]
    dropped = [n for n in names if n not in available]
    if dropped:
        warnings.warn(f"execution providers {dropped} are not available in this onnxruntime build "
                      f"(available: {sorted(available)}); falling back to {chosen + ['CPUExecutionProvider']}",
                      stacklevel=3)
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


class OrtEngine:
    """One graph of the bundle contract in an InferenceSession, owning a batch-1 KV cache.

    The cache is the graph's own `present` outputs, fed back as the next `past`: the graph
    concatenates internally, so keeping them costs nothing extra. Rollback only moves `length`;
    the next run feeds a view truncated to it (copied once to make it contiguous).
    """

    def __init__(self, path: str | Path, *, vocab_size: int | None = None, max_context: int = 1 << 30,
                 providers: list[str] | None = None, threads: int = 0, optimize: bool = True):
        ort = import_onnxruntime()
        path = Path(path)
        if not path.is_file():
            raise EngineError(f"ONNX graph {path} does not exist; re-export the bundle with spec-export")
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                       else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        so.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), so, providers=resolve_providers(providers))
        except Exception as e:  # onnxruntime raises its own classes (InvalidProtobuf, Fail, ...)
            raise EngineError(f"ONNX Runtime cannot load {path}: {str(e).strip()[:300]} -- the file is "
                              f"corrupt or not a specedge graph; re-export the bundle with spec-export") from e
        inputs = {i.name: i for i in self.session.get_inputs()}
        outputs = [o.name for o in self.session.get_outputs()]
        layers = sorted(int(n.split(".")[1]) for n in inputs if n.startswith("past_key_values.")
                        and n.endswith(".key"))
        if "input_ids" not in inputs or "logits" not in outputs or not layers:
            raise EngineError(f"{path} does not follow the graph contract (input_ids, attention_mask, "
                              f"past_key_values.i.key|value -> logits, present.i.key|value); got inputs "
                              f"{sorted(inputs)[:6]}...; export it with spec-export")
        self.num_layers = len(layers)
        k0 = inputs["past_key_values.0.key"]
        self.num_kv_heads, self.head_dim = int(k0.shape[1]), int(k0.shape[3])
        self.dtype = _NP_DTYPES.get(k0.type)
        if self.dtype is None:
            raise EngineError(f"{path}: KV cache type {k0.type} is not supported (float32 or float16)")
        self.past_names = [f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")]
        self.output_names = ["logits"] + [f"present.{i}.{kv}" for i in layers for kv in ("key", "value")]
        missing = [n for n in self.output_names if n not in outputs]
        if missing:
            raise EngineError(f"{path} lacks outputs {missing[:4]}; re-export it with spec-export")
        self.has_position_ids = "position_ids" in inputs
        logits_dim = self.session.get_outputs()[outputs.index("logits")].shape[-1]
        self.vocab_size = int(vocab_size or logits_dim)
        self.max_context = int(max_context)
        self.providers = self.session.get_providers()
        self._ones = np.ones((1, 256), dtype=np.int64)
        self.reset()

    @property
    def length(self) -> int:
        return self._len

    def reset(self) -> None:
        empty = np.zeros((1, self.num_kv_heads, 0, self.head_dim), dtype=self.dtype)
        self._cache = [empty] * len(self.past_names)
        self._len = 0

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise EngineError(f"cannot truncate a cache of {self._len} tokens to {length}")
        self._len = length

    def run(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)         # [1, n]
        past, n = self._len, ids.shape[1]
        total = past + n
        if total > self.max_context:
            raise EngineError(f"context of {total} tokens exceeds the bundle's max context {self.max_context}")
        if self._ones.shape[1] < total:
            self._ones = np.ones((1, 2 * total), dtype=np.int64)
        cache = self._cache
        if cache[0].shape[2] != past:    # rolled back: feed the kept prefix
            cache = [np.ascontiguousarray(a[:, :, :past]) for a in cache]
        feed = dict(zip(self.past_names, cache))
        feed["input_ids"] = ids
        feed["attention_mask"] = self._ones[:, :total]
        if self.has_position_ids:
            feed["position_ids"] = np.arange(past, total, dtype=np.int64)[None]
        out = self.session.run(self.output_names, feed)
        self._cache = out[1:]            # [1, kv_heads, total, head_dim] each
        self._len = total
        return out[0][0, :, :self.vocab_size]                        # [n, vocab]
