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
_ONNX_ELEM = {np.float32: 1, np.float16: 10}
_DEVICE_PROVIDERS = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}
MAX_SHARED_CONTEXT = 1 << 20    # an in-place cache is allocated whole: refuse an unbounded max_context
MAX_BOUND_ROWS = 16             # logits of up to this many rows come back in buffers bound once (in place)


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
    the next run feeds the cache truncated to it (one contiguous copy of the kept prefix).

    Two ways to keep the presents (tools/bench_engine.py measures them):
    * CPU (default there): as the numpy arrays `session.run` returns. Those already wrap ORT's
      output buffers and numpy inputs are wrapped too, so nothing is copied except on rollback;
      IOBinding measured slower on CPU (up to 11 % on the demo target, 5-28 % on its draft:
      more Python calls per run, the same copies).
    * CUDA / TensorRT (default there, `io_binding=True` forces it): IOBinding with the presents
      bound to the session's device and fed back as OrtValues, so the cache never leaves the GPU;
      only the logits come to the host. A rollback slices the cache on the device with a tiny
      Slice graph run by the same provider.

    In place (`share_buffer=True`; graphs whose attention is GroupQueryAttention, i.e. those of
    onnxruntime-genai's builder): past and present are ONE preallocated buffer per tensor,
    [1, kv_heads, max_context, head_dim] on the cache's device, bound as both input and output.
    The graph writes the new positions' K/V into it and attends over the first `total` positions
    (the attention mask's length), so a step copies no cache and a rollback copies nothing: the
    stale tail is overwritten by the next run. Logits equal the concat path's bit for bit
    (tests); the demo target's decode step at 900 cached tokens took 1.88 ms instead of 2.45 ms.
    """

    def __init__(self, path: str | Path, *, vocab_size: int | None = None, max_context: int = 1 << 30,
                 providers: list[str] | None = None, threads: int = 0, optimize: bool = True,
                 io_binding: bool | None = None, share_buffer: bool = False, num_kv_heads: int | None = None,
                 head_dim: int | None = None):
        ort = import_onnxruntime()
        path = Path(path)
        if not path.is_file():
            raise EngineError(f"ONNX graph {path} does not exist; re-export the bundle with spec-export")
        so = _session_options(ort, threads)
        so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                       else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        try:
            self.session = ort.InferenceSession(str(path), so, providers=resolve_providers(providers))
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
        logits_dim = self.session.get_outputs()[outputs.index("logits")].shape[-1]
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
        if self.io_binding:
            self._ort, self._io = ort, self.session.io_binding()
        if self.io_binding and not self.share_buffer:
            self._slicer = _PrefixSlicer(ort, self.device, len(self.past_names),
                                         self.num_kv_heads, self.head_dim, self.dtype, threads)
        lt = self.session.get_outputs()[outputs.index("logits")]     # in place: logits into one host buffer
        self._logits = None                              # [1, MAX_BOUND_ROWS, vocab]; rows r bind its [:, :r] view
        if self.share_buffer and isinstance(lt.shape[-1], int) and lt.type == "tensor(float)":
            self._logits = np.empty((1, MAX_BOUND_ROWS, lt.shape[-1]), dtype=np.float32)
        self._views: dict[int, object] = {}              # rows -> OrtValue over that view, made once
        self._bound_rows = 0                             # the row count bound now (0: none)
        if self.share_buffer:
            self._bind_shared_cache()
        self._scratch = [np.empty(0, dtype=self.dtype)] * len(self.past_names)   # see _kept_prefix
        self.writes = 0
        self.reset()

    @property
    def length(self) -> int:
        return self._len

    def _bind_shared_cache(self) -> None:
        """One buffer per cache tensor, bound as past AND present once: runs only rebind the inputs."""
        device, device_id = self.device
        shape = [1, self.num_kv_heads, self.max_context, self.head_dim]
        io = self._io
        io.bind_output("logits", "cpu")     # first: get_outputs()[0] is the logits from now on
        for past, present in zip(self.past_names, self.output_names[1:]):
            buf = self._ort.OrtValue.ortvalue_from_shape_and_type(shape, self.dtype, device, device_id)
            io.bind_ortvalue_input(past, buf)
            io.bind_ortvalue_output(present, buf)

    def reset(self) -> None:
        self.writes += 1
        if self.share_buffer:       # stale positions are never read: the mask's length bounds attention
            self._len = 0
            return
        empty = np.zeros((1, self.num_kv_heads, 0, self.head_dim), dtype=self.dtype)
        if self.io_binding:       # a CPU OrtValue even for a GPU session: ORT moves the 0 bytes
            empty = self._empty = self._ort.OrtValue.ortvalue_from_numpy(empty)
        self._cache = [empty] * len(self.past_names)
        self._len = 0

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise EngineError(f"cannot truncate a cache of {self._len} tokens to {length}")
        self.writes += 1
        self._len = length

    def run(self, ids: np.ndarray, *, keep: int | None = None) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)         # [1, n]
        self.writes += 1            # first: a run that fails leaves the cache's content unknown
        past, n = self._len, ids.shape[1]
        keep = n if keep is None else max(1, min(int(keep), n))
        total = past + n
        if total > self.max_context:
            raise EngineError(f"context of {total} tokens exceeds the bundle's max context {self.max_context}")
        if self._ones.shape[1] < total:
            self._ones = np.ones((1, 2 * total), dtype=np.int64)
            self._positions = np.arange(2 * total, dtype=np.int64)[None]
        mask = self._ones[:, :total]
        extra = {}
        if self.has_position_ids:
            extra["position_ids"] = self._positions[:, past:total]
        if self.has_logits_to_keep:
            if keep not in self._keep:
                self._keep[keep] = np.array([keep], dtype=np.int64)
            extra["logits_to_keep"] = self._keep[keep]
        if self.share_buffer:
            logits = self._run_in_place(ids, mask, extra, total, keep if self.has_logits_to_keep else n)
        elif self.io_binding:
            logits = self._run_bound(ids, mask, extra, past)
        else:
            cache = self._cache
            if cache[0].shape[2] != past:    # rolled back: feed the kept prefix
                cache = self._kept_prefix(cache, past)
            feed = dict(zip(self.past_names, cache))
            feed["input_ids"] = ids
            feed["attention_mask"] = mask
            feed.update(extra)
            try:
                out = self.session.run(self.output_names, feed)
            except Exception as e:  # onnxruntime's own classes (Fail, RuntimeException: OOM, ...)
                raise self._failed(e, total) from e
            self._cache = out[1:]            # [1, kv_heads, total, head_dim] each
            logits = out[0]
        self._len = total
        return logits[0, -keep:, :self.vocab_size]                   # [keep, vocab]

    def _failed(self, e: Exception, total: int) -> EngineError:
        message = str(e)
        hint = (" -- the in-place KV cache (share_buffer) needs a graph whose attention is GroupQueryAttention "
                "(spec-export --builder genai)") if self.share_buffer and "GroupQueryAttention" not in message else ""
        return EngineError(f"ONNX Runtime failed running {self.num_layers}-layer graph at {total} tokens: "
                           f"{_brief(message)}{hint}")

    def _bind_new_inputs(self, ids, mask, extra: dict):
        io = self._io
        io.bind_cpu_input("input_ids", ids)  # ids, mask, extra stay referenced until the run ends
        io.bind_cpu_input("attention_mask", mask)
        for name, value in extra.items():
            io.bind_cpu_input(name, value)
        return io

    def _run_in_place(self, ids, mask, extra: dict, total: int, rows: int) -> np.ndarray:
        """Results of up to MAX_BOUND_ROWS rows (draft and decode steps, verifies) come back in one host
        buffer allocated at load, through an OrtValue per row count over its leading rows, so no output
        is wrapped per run (get_outputs() wraps all 2L+1): 9 us of a 0.14 ms draft step, 20-40 us of
        the demo target's verify. It is re-bound only when the row count changes. The caller gets a
        copy: a result must outlive the next run. Longer results (a prefill without logits_to_keep)
        are allocated per run."""
        io = self._bind_new_inputs(ids, mask, extra)
        bound = self._logits is not None and rows <= MAX_BOUND_ROWS
        if bound and self._bound_rows != rows:
            if rows not in self._views:      # [:, :rows] of a C-ordered [1, R, vocab] array is contiguous
                self._views[rows] = self._ort.OrtValue.ortvalue_from_numpy(self._logits[:, :rows])
            io.bind_ortvalue_output("logits", self._views[rows])
        elif not bound:
            io.bind_output("logits", "cpu")
        self._bound_rows = rows if bound else 0
        try:
            self.session.run_with_iobinding(io)
        except Exception as e:  # onnxruntime's own classes
            raise self._failed(e, total) from e
        return self._logits[:, :rows].copy() if bound else io.get_outputs()[0].numpy()

    def _kept_prefix(self, cache: list, past: int) -> list:
        """The first `past` positions of each cache tensor, copied into buffers reused across calls.
        Fresh 150 kB arrays cost page faults whenever the allocator maps new memory for them: 415 us
        against 43 us for the 12.6 M demo target's 12 tensors at 300 tokens (CPU time, microbenchmark)."""
        size = self.num_kv_heads * past * self.head_dim
        if self._scratch[0].size < size:
            self._scratch = [np.empty(2 * size, dtype=self.dtype) for _ in cache]
        kept = []
        for a, buf in zip(cache, self._scratch):
            view = buf[:size].reshape(1, self.num_kv_heads, past, self.head_dim)
            np.copyto(view, a[:, :, :past])
            kept.append(view)
        return kept

    def _run_bound(self, ids, mask, extra: dict, past: int) -> np.ndarray:
        """IOBinding run: pasts bound as OrtValues, presents allocated on the cache's device."""
        cache = self._cache
        if cache[0].shape()[2] != past:      # rolled back: slice the kept prefix where it lives
            cache = self._slicer(cache, past) if past else [self._empty] * len(cache)
        io, (device, device_id) = self._bind_new_inputs(ids, mask, extra), self.device
        for name, value in zip(self.past_names, cache):
            io.bind_ortvalue_input(name, value)
        io.bind_output("logits", "cpu")     # the logits go to the host anyway
        for name in self.output_names[1:]:  # re-bound every run: the shapes change
            io.bind_output(name, device, device_id)
        self.session.run_with_iobinding(io)
        out = io.get_outputs()
        self._cache = out[1:]
        return out[0].numpy()


def _session_options(ort, threads: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return so


def _kv_device(session) -> tuple[str, int]:
    """The device the session's outputs are produced on: ("cuda", id) for CUDA/TensorRT, else CPU."""
    first = session.get_providers()[0]
    if first in _DEVICE_PROVIDERS:
        opts = session.get_provider_options().get(first, {})
        return _DEVICE_PROVIDERS[first], int(opts.get("device_id", 0) or 0)
    return "cpu", 0


class _PrefixSlicer:
    """Cuts every cache tensor [1, heads, T, dim] to [1, heads, n, dim] where it lives.

    A graph of one Slice per tensor, built here without the onnx package and run on the cache's
    device (by the CUDA provider for a CUDA or TensorRT session) through IOBinding, so rolling
    back a GPU cache is one device-side copy of the kept prefix, with no host round trip.
    """

    def __init__(self, ort, device: tuple[str, int], count: int, heads: int, dim: int, dtype,
                 threads: int):
        providers = ["CPUExecutionProvider"]
        if device[0] == "cuda":
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": str(device[1])}))
        self.session = ort.InferenceSession(_slice_model(count, heads, dim, _ONNX_ELEM[dtype]),
                                            _session_options(ort, threads), providers=providers)
        self.io, self.device = self.session.io_binding(), device

    def __call__(self, values: list, n: int) -> list:
        io = self.io
        end = np.array([n], dtype=np.int64)
        io.bind_cpu_input("n", end)
        for i, v in enumerate(values):
            io.bind_ortvalue_input(f"x{i}", v)
            io.bind_output(f"y{i}", *self.device)
        self.session.run_with_iobinding(io)
        return io.get_outputs()


def _pb_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pb(field: int, value) -> bytes:
    """One protobuf field: an int as a varint, a str/bytes (or an encoded message) length-delimited."""
    if isinstance(value, int):
        return _pb_varint(field << 3) + _pb_varint(value)
    value = value.encode() if isinstance(value, str) else value
    return _pb_varint(field << 3 | 2) + _pb_varint(len(value)) + value


def _slice_model(count: int, heads: int, dim: int, elem: int) -> bytes:
    """ModelProto bytes: y_i = Slice(x_i, starts=[0], ends=n, axes=[2]) for i < count (opset 13)."""
    def tensor_info(name, elem_type, dims):
        shape = b"".join(_pb(1, _pb(2, d) if isinstance(d, str) else _pb(1, d)) for d in dims)
        return _pb(1, name) + _pb(2, _pb(1, _pb(1, elem_type) + _pb(2, shape)))

    def int64_const(name, value):
        return _pb(1, 1) + _pb(2, 7) + _pb(8, name) + _pb(9, np.array([value], np.int64).tobytes())

    graph = b"".join(_pb(1, _pb(1, f"x{i}") + _pb(1, "zero") + _pb(1, "n") + _pb(1, "axis")
                         + _pb(2, f"y{i}") + _pb(3, f"slice{i}") + _pb(4, "Slice")) for i in range(count))
    graph += _pb(2, "kv_prefix")
    graph += _pb(5, int64_const("zero", 0)) + _pb(5, int64_const("axis", 2))
    graph += b"".join(_pb(11, tensor_info(f"x{i}", elem, [1, heads, "total", dim])) for i in range(count))
    graph += _pb(11, tensor_info("n", 7, [1]))
    graph += b"".join(_pb(12, tensor_info(f"y{i}", elem, [1, heads, "kept", dim])) for i in range(count))
    return _pb(1, 8) + _pb(2, "specedge") + _pb(7, graph) + _pb(8, _pb(2, 13))
