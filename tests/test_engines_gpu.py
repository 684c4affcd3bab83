"""GPU engines, CPU side: the provider fallback rule, and the TensorRT engine's bundle checks, its
missing-library message and its rollback copy (emulated with numpy: no GPU here)."""
from __future__ import annotations

import importlib.util
import json
import warnings

import numpy as np
import pytest

from specedge.engines import resolve_providers
from specedge.engines.tensorrt import TRT_DIR, read_record, repack_copy
from specedge.runtime.errors import BundleError, ConfigError, EngineError

CUDA_HERE = "CUDAExecutionProvider" in __import__("onnxruntime").get_available_providers()


@pytest.mark.skipif(CUDA_HERE, reason="this onnxruntime has CUDA")
def test_a_missing_provider_is_an_error_unless_cpu_is_listed_too():
    with pytest.raises(EngineError, match=r"not available .* install onnxruntime-gpu .* cuda,cpu"):
        resolve_providers(["cuda"])
    with pytest.warns(UserWarning, match="falling back") as caught:
        assert resolve_providers(["cuda", "cpu"]) == ["CPUExecutionProvider"]
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_providers(["cpu"]) == resolve_providers(None) == ["CPUExecutionProvider"]
    with pytest.raises(EngineError, match="unknown execution provider 'rocm'"):
        resolve_providers(["rocm", "cpu"])


@pytest.mark.parametrize("stored,length", [(7, 7), (7, 3), (5, 0), (1, 1)])
def test_the_rollback_copy_keeps_the_packed_prefix(stored, length):
    heads, dim = 3, 4
    cache = np.arange(heads * stored * dim, dtype=np.float16).reshape(1, heads, stored, dim)
    c = repack_copy(heads=heads, dim=dim, itemsize=2, stored=stored, length=length)
    src, dst = cache.tobytes(), bytearray(heads * length * dim * 2)
    for row in range(c["height"]):          # what cudaMemcpy2D does
        dst[row * c["dst_pitch"]:row * c["dst_pitch"] + c["width"]] = \
            src[row * c["src_pitch"]:row * c["src_pitch"] + c["width"]]
    kept = np.frombuffer(bytes(dst), dtype=np.float16).reshape(1, heads, length, dim)
    assert np.array_equal(kept, cache[:, :, :length])
    with pytest.raises(EngineError, match="cannot keep 8 of 7"):
        repack_copy(heads=heads, dim=dim, itemsize=2, stored=7, length=8)


def _record(bundle, plans, profiles=None):
    (bundle / TRT_DIR).mkdir(exist_ok=True)
    prof = {"input_ids": [[1, 1], [1, 5], [1, 64]]}
    (bundle / TRT_DIR / "record.json").write_text(json.dumps(
        {"tensorrt_version": "10.3.0", "gpu": "Orin", "plans": plans,
         "profiles": profiles if profiles is not None else {r: prof for r in plans}}))


def test_a_tensorrt_record_is_read_inside_the_bundle_only(tmp_path):
    with pytest.raises(BundleError, match=r"no TensorRT plans .* spec-export engine"):
        read_record(tmp_path, ["target"])
    (tmp_path / TRT_DIR).mkdir()
    (tmp_path / TRT_DIR / "target.plan").write_bytes(b"plan")
    _record(tmp_path, {"target": f"{TRT_DIR}/target.plan"})
    record, plans = read_record(tmp_path, ["target"])
    assert plans == {"target": (tmp_path / TRT_DIR / "target.plan", 64)} and record["gpu"] == "Orin"
    (tmp_path.parent / "elsewhere.plan").write_bytes(b"plan")
    for bad in ("../elsewhere.plan", str(tmp_path.parent / "elsewhere.plan"), f"{TRT_DIR}/missing.plan", 7):
        _record(tmp_path, {"target": bad})
        with pytest.raises(BundleError, match="not a file inside the bundle|not a TensorRT record"):
            read_record(tmp_path, ["target"])
    _record(tmp_path, {"target": f"{TRT_DIR}/target.plan"}, profiles={})
    with pytest.raises(BundleError, match=r"not a TensorRT record .*KeyError.* --overwrite"):
        read_record(tmp_path, ["target"])
    _record(tmp_path, {})
    with pytest.raises(BundleError, match="not a TensorRT record"):
        read_record(tmp_path, ["target", "draft"])


@pytest.mark.slow
def test_running_plans_without_tensorrt_or_plans_is_one_clear_error(pair_bundles, tmp_path, capsys):
    import shutil

    from specedge.runtime import SpeculativeDecoder
    from specedge.runtime.cli import main as run_main
    bundle = tmp_path / "b"
    shutil.copytree(pair_bundles["agree"], bundle)
    with pytest.raises(ConfigError, match="engine must be one of onnxruntime, tensorrt"):
        SpeculativeDecoder.from_bundle(bundle, engine="trt")
    assert run_main([str(bundle), "hi", "--engine", "tensorrt", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "spec-export engine" in err and "Traceback" not in err
    if importlib.util.find_spec("tensorrt") is None:
        (bundle / TRT_DIR).mkdir()
        for role in ("target", "draft"):
            (bundle / TRT_DIR / f"{role}.plan").write_bytes(b"plan")
        _record(bundle, {r: f"{TRT_DIR}/{r}.plan" for r in ("target", "draft")})
        with pytest.raises(EngineError, match=r"specedge\[trt\]"):
            SpeculativeDecoder.from_bundle(bundle, engine="tensorrt")
