"""An exported graph run by ONNX Runtime (CPU, CUDA or TensorRT execution providers), batch 1."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .base import EngineError
from .kv_cache import MAX_BOUND_ROWS, ConcatCache, DeviceCache, InPlaceCache  # noqa: F401 (re-exported)

PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}
_NP_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_DEVICE_PROVIDERS = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}
MAX_SHARED_CONTEXT = 1 << 20    # an in-place cache is allocated whole: refuse an unbounded max_context


def _brief(message: str) -> str:
    """onnxruntime's message on one line, both ends kept: the cause comes last, after a C++ signature."""
    message = " ".join(message.split())
    return message if len(message) <= 400 else f"{message[:150]} ... {message[-250:]}"


def load_error(path, message: str, version: str) -> str:
    """What went wrong loading a graph, and the fix. onnxruntime puts the cause at the END of a long
    message (after a C++ signature), so both ends are kept."""
    brief = _brief(message)
    if "ValidateOpsetForDomain" in message or "opset" in message.lower() and "support" in message.lower():
        why = (f"the graph's ONNX opset is newer than onnxruntime {version} supports: upgrade onnxruntime, "
               f"or re-export with spec-export --builder torch --opset 20 (the portable default)")
    elif "GroupQueryAttention" in message and ("input size" in message or "not in range" in message):
        why = (f"the graph comes from a newer onnxruntime-genai builder than onnxruntime {version} can run "
               f"(onnxruntime-genai 0.18's graphs need onnxruntime >= 1.23): upgrade "
               f"onnxruntime, or re-export with spec-export --builder torch")
    else:
        why = ("the file is corrupt, not a specedge graph, or needs a newer onnxruntime; re-export the bundle "
               "with spec-export (--builder torch --opset 20 for older onnxruntime builds)")
    return f"ONNX Runtime {version} cannot load {path}: {brief} -- {why}"


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(
            "specedge needs ONNX Runtime: pip install 'specedge[cpu]' (CPU) or 'specedge[gpu]' (CUDA); "
            "on Jetson install NVIDIA's onnxruntime-gpu wheel for your JetPack") from e
    return onnxruntime


def resolve_providers(requested: list[str] | None) -> list[str]:
    """Map aliases to provider names, keep the available ones, end with CPU (which runs any node the
    others lack). Fallback rule: a requested provider this onnxruntime build lacks is an EngineError,
    unless the request also lists the CPU (["cuda", "cpu"]: run where you can), where it is dropped with
    one warning."""
    ort = import_onnxruntime()
    available = set(ort.get_available_providers())
    names = [PROVIDER_ALIASES.get(p.strip().lower(), p.strip()) for p in (requested or ["cpu"])]
    known = set(PROVIDER_ALIASES.values()) | set(ort.get_all_providers())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise EngineError(f"unknown execution provider {unknown[0]!r}; use {', '.join(PROVIDER_ALIASES)} (or an "
                          f"onnxruntime provider name)")
    chosen = list(dict.fromkeys(n for n in names if n in available))
    dropped = [n for n in names if n not in available]
    if dropped and "CPUExecutionProvider" not in names:
        raise EngineError(f"execution providers {dropped} are not available in this onnxruntime build (available: "
                          f"{sorted(available)}); install onnxruntime-gpu (pip install 'specedge[gpu]', on a Jetson "
                          f"NVIDIA's wheel for your JetPack), or list cpu after them (e.g. cuda,cpu) to fall back "
                          f"to the CPU")
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    if dropped:
        warnings.warn(f"execution providers {dropped} are not available in this onnxruntime build "
                      f"(available: {sorted(available)}); falling back to {chosen}", stacklevel=3)
    return chosen


class OrtEngine:
    """One graph of the bundle contract in an InferenceSession, owning a batch-1 KV cache.

    The cache is one of three strategies (engines/kv_cache.py), chosen here once:
    * ConcatCache (CPU default): the graph's `present` outputs, fed back as the next `past`.
    * DeviceCache (CUDA / TensorRT default, `io_binding=True` forces it): the same through IOBinding,
      the presents kept on the session's device; a rollback slices them there.
    * InPlaceCache (`share_buffer=True`, for GroupQueryAttention graphs, i.e. those of
      onnxruntime-genai's builder): one preallocated buffer per tensor, bound as past and present.
    A rollback (`truncate`) only moves `length`; the cache does any work it needs on the next run.
    """

    def __init__(self, path: str | Path, *, vocab_size: int | None = None, max_context: int = 1 << 30,
                 providers: list[str] | None = None, threads: int = 0, optimize: bool = True,
                 io_binding: bool | None = None, share_buffer: bool = False, num_kv_heads: int | None = None,
                 head_dim: int | None = None, profile_prefix: str | None = None):
        ort = import_onnxruntime()
        path = self.path = Path(path)
        if not path.is_file():
            raise EngineError(f"ONNX graph {path} does not exist; re-export the bundle with spec-export")
        try:
            self.session = ort.InferenceSession(str(path), _session_options(ort, threads, optimize, profile_prefix),
                                                providers=resolve_providers(providers))
        except Exception as e:  # onnxruntime raises its own classes (InvalidProtobuf, Fail, ...)
            raise EngineError(load_error(path, str(e), ort.__version__)) from e
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
        # onnxruntime-genai graphs leave head_dim symbolic ('kv_cache_dim'): the manifest supplies it
        dims = [d if isinstance(d, int) else None for d in (k0.shape[1], k0.shape[3])]
        self.num_kv_heads, self.head_dim = dims[0] or num_kv_heads, dims[1] or head_dim
        if not (self.num_kv_heads and self.head_dim):
            raise EngineError(f"{path}: the KV cache's heads / head_dim are symbolic {k0.shape}; pass "
                              f"num_kv_heads= and head_dim= (a bundle's manifest holds them)")
        self.dtype = _NP_DTYPES.get(k0.type)
        if self.dtype is None:
            raise EngineError(f"{path}: KV cache type {k0.type} is not supported (float32 or float16)")
        self.past_names = [f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")]
        self.output_names = ["logits"] + [f"present.{i}.{kv}" for i in layers for kv in ("key", "value")]
        missing = [n for n in self.output_names if n not in outputs]
        if missing:
            raise EngineError(f"{path} lacks outputs {missing[:4]}; re-export it with spec-export")
        self.has_position_ids = "position_ids" in inputs
        self.has_logits_to_keep = "logits_to_keep" in inputs    # see specedge.export.heads
        # graphs that also return their final hidden states (a hidden-state draft head reads the target's,
        # and returns its own prediction): kept per position in `features`, valid up to `length`
        hidden = next((o for o in self.session.get_outputs() if o.name == "hidden_states"), None)
        self.hidden_size = hidden.shape[-1] if hidden is not None and isinstance(hidden.shape[-1], int) else None
        if hidden is not None and self.hidden_size is None:
            raise EngineError(f"{path}: its hidden_states output has no fixed width; re-export the bundle")
        self.features = np.empty((0, self.hidden_size or 0), dtype=np.float32)
        logits = self.session.get_outputs()[outputs.index("logits")]
        logits_dim = logits.shape[-1]
        self.vocab_size = int(vocab_size or logits_dim)
        if isinstance(logits_dim, int) and logits_dim < self.vocab_size:
            raise EngineError(f"{path}: logits have {logits_dim} entries, fewer than the vocab of "
                              f"{self.vocab_size}; re-export the bundle")
        self.max_context = int(max_context)
        self.providers = self.session.get_providers()
        self._ones = np.ones((1, 256), dtype=np.int64)
        self._positions = np.arange(256, dtype=np.int64)[None]    # position_ids are views of it
        self._keep: dict[int, np.ndarray] = {}      # logits_to_keep values, made once: no allocation per step
        self.device = _kv_device(self.session)              # where the cache lives: ("cuda", 0), ...
        self.share_buffer = bool(share_buffer)
        if self.share_buffer and self.max_context > MAX_SHARED_CONTEXT:
            raise EngineError(f"an in-place KV cache is preallocated for max_context tokens; pass max_context= "
                              f"(the bundle's manifest holds it), not {self.max_context}")
        self.io_binding = self.share_buffer or (self.device[0] != "cpu" if io_binding is None else bool(io_binding))
        layout = (self.session, self.past_names, self.output_names[1:], self.num_kv_heads, self.head_dim, self.dtype)
        if self.share_buffer:
            width = logits_dim if isinstance(logits_dim, int) and logits.type == "tensor(float)" else None
            self._kv = InPlaceCache(*layout, ort=ort, device=self.device, max_context=self.max_context,
                                    logits_width=width)
        elif self.io_binding:
            self._kv = DeviceCache(*layout, ort=ort, device=self.device,
                                   slicer_options=_session_options(ort, threads))
        else:
            self._kv = ConcatCache(*layout)
        self.writes = 0
        self.reset()

    @property
    def length(self) -> int:
        return self._kv.length

    def reset(self) -> None:
        self.writes += 1
        self._kv.reset()

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._kv.length:
            raise EngineError(f"cannot truncate a cache of {self._kv.length} tokens to {length}")
        self.writes += 1
        self._kv.rewind(length)

    def run(self, ids: np.ndarray, *, keep: int | None = None, inputs: dict | None = None) -> np.ndarray:
        """Append `ids` and return the logits of the last `keep` (module docstring of engines.base).
        `inputs`: further graph inputs, e.g. hidden_states [1, n, hidden] for a hidden-state draft head."""
        extra_inputs = inputs
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)         # [1, n]
        self.writes += 1            # first: a run that fails leaves the cache's content unknown
        past, n = self._kv.length, ids.shape[1]
        keep = n if keep is None else max(1, min(int(keep), n))
        total = past + n
        if total > self.max_context:
            raise EngineError(f"context of {total} tokens exceeds the bundle's max context {self.max_context}")
        if self._ones.shape[1] < total:
            self._ones = np.ones((1, 2 * total), dtype=np.int64)
            self._positions = np.arange(2 * total, dtype=np.int64)[None]
        inputs = {"input_ids": ids, "attention_mask": self._ones[:, :total]}
        if self.has_position_ids:
            inputs["position_ids"] = self._positions[:, past:total]
        if self.has_logits_to_keep:
            if keep not in self._keep:
                self._keep[keep] = np.array([keep], dtype=np.int64)
            inputs["logits_to_keep"] = self._keep[keep]
        if extra_inputs:
            inputs.update(extra_inputs)
        into = None
        if self.hidden_size:
            if len(self.features) < total:     # grows by doubling, within max_context
                grown = np.empty((min(self.max_context, max(2 * total, 64)), self.hidden_size), np.float32)
                grown[:past] = self.features[:past]
                self.features = grown
            into = {"hidden_states": self.features[None, past:total]}
        try:
            logits = self._kv.run(inputs, total, keep if self.has_logits_to_keep else n, into)
        except Exception as e:  # onnxruntime's own classes (Fail, RuntimeException: OOM, ...)
            raise self._failed(e, total) from e
        out = logits[0, -keep:, :self.vocab_size]                    # [keep, vocab]
        # corrupt weights or an fp16 overflow: never sample from NaN. The sum is finite for any finite row (a
        # head's fill value included) and costs no allocation; only a non-finite sum is checked element-wise.
        if not np.isfinite(out.sum()) and not np.isfinite(out).all():
            raise EngineError(f"{self.path.name} produced non-finite logits at {total} tokens: its weights are "
                              f"corrupt or overflow in this precision; re-export the bundle (fp32)")
        return out

    def _failed(self, e: Exception, total: int) -> EngineError:
        message = str(e)
        hint = (" -- the in-place KV cache (share_buffer) needs a graph whose attention is GroupQueryAttention "
                "(spec-export --builder genai)") if self.share_buffer and "GroupQueryAttention" not in message else ""
        return EngineError(f"ONNX Runtime failed running {self.num_layers}-layer graph at {total} tokens: "
                           f"{_brief(message)}{hint}")


def _session_options(ort, threads: int, optimize: bool = True, profile_prefix: str | None = None):
    """Every session the engines make (graphs and helper graphs) is configured here."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.log_severity_level = 3
    if profile_prefix:              # onnxruntime's per-node profiler (tools/lab/profile_step.py)
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def _kv_device(session) -> tuple[str, int]:
    """The device the session's outputs are produced on: ("cuda", id) for CUDA/TensorRT, else CPU."""
    first = session.get_providers()[0]
    if first in _DEVICE_PROVIDERS:
        opts = session.get_provider_options().get(first, {})
        return _DEVICE_PROVIDERS[first], int(opts.get("device_id", 0) or 0)
    return "cpu", 0
