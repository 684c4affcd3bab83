"""Just enough ONNX protobuf encoding to build the engines' helper graphs.

Written out by hand because the runtime must not need the `onnx` package (a build-time dependency:
tests/test_packaging.py holds engines/ to that).
"""
from __future__ import annotations

import numpy as np

ONNX_ELEM = {np.float32: 1, np.float16: 10}     # TensorProto.DataType of the cache dtypes the engines run


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


def slice_model(count: int, heads: int, dim: int, elem: int) -> bytes:
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
