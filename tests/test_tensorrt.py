"""TensorRT plans, CPU side: the optimization profile a bundle's graphs get, the refusal of plans built for
another GPU or TensorRT, and spec-export engine's one-line errors where TensorRT or the bundle is missing."""
from __future__ import annotations

import importlib.util

import pytest

from specedge.export.cli import main as export_main
from specedge.export.tensorrt import check_record, profile_shapes
from specedge.runtime.errors import BundleError, ExportError
from specedge.runtime.manifest import ModelInfo, io_names


def _info(inputs, **kw) -> ModelInfo:
    return ModelInfo(file="target/model.onnx", model_type="llama", num_layers=2, num_kv_heads=2, head_dim=16,
                     vocab_size=100, dtype="float32", max_context=512, inputs=inputs, outputs=["logits"], **kw)


def test_profiles_span_steps_verifies_prefill_chunks_and_the_whole_context():
    inputs, _ = io_names(2)
    shapes = profile_shapes(_info(inputs + ["logits_to_keep"]), max_draft_tokens=8, max_context=512)
    assert set(shapes) == set(inputs) | {"logits_to_keep"}
    assert shapes["input_ids"] == ((1, 1), (1, 9), (1, 256)) == shapes["position_ids"]
    assert shapes["past_key_values.1.value"] == ((1, 2, 0, 16), (1, 2, 128, 16), (1, 2, 511, 16))
    lo, opt, hi = shapes["attention_mask"]
    assert lo == (1, 1) and opt == (1, 137) and hi == (1, 512)
    small = profile_shapes(_info(inputs), max_draft_tokens=4, max_context=64)     # a chunk never exceeds the context
    assert small["input_ids"][2] == (1, 64)
    head = profile_shapes(_info(["input_ids", "target_hidden_states"]), max_draft_tokens=4, max_context=64,
                          hidden_size=32)
    assert head["target_hidden_states"] == ((1, 1, 32), (1, 5, 32), (1, 64, 32))
    with pytest.raises(ExportError, match="'pixel_values' that a TensorRT profile cannot size"):
        profile_shapes(_info(["input_ids", "pixel_values"]), max_draft_tokens=4, max_context=64)


def test_plans_from_another_gpu_or_tensorrt_are_refused_with_the_fix():
    record = {"tensorrt_version": "10.3.0", "gpu": "NVIDIA H200"}
    check_record(record, tensorrt_version="10.3.0", gpu="NVIDIA H200")
    with pytest.raises(BundleError, match="built by TensorRT 10.3.0, this is 10.7.0; rebuild .* --overwrite"):
        check_record(record, tensorrt_version="10.7.0", gpu="NVIDIA H200")
    with pytest.raises(BundleError, match="built for 'NVIDIA H200', this GPU is 'Orin'"):
        check_record(record, tensorrt_version="10.3.0", gpu="Orin")


def test_spec_export_engine_errors_are_one_line(tmp_path, capsys):
    assert export_main(["engine", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_spec_export_engine_without_tensorrt_names_the_extra(pair_bundles, capsys):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    assert export_main(["engine", str(pair_bundles["agree"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "specedge[trt]" in err and "Traceback" not in err
    assert not (pair_bundles["agree"] / "tensorrt").exists()
