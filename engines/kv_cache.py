"""The batch-1 KV cache of an OrtEngine: three strategies behind one small interface, as
onnxruntime-genai's KeyValueCache (Add / Update / RewindTo).

The engine builds a run's other inputs (ids, attention mask, positions, logits_to_keep) and hands them
to its cache, which feeds its pasts, runs the session, keeps the presents and returns the logits:

  ConcatCache   the graph's `present` outputs, as numpy arrays, fed back as the next `past` (CPU default)
  DeviceCache   the same through IOBinding, the presents kept on the session's device (CUDA / TensorRT)
  InPlaceCache  one preallocated buffer per tensor bound as both past and present (GroupQueryAttention)

A rollback only moves `length` in all three: the next run feeds the kept prefix (or, in place, masks the
stale tail), so rollbacks in a row cost nothing and a reset-after-rollback copies nothing.
"""
from __future__ import annotations

import numpy as np

from .onnx_proto import ONNX_ELEM, slice_model

MAX_BOUND_ROWS = 16     # in place: logits of up to this many rows come back in one buffer bound at load


class KVCache:
    """What an OrtEngine needs of its cache. `length` is the number of positions it holds."""

    def __init__(self, session, past_names: list[str], present_names: list[str], heads: int, dim: int, dtype):
        self.session, self.past_names, self.present_names = session, past_names, present_names
        self.heads, self.dim, self.dtype = heads, dim, dtype
        self.length = 0

    def reset(self) -> None:
        """Drop every position."""
        self.length = 0

    def rewind(self, length: int) -> None:
        """Keep the first `length` positions (0 <= length <= self.length: the engine checks). The next
        run does the work, if any."""
        self.length = length

    def run(self, inputs: dict[str, np.ndarray], total: int, rows: int,
            into: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Run the graph on `inputs` (input_ids [1, n], attention_mask [1, total], optional position_ids
        and logits_to_keep) on top of the cached positions and keep the new ones (length becomes
        `total`). Returns the logits [1, rows, vocab], `rows` being what the graph returns (n, or
        logits_to_keep), in an array the next run does not overwrite. `inputs` may be extended.
        `into`: other outputs (e.g. hidden_states) written into the given host arrays."""
        raise NotImplementedError

    def _empty_array(self) -> np.ndarray:
        return np.zeros((1, self.heads, 0, self.dim), dtype=self.dtype)


def _bind_inputs(io, inputs: dict[str, np.ndarray]):
    for name, value in inputs.items():  # the caller keeps `inputs` referenced until the run ends
        io.bind_cpu_input(name, value)
    return io


class ConcatCache(KVCache):
    """The presents as the numpy arrays `session.run` returns, fed back as the next pasts: the graph
    concatenates internally, and numpy arrays in and out are wrapped, not copied, so only a rollback
    copies (the kept prefix). The CPU default: IOBinding costs more Python calls there for the same copies."""

    def __init__(self, session, past_names, present_names, heads, dim, dtype):
        super().__init__(session, past_names, present_names, heads, dim, dtype)
        self._outputs = ["logits", *present_names]
        self._scratch = [np.empty(0, dtype=dtype)] * len(past_names)   # see _kept_prefix
        self.reset()

    def reset(self) -> None:
        self._past = [self._empty_array()] * len(self.past_names)     # also frees the last run's presents
        self.length = 0

    def run(self, inputs, total, rows, into=None):
        past = self._past
        if past[0].shape[2] != self.length:     # rolled back: feed the kept prefix
            past = self._kept_prefix(past, self.length)
        inputs.update(zip(self.past_names, past))
        extra = list(into or ())
        out = self.session.run(self._outputs + extra, inputs)
        for name, value in zip(extra, out[len(self._outputs):]):
            np.copyto(into[name], value)
        self._past = out[1:len(self._outputs)]  # [1, heads, total, dim] each
        self.length = total
        return out[0]

    def _kept_prefix(self, cache: list, past: int) -> list:
        """The first `past` positions of each tensor, copied into buffers reused across calls: fresh
        arrays of this size cost page faults whenever the allocator maps new memory for them."""
        size = self.heads * past * self.dim
        if self._scratch[0].size < size:
            self._scratch = [np.empty(2 * size, dtype=self.dtype) for _ in cache]
        kept = []
        for a, buf in zip(cache, self._scratch):
            view = buf[:size].reshape(1, self.heads, past, self.dim)
            np.copyto(view, a[:, :, :past])
            kept.append(view)
        return kept


class DeviceCache(KVCache):
    """IOBinding with the presents bound on the session's device and fed back as OrtValues, so the
    cache never leaves the GPU; only the logits come to the host. A rollback slices the cache on the
    device (_PrefixSlicer). The default on CUDA / TensorRT; `io_binding=True` forces it on CPU."""

    def __init__(self, session, past_names, present_names, heads, dim, dtype, *, ort, device: tuple[str, int],
                 slicer_options):
        super().__init__(session, past_names, present_names, heads, dim, dtype)
        self._ort, self.device, self._io = ort, device, session.io_binding()
        self._slicer = _PrefixSlicer(ort, device, len(past_names), heads, dim, dtype, slicer_options)
        self.reset()

    def reset(self) -> None:
        # a CPU OrtValue even for a GPU session: ORT moves the 0 bytes
        self._empty = self._ort.OrtValue.ortvalue_from_numpy(self._empty_array())
        self._past = [self._empty] * len(self.past_names)
        self.length = 0

    def run(self, inputs, total, rows, into=None):
        past, kept = self._past, self.length
        if past[0].shape()[2] != kept:      # rolled back: slice the kept prefix where it lives
            past = self._slicer(past, kept) if kept else [self._empty] * len(past)
        io = _bind_inputs(self._io, inputs)
        for name, value in zip(self.past_names, past):
            io.bind_ortvalue_input(name, value)
        io.bind_output("logits", "cpu")     # the logits go to the host anyway
        for name in self.present_names:     # re-bound every run: the shapes change
            io.bind_output(name, *self.device)
        for name, dest in (into or {}).items():
            io.bind_ortvalue_output(name, self._ort.OrtValue.ortvalue_from_numpy(dest))
        self.session.run_with_iobinding(io)
        out = io.get_outputs()
        self._past = out[1:1 + len(self.present_names)]
        self.length = total
        return out[0].numpy()


class InPlaceCache(KVCache):
    """Past and present are ONE preallocated buffer per tensor, [1, heads, max_context, dim] on the
    session's device, bound as both input and output once. The graph (GroupQueryAttention, as
    onnxruntime-genai's builder makes) writes the new positions into it and attends over the first
    `total` (the attention mask's length), so a step copies no cache and a rollback copies nothing:
    the stale tail is overwritten by the next run. Logits equal ConcatCache's bit for bit (tests).

    Logits of up to MAX_BOUND_ROWS rows (draft and decode steps, verifies) come back in one host buffer
    allocated here, through an OrtValue per row count over its leading rows, re-bound only when the row
    count changes: no output is wrapped per run (get_outputs() would wrap all of them). Longer results
    (a prefill without logits_to_keep) are allocated per run, as are all of them when `logits_width`
    is None (the graph's logits are not float32 of a fixed width)."""

    def __init__(self, session, past_names, present_names, heads, dim, dtype, *, ort, device: tuple[str, int],
                 max_context: int, logits_width: int | None):
        super().__init__(session, past_names, present_names, heads, dim, dtype)
        self._ort, self._io = ort, session.io_binding()
        self._logits = None if logits_width is None else np.empty((1, MAX_BOUND_ROWS, logits_width), np.float32)
        self._views: dict[int, object] = {}      # rows -> OrtValue over self._logits[:, :rows], made once
        self._bound_rows = 0                     # the row count bound now (0: none)
        io, shape = self._io, [1, heads, max_context, dim]
        io.bind_output("logits", "cpu")     # first: get_outputs()[0] is the logits from now on
        for past, present in zip(past_names, present_names):
            buf = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, *device)
            io.bind_ortvalue_input(past, buf)
            io.bind_ortvalue_output(present, buf)

    # reset / rewind: only `length` moves; positions past the mask's length are never read

    def run(self, inputs, total, rows, into=None):
        io = _bind_inputs(self._io, inputs)
        for name, dest in (into or {}).items():     # host arrays the graph writes into directly
            io.bind_ortvalue_output(name, self._ort.OrtValue.ortvalue_from_numpy(dest))
        bound = self._logits is not None and rows <= MAX_BOUND_ROWS
        if bound and self._bound_rows != rows:
            if rows not in self._views:      # [:, :rows] of a C-ordered [1, R, vocab] array is contiguous
                self._views[rows] = self._ort.OrtValue.ortvalue_from_numpy(self._logits[:, :rows])
            io.bind_ortvalue_output("logits", self._views[rows])
        elif not bound:
            io.bind_output("logits", "cpu")
        self._bound_rows = rows if bound else 0
        self.session.run_with_iobinding(io)
        self.length = total
        return self._logits[:, :rows].copy() if bound else io.get_outputs()[0].numpy()


class _PrefixSlicer:
    """Cuts every cache tensor [1, heads, T, dim] to [1, heads, n, dim] where it lives.

    A graph of one Slice per tensor (onnx_proto.slice_model) run on the cache's device (by the CUDA
    provider for a CUDA or TensorRT session) through IOBinding, so rolling back a GPU cache is one
    device-side copy of the kept prefix, with no host round trip.
    """

    def __init__(self, ort, device: tuple[str, int], count: int, heads: int, dim: int, dtype, options):
        providers = ["CPUExecutionProvider"]
        if device[0] == "cuda":
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": str(device[1])}))
        self.session = ort.InferenceSession(slice_model(count, heads, dim, ONNX_ELEM[dtype]), options,
                                            providers=providers)
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
