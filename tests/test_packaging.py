"""The runtime stays torch-free: by its imports, by running without torch, and as a built wheel."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("torch", "transformers", "optimum", "specedge.export", "onnx")

# Makes the named packages unimportable, as on a machine where they are not installed.
BLOCK = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'optimum') or name.startswith('specedge.export'):
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
"""


def test_runtime_and_engines_never_import_build_time_packages():
    offenders = []
    for folder in ("runtime", "engines"):
        paths = list((ROOT / folder).rglob("*.py"))
        assert len(paths) >= 2, f"{folder}/ has no modules to check"
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                offenders += [f"{path.name}: {n}" for n in names
                              if n == "onnx" or any(n == f or n.startswith(f + ".") for f in FORBIDDEN[:4])]
    assert offenders == []


@pytest.mark.slow
def test_spec_run_end_to_end_without_torch(pair_bundles):
    code = BLOCK + f"""
from specedge.runtime.cli import main
rc = main([{str(pair_bundles['agree'])!r}, 'def f(x):', '--max-new-tokens', '10', '--json'])
assert rc == 0, rc
assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')]
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["token_ids"]) == 10 and result["stats"]["target_calls"] >= 1


def test_import_without_onnxruntime_names_the_extras():
    code = BLOCK.replace("('torch', 'transformers', 'optimum')", "('onnxruntime',)") + """
from specedge.engines import import_onnxruntime
try:
    import_onnxruntime()
except ImportError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "specedge[cpu]" in out.stdout and "specedge[gpu]" in out.stdout, out.stderr


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SPECEDGE_SKIP_WHEEL") == "1", reason="SPECEDGE_SKIP_WHEEL=1")
def test_wheel_installs_and_runs_in_a_fresh_venv_without_torch(tmp_path, pair_bundles):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("specedge-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[cpu]"],
                   check=True, capture_output=True, timeout=600)
    code = ("import importlib.util, specedge.runtime, specedge.engines; "
            "assert importlib.util.find_spec('torch') is None; print(specedge.runtime.__file__)")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and "site-packages" in out.stdout, out.stderr
    run = subprocess.run([str(env_dir / "bin" / "spec-run"), str(pair_bundles["agree"]), "x",
                          "--max-new-tokens", "6", "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["token_ids"]) == 6
    prompts = tmp_path / "prompts.jsonl"        # spec-check: numpy and onnxruntime only (no scipy)
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    check = subprocess.run([str(env_dir / "bin" / "spec-check"), str(pair_bundles["agree"]), "--prompts",
                            str(prompts), "--new-tokens", "6", "--k", "2", "--samples", "100", "--sampling-prompts",
                            "1", "--json", str(tmp_path / "cert.json")], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "verdict   PASS" in check.stdout, check.stdout + check.stderr
    for script in ("spec-bench", "spec-export"):      # installed; spec-export says it needs [export]
        help_run = subprocess.run([str(env_dir / "bin" / script), "--help"], capture_output=True, text=True,
                                  timeout=120)
        assert help_run.returncode == 0 and "usage" in help_run.stdout, help_run.stderr
    no_torch = subprocess.run([str(env_dir / "bin" / "spec-export"), "model", str(tmp_path), "--out",
                               str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert no_torch.returncode == 2 and "specedge[export]" in no_torch.stderr, no_torch.stderr
