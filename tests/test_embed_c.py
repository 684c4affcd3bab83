"""A C program embeds CPython, imports specedge from this environment, loads a bundle once and streams a
completion through a C callback; a Python exception becomes an error code and message."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from specedge.runtime import SpeculativeDecoder

SOURCE = Path(__file__).resolve().parents[1] / "examples" / "embed_c" / "specedge_embed.c"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    include = Path(sysconfig.get_paths()["include"])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_python_version()
    if not cc:
        pytest.skip("no C compiler here")
    if not (include / "Python.h").is_file():
        pytest.skip(f"no Python headers ({include / 'Python.h'}); install the python3-dev package")
    if not list(Path(libdir).glob(f"libpython{version}*")):
        pytest.skip(f"no libpython{version} in {libdir} to link against (a Python built without it)")
    out = tmp_path_factory.mktemp("embed") / "specedge_embed"
    build = subprocess.run([cc, str(SOURCE), f"-I{include}", f"-L{libdir}", f"-lpython{version}", "-ldl", "-lm",
                            f"-Wl,-rpath,{libdir}", "-o", str(out)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return out


def _run(program: Path, *args: str):
    env = {**os.environ, "SPECEDGE_PYTHON": sys.executable}
    return subprocess.run([str(program), *args], capture_output=True, text=True, env=env, timeout=300)


def test_streams_the_decoders_own_output(program, pair_bundles):
    prompt = "def add(a, b):"
    done = _run(program, str(pair_bundles["agree"]), prompt, "16")
    assert done.returncode == 0, done.stderr
    want = SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=1).generate(prompt, max_new_tokens=16)
    assert done.stdout == want.text


def test_errors_become_codes_and_messages(program, tmp_path):
    done = _run(program, str(tmp_path / "missing"), "x")
    assert done.returncode == 1 and "BundleError" in done.stderr and "does not exist" in done.stderr
    assert _run(program).returncode == 2          # usage
