"""A bundle graph run as a TensorRT plan (built by `spec-export engine BUNDLE`), batch 1, behind the
engine interface, with its KV cache in device memory (cuda-python); no onnxruntime, no torch.

Plans come from graphs of standard ONNX ops (spec-export --builder torch: TensorRT has no
GroupQueryAttention), whose cache goes in as past [1, heads, L, dim] and comes out as present
[1, heads, L + n, dim]. Each cache tensor therefore has two device buffers taking turns: a run reads the
past from one and writes the present into the other. A rollback only moves `length`; the next run first
repacks the kept prefix into the other buffer (one strided device copy per tensor, `repack_copy`).

The plans and `record.json` (the TensorRT version and GPU they were built for) live in the bundle's
`tensorrt/` folder; a plan built elsewhere is refused (`check_record`): plans are specific to both.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

from specedge.runtime.errors import BundleError, EngineError
from specedge.runtime.files import inside

TRT_DIR = "tensorrt"
RECORD = "record.json"
TRT_EXTRA = "pip install 'specedge[trt]' (tensorrt and cuda-python; on a Jetson, JetPack's tensorrt)"


def gpu_name() -> str:
    """The first GPU's name (nvidia-smi), or "" where there is none."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=30)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def check_record(record: dict, *, tensorrt_version: str, gpu: str) -> None:
    """Refuse plans built by another TensorRT or on another GPU model: they will not load, or load wrong."""
    built_v, built_gpu = record.get("tensorrt_version"), record.get("gpu")
    if built_v != tensorrt_version:
        raise BundleError(f"the bundle's TensorRT plans were built by TensorRT {built_v}, this is {tensorrt_version}; "
                          f"rebuild them here with spec-export engine BUNDLE --overwrite")
    if built_gpu != gpu:
        raise BundleError(f"the bundle's TensorRT plans were built for {built_gpu!r}, this GPU is {gpu!r}; rebuild "
                          f"them here with spec-export engine BUNDLE --overwrite")


def read_record(bundle: Path, roles) -> tuple[dict, dict[str, tuple[Path, int]]]:
    """The bundle's TensorRT record (checked against this TensorRT and GPU by trt_engines) and, per role,
    its plan (a path inside the bundle) and the most new tokens its profile takes. BundleError naming the
    command that (re)builds the plans when there are none or the record is unusable."""
    path = bundle / TRT_DIR / RECORD
    if not path.is_file():
        raise BundleError(f"{bundle} has no TensorRT plans ({TRT_DIR}/{RECORD}); build them on this machine with "
                          f"spec-export engine {bundle}")
    rebuild = f"rebuild them with spec-export engine {bundle} --overwrite"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        plans = {}
        for role in roles:
            plan = record["plans"][role]
            if not inside(bundle, plan) or not (bundle / plan).is_file():
                raise BundleError(f"the TensorRT record's {role} plan {plan!r} is not a file inside the bundle; "
                                  f"{rebuild}")
            plans[role] = (bundle / plan, int(record["profiles"][role]["input_ids"][2][1]))
    except BundleError:
        raise
    except (ValueError, UnicodeDecodeError, KeyError, IndexError, TypeError) as e:
        raise BundleError(f"{path} is not a TensorRT record of this bundle's models ({type(e).__name__}: {e}); "
                          f"{rebuild}") from None
    return record, plans


def import_trt_runtime():
    """tensorrt and cuda-python's runtime API, or one EngineError naming the extra that brings them."""
    try:
        import tensorrt
    except ImportError as e:
        raise EngineError(f"running TensorRT plans needs TensorRT and an NVIDIA GPU: {TRT_EXTRA} ({e})") from None
    try:
        from cuda.bindings import runtime as cudart        # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart                        # older cuda-python
        except ImportError as e:
            raise EngineError(f"running TensorRT plans needs cuda-python for device memory: {TRT_EXTRA} "
                              f"({e})") from None
    return tensorrt, cudart


def repack_copy(*, heads: int, dim: int, itemsize: int, stored: int, length: int) -> dict[str, int]:
    """The strided copy (cudaMemcpy2D) that keeps the first `length` of `stored` positions of a packed
    [1, heads, stored, dim] tensor as a packed [1, heads, length, dim] one: `heads` rows of `width` bytes,
    read every `src_pitch` bytes and written every `dst_pitch`."""
    if not 0 <= length <= stored:
        raise EngineError(f"cannot keep {length} of {stored} cached positions")
    return {"width": length * dim * itemsize, "height": heads, "src_pitch": stored * dim * itemsize,
            "dst_pitch": length * dim * itemsize}


class TrtEngine:
    """One TensorRT plan of a bundle, owning a batch-1 KV cache on the GPU (see the module docstring)."""

    def __init__(self, plan: str | Path, *, vocab_size: int, max_context: int, max_new: int, device_id: int = 0):
        trt, self._cuda = import_trt_runtime()
        self.path, self.max_context, self.max_new = Path(plan), int(max_context), int(max_new)
        self._check(self._cuda.cudaSetDevice(device_id), "selecting the GPU")
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
        if self._engine is None:
            raise EngineError(f"TensorRT cannot load {self.path}; rebuild the plans with spec-export engine BUNDLE "
                              f"--overwrite")
        self._ctx = self._engine.create_execution_context()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._is_input = {n: self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self._host_input = {n for n in names if self._is_input[n] and self._engine.is_shape_inference_io(n)}
        self._dtype = {n: np.dtype(trt.nptype(self._engine.get_tensor_dtype(n))) for n in names}
        layers = sorted(int(n.split(".")[1]) for n in names if n.startswith("past_key_values.") and n.endswith(".key"))
        if "input_ids" not in names or "logits" not in names or not layers:
            raise EngineError(f"{self.path} is not a plan of a bundle graph (input_ids, past_key_values.i.key|value "
                              f"-> logits, present.i.key|value); rebuild it with spec-export engine BUNDLE --overwrite")
        self.num_layers = len(layers)
        self.past_names = [f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")]
        self.present_names = [f"present.{i}.{kv}" for i in layers for kv in ("key", "value")]
        shape = tuple(self._engine.get_tensor_shape(self.past_names[0]))
        self.num_kv_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.dtype = self._dtype[self.past_names[0]]
        self.vocab_size = int(vocab_size)
        self.hidden_size = (int(self._engine.get_tensor_shape("hidden_states")[-1])
                            if "hidden_states" in names else None)
        self.providers = ["TensorRT plan"]
        self._stream = self._call(self._cuda.cudaStreamCreate(), "creating a CUDA stream")
        kv_bytes = self.num_kv_heads * self.max_context * self.head_dim * self.dtype.itemsize
        self._kv = [(self._alloc(kv_bytes), self._alloc(kv_bytes)) for _ in self.past_names]
        self._cur = 0              # which buffer of each pair holds the cache
        self._stored = 0           # positions packed in those buffers (>= length after a rollback)
        rows = {"input_ids": self.max_new, "position_ids": self.max_new, "attention_mask": self.max_context,
                "target_hidden_states": self.max_new * (self._width("target_hidden_states") or 1),
                "logits": self.max_new * int(self._engine.get_tensor_shape("logits")[-1]),
                "hidden_states": self.max_new * (self.hidden_size or 1)}
        self._io = {n: self._alloc(rows.get(n, 1) * self._dtype[n].itemsize) for n in names
                    if n not in self._host_input and not n.startswith(("past_key_values.", "present."))}
        self._ones = np.ones((1, self.max_context), dtype=self._dtype.get("attention_mask", np.int64))
        self._positions = np.arange(self.max_context, dtype=np.int64)[None]   # position_ids are views of it
        self._keep = {k: np.array([k], dtype=np.int64) for k in range(1, self.max_new + 1)}
        self.features = np.empty((self.max_context, self.hidden_size or 0), dtype=np.float32)
        self._length, self.writes = 0, 0

    # -- the engine interface ------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        self.writes += 1
        self._length = 0

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise EngineError(f"cannot truncate a cache of {self._length} tokens to {length}")
        self.writes += 1
        self._length = length

    def run(self, ids: np.ndarray, *, keep: int | None = None, inputs: dict | None = None) -> np.ndarray:
        """Append `ids` and return the logits of the last `keep` (engines.base); `inputs`: further graph
        inputs (a hidden-state head's target_hidden_states)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        past, n = self._length, ids.shape[1]
        total, keep = past + n, n if keep is None else max(1, min(int(keep), n))
        if total > self.max_context:
            raise EngineError(f"context of {total} tokens exceeds the bundle's max context {self.max_context}")
        if n > self.max_new:
            raise EngineError(f"a call of {n} new tokens exceeds the plan's profile ({self.max_new}); use a "
                              f"prefill_chunk of at most {self.max_new}")
        self.writes += 1           # first: a run that fails leaves the cache's content unknown
        if self._stored != past:
            self._repack(past)
        feeds = {"input_ids": ids, "attention_mask": self._ones[:, :total],
                 "position_ids": self._positions[:, past:total], "logits_to_keep": self._keep[keep],
                 **(inputs or {})}
        held = []                  # host arrays TensorRT reads: alive until the stream is synchronized
        for name, value in feeds.items():
            if name not in self._is_input:
                continue
            arr = np.ascontiguousarray(value, dtype=self._dtype[name])
            held.append(arr)
            self._ctx.set_input_shape(name, arr.shape)
            if name in self._host_input:
                self._ctx.set_tensor_address(name, arr.ctypes.data)
            else:
                self._copy(self._io[name], arr.ctypes.data, arr.nbytes, "HostToDevice")
                self._ctx.set_tensor_address(name, self._io[name])
        src, dst = self._cur, 1 - self._cur
        for (past_name, present_name), pair in zip(zip(self.past_names, self.present_names), self._kv):
            self._ctx.set_input_shape(past_name, (1, self.num_kv_heads, past, self.head_dim))
            self._ctx.set_tensor_address(past_name, pair[src])
            self._ctx.set_tensor_address(present_name, pair[dst])
        for name in ("logits", "hidden_states"):
            if name in self._io:
                self._ctx.set_tensor_address(name, self._io[name])
        if not self._ctx.execute_async_v3(self._stream):
            raise EngineError(f"TensorRT failed running {self.path.name} at {total} tokens (see its log above)")
        rows, width = (int(d) for d in tuple(self._ctx.get_tensor_shape("logits"))[1:])
        logits = np.empty((rows, width), dtype=self._dtype["logits"])
        self._copy(logits.ctypes.data, self._io["logits"], logits.nbytes, "DeviceToHost")
        if self.hidden_size:
            hidden = np.empty((n, self.hidden_size), dtype=self._dtype["hidden_states"])
            self._copy(hidden.ctypes.data, self._io["hidden_states"], hidden.nbytes, "DeviceToHost")
        self._check(self._cuda.cudaStreamSynchronize(self._stream), "running the plan")
        del held
        if self.hidden_size:
            self.features[past:total] = hidden
        self._cur, self._stored, self._length = dst, total, total
        out = logits[-keep:, :self.vocab_size].astype(np.float32, copy=False)
        if not np.isfinite(out).all():
            raise EngineError(f"{self.path.name} produced non-finite logits at {total} tokens: its weights overflow "
                              f"in this precision; re-export the bundle (fp32) and rebuild the plans")
        return out

    def close(self) -> None:
        """Free the device buffers (also when the engine is collected)."""
        for ptr in [p for pair in getattr(self, "_kv", ()) for p in pair] + list(getattr(self, "_io", {}).values()):
            self._cuda.cudaFree(ptr)
        if getattr(self, "_stream", None) is not None:
            self._cuda.cudaStreamDestroy(self._stream)
        self._kv, self._io, self._stream = [], {}, None

    __del__ = close

    # -- device memory -------------------------------------------------------------------------------
    def _repack(self, length: int) -> None:
        """Keep the first `length` positions, packed, in the other buffer of each pair (after a rollback)."""
        if length:
            c = repack_copy(heads=self.num_kv_heads, dim=self.head_dim, itemsize=self.dtype.itemsize,
                            stored=self._stored, length=length)
            kind = self._cuda.cudaMemcpyKind.cudaMemcpyDeviceToDevice
            for pair in self._kv:
                self._check(self._cuda.cudaMemcpy2DAsync(pair[1 - self._cur], c["dst_pitch"], pair[self._cur],
                                                         c["src_pitch"], c["width"], c["height"], kind,
                                                         self._stream), "rolling the cache back")
            self._cur = 1 - self._cur
        self._stored = length

    def _width(self, name: str) -> int | None:
        if name not in self._is_input:
            return None
        return int(tuple(self._engine.get_tensor_shape(name))[-1])

    def _alloc(self, nbytes: int) -> int:
        return int(self._call(self._cuda.cudaMalloc(max(int(nbytes), 256)), f"allocating {nbytes} bytes on the GPU"))

    def _copy(self, dst: int, src: int, nbytes: int, kind: str) -> None:
        how = getattr(self._cuda.cudaMemcpyKind, f"cudaMemcpy{kind}")
        self._check(self._cuda.cudaMemcpyAsync(dst, src, nbytes, how, self._stream), f"copying {kind}")

    def _call(self, result, what: str):
        self._check(result[0], what)
        return result[1]

    def _check(self, result, what: str) -> None:
        """cuda-python returns (error, values...) from every call: anything but success is an EngineError."""
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            name = self._cuda.cudaGetErrorName(err)[1]
            raise EngineError(f"CUDA failed {what}: {name.decode() if isinstance(name, bytes) else name}")


def trt_engines(bundle: Path, manifest, roles) -> dict[str, TrtEngine]:
    """A TrtEngine per role from the bundle's plans, once the record matches this TensorRT and GPU."""
    record, plans = read_record(bundle, roles)
    trt, _ = import_trt_runtime()
    check_record(record, tensorrt_version=trt.__version__, gpu=gpu_name())
    return {role: TrtEngine(plan, vocab_size=manifest.vocab_size, max_context=manifest.max_context, max_new=max_new)
            for role, (plan, max_new) in plans.items()}
