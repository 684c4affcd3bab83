"""tools/gpu_check.py without a GPU: the dry run takes every step on the CPU provider with the KV cache bound
through IOBinding (the CUDA path's cache), and a machine without onnxruntime-gpu gets reasons, not a crash."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow          # a subprocess on exported bundles
SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"


def _run(tmp_path, *args) -> dict:
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--json", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_dry_run_takes_every_step(pair_bundles, tmp_path):
    report = _run(tmp_path, "--bundle", str(pair_bundles["agree"]), "--cpu-dry-run", "--quick")
    assert report["environment"]["dry_run"] is True
    assert report["bundles"]["agree/tensorrt-plan"] == {"skipped": "no GPU (dry run)"}
    res = report["bundles"]["agree/cpu"]
    assert set(report["bundles"]) == {"agree/cpu", "agree/tensorrt-plan"}
    for role in ("target", "draft"):      # the IOBinding cache against the plain one: the same arithmetic
        p = res["parity"][role]
        assert p["argmax_equal"] and max(p["max_abs_diff"].values()) < 1e-5, p
    assert res["identity_speed"]["greedy_identical"] and res["identity_speed"]["speculative_tps"] > 0
    assert res["spec_check"]["passed"] and res["spec_check"]["sampling_p"]


def test_no_gpu_and_no_time_are_reasons_not_crashes(pair_bundles, tmp_path):
    import onnxruntime as ort
    report = _run(tmp_path, "--bundle", str(pair_bundles["agree"]), "--budget-s", "0")
    plans = report["bundles"].pop("agree/tensorrt-plan")
    assert plans["skipped"] in ("the time budget was spent", f"TensorRT does not import: "
                                f"{report['environment'].get('tensorrt_why')}")
    for key, res in report["bundles"].items():
        provider = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}[key.split("/")[1]]
        if provider in ort.get_available_providers():
            assert all(res[s] == {"skipped": "the time budget was spent", "seconds": res[s]["seconds"]}
                       for s in ("parity", "identity_speed", "spec_check"))
        else:
            assert "install onnxruntime-gpu" in res["skipped"]
    assert set(report["bundles"]) == {"agree/cuda", "agree/tensorrt"}
