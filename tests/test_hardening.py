"""Hostile input gets one clear error, never a traceback, a silent NaN or a lost request."""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from specedge.runtime import BundleError, ConfigError, SamplingParams, SpeculativeDecoder
from specedge.runtime.cli import bounded_lines, serve_jsonl
from specedge.runtime.errors import EngineError
from specedge.runtime.sampling import probs, sample


@pytest.mark.parametrize("kw, match", [(dict(temperature=float("inf")), "finite"),
                                       (dict(temperature=float("nan")), "finite"),
                                       (dict(temperature=1e-40), "temperature must be 0"),
                                       (dict(temperature=0.8, repetition_penalty=1e-40), "repetition_penalty"),
                                       (dict(top_p=float("nan")), "finite")])
def test_parameters_that_only_make_nan_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        SamplingParams(**kw)


def test_a_tiny_top_p_keeps_the_most_likely_token():
    x = np.random.default_rng(0).standard_normal((3, 500)).astype(np.float32)
    p = probs(x.copy(), SamplingParams(temperature=1.0, top_p=1e-300))
    assert np.allclose(p.sum(1), 1) and (np.count_nonzero(p, axis=1) == 1).all()
    assert (p.argmax(1) == x.argmax(1)).all() and sample(p[0], np.random.default_rng(1)) == x[0].argmax()


@pytest.fixture()
def bundle_copy(pair_bundles, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(pair_bundles["agree"], dst)
    return dst


@pytest.mark.parametrize("where", ["../../elsewhere/model.onnx", "/etc/passwd"])
def test_manifest_paths_stay_inside_the_bundle(bundle_copy, where):
    m = json.loads((bundle_copy / "manifest.json").read_text())
    m["models"]["target"]["file"] = where
    (bundle_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="outside the bundle"):
        SpeculativeDecoder.from_bundle(bundle_copy, threads=1, speculative=False)


def test_corrupt_weights_are_an_error_not_an_empty_answer(bundle_copy):
    data = bundle_copy / "target" / "model.onnx.data"
    data.write_bytes(b"\xff" * data.stat().st_size)         # every float a NaN
    with pytest.raises(EngineError, match="non-finite logits"):
        dec = SpeculativeDecoder.from_bundle(bundle_copy, threads=1, speculative=False)
        dec.generate("def f(x):", max_new_tokens=4)


def test_threads_beyond_reason_are_refused(pair_bundles):
    for bad in (10 ** 10, 5000, -1, 1.5, True):
        with pytest.raises(ConfigError, match="threads must be integers"):
            SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=bad)


def test_every_jsonl_line_is_answered(pair_bundles):
    dec = SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=1, speculative=True)
    raw = b"".join([json.dumps({"id": 1, "prompt": "x", "max_new_tokens": 2, "temperature": 1.0, "top_p": 1e-300}
                               ).encode() + b"\n",
                    b"[" * 100_000 + b"\n",
                    b'{"id": 3, "prompt": "' + b"a" * (2 << 20) + b'"}\n',
                    json.dumps({"id": 4, "prompt": "y", "max_new_tokens": "many"}).encode() + b"\n",
                    json.dumps({"id": 5, "prompt": "z", "max_new_tokens": 2}).encode() + b"\n"])
    out = io.StringIO()
    errors = serve_jsonl(dec, bounded_lines(io.BytesIO(raw)), out)
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert len(replies) == 5 and errors == 3
    assert replies[0]["id"] == 1 and len(replies[0]["token_ids"]) == 2
    assert "not JSON" in replies[1]["error"] and "more than" in replies[2]["error"]
    assert replies[3]["id"] == 4 and "max_new_tokens" in replies[3]["error"]
    assert replies[4]["id"] == 5 and len(replies[4]["token_ids"]) == 2


def _spec_run(*args, **kw):
    # Ctrl-C as at a terminal: a test run started in the background inherits SIGINT ignored
    return subprocess.Popen([sys.executable, "-m", "specedge.runtime.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            **kw)


@pytest.mark.slow
def test_ctrl_c_and_a_closed_pipe_end_quietly(pair_bundles):
    b = str(pair_bundles["agree"])
    proc = _spec_run(b, "--jsonl", "--threads", "1", "--no-speculation", stdin=subprocess.PIPE)
    proc.stdin.write(json.dumps({"prompt": "x", "max_new_tokens": 2}).encode() + b"\n")
    proc.stdin.flush()
    assert proc.stdout.readline()                  # loaded and answering: now idle on standard input
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err
    proc = _spec_run(b, "def f(x):", "--stream", "--max-new-tokens", "200", "--threads", "1", "--no-speculation")
    proc.stdout.close()                            # the reader went away (as `| head` does)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) in (0, 1) and b"Traceback" not in err and b"BrokenPipe" not in err


def test_misleading_inputs_get_the_right_message(pair_bundles, tmp_path, capsys):
    from specedge.export import export_bundle
    from specedge.runtime.cli import main as run_main
    from specedge.runtime.errors import ExportError
    b = str(pair_bundles["agree"])
    with pytest.raises(EngineError, match="unknown execution provider 'gpu'"):
        SpeculativeDecoder.from_bundle(b, providers=["gpu"], threads=1)
    assert run_main([b, "x", "--providers", "gpu", "--threads", "1"]) == 2
    assert run_main([b, "x", "--json", "--stream"]) == 2
    capsys.readouterr()
    with pytest.raises(BundleError, match="is a file"):
        SpeculativeDecoder.from_bundle(pair_bundles["agree"] / "manifest.json")
    note = tmp_path / "prompt.txt"
    note.write_text("def f(x):")
    assert run_main([b, str(note), "--max-new-tokens", "2", "--threads", "1", "--no-speculation"]) == 0
    assert "for the file's contents use" in capsys.readouterr().err
    with pytest.raises(ExportError, match="hub id: download it first"):
        export_bundle(target="Qwen/Qwen2.5-0.5B", draft=None, out=tmp_path / "q")


def test_an_interrupted_exports_partial_folder_is_cleaned_up_by_the_next(tmp_path):
    from specedge.export.bundle import OWNER, _remove_stale_partials
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive, foreign = (tmp_path / f".b.partial-{s}" for s in ("dead", "alive", "foreign"))
    for d in (dead, alive, foreign):
        d.mkdir()
    (dead / OWNER).write_text(done.stdout.strip())           # its process has exited
    (alive / OWNER).write_text(str(os.getpid()))
    _remove_stale_partials(tmp_path / "b")
    assert not dead.exists() and alive.exists() and foreign.exists()


@pytest.mark.slow
def test_the_soak_tool_runs_and_reports(pair_bundles, tmp_path):
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "tools" / "lab" / "soak.py"
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(script), "--bundle", str(pair_bundles["agree"]), "--tokens", "600",
                           "--max-growth", "1.0", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(out.read_text())
    assert got["tokens"] >= 600 and got["requests"] == len(got["samples"]) and "abandoned" in got["by_kind"]


def test_a_missing_weights_file_is_named(bundle_copy):
    (bundle_copy / "target" / "model.onnx.data").unlink()
    with pytest.raises(BundleError, match="missing target/model.onnx.data"):
        SpeculativeDecoder.from_bundle(bundle_copy, threads=1)


class _FullDisk(io.StringIO):
    def write(self, s):
        import errno
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.slow            # exports a model before the disk fills
def test_a_full_disk_is_one_line_and_leaves_nothing(pair_bundles, llama_target, tmp_path, monkeypatch, capsys):
    import errno
    from specedge.export.cli import main as export_main
    from specedge.runtime.cli import main as run_main
    from specedge.runtime.manifest import Manifest
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    assert run_main([str(pair_bundles["agree"]), "x", "--json", "--max-new-tokens", "2", "--threads", "1",
                     "--no-speculation"]) == 2
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["spec-run: error: No space left on device"], err

    def full(self, folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))
    monkeypatch.setattr(Manifest, "write", full)
    out = tmp_path / "out"
    assert export_main(["model", str(llama_target), "--out", str(out), "--max-context", "64", "--quiet"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


MANIFEST_EDITS = {
    "a list": lambda d: [],
    "models a list": lambda d: {**d, "models": []},
    "generation a list": lambda d: {**d, "generation": [1]},
    "eos text": lambda d: {**d, "eos_token_ids": ["x"]},
    "layers text": lambda d: {**d, "models": {**d["models"], "target": {**d["models"]["target"], "num_layers": "abc"}}},
}


@pytest.mark.parametrize("case", list(MANIFEST_EDITS))
def test_malformed_manifests_are_one_bundle_error(bundle_copy, case, capsys):
    from specedge.runtime.cli import main as run_main
    d = json.loads((bundle_copy / "manifest.json").read_text())
    (bundle_copy / "manifest.json").write_text(json.dumps(MANIFEST_EDITS[case](d)))
    with pytest.raises(BundleError):
        SpeculativeDecoder.from_bundle(bundle_copy, threads=1)
    assert run_main([str(bundle_copy), "x", "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spec-run: error: ")


def test_cli_thread_counts_and_an_unavailable_provider(pair_bundles, capsys):
    from specedge.runtime.cli import main as run_main
    b = str(pair_bundles["agree"])
    assert run_main([b, "x", "--threads", "5000"]) == 2
    assert "threads must be integers" in capsys.readouterr().err
    import warnings
    with warnings.catch_warnings():      # as outside pytest: warnings printed, not recorded
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        assert run_main([b, "x", "--providers", "cuda,cpu", "--threads", "1", "--max-new-tokens", "2",
                         "--no-speculation"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert len(err) == 1 and err[0].startswith("spec-run: warning: execution providers ['CUDAExecutionProvider']")
    assert run_main([b, "x", "--providers", "cuda", "--max-new-tokens", "2", "--no-speculation"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "install onnxruntime-gpu" in err and "cuda,cpu" in err
