"""Files written whole or not at all: a reader (or a crash) never sees half a JSON or PNG; and the
check that a path a bundle names stays inside the bundle."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def inside(folder: str | Path, name) -> bool:
    """Whether `name`, a path a file in `folder` gives, is a string naming something inside `folder`
    (no absolute path, no way out through .. or a link)."""
    return isinstance(name, str) and (Path(folder) / name).resolve().is_relative_to(Path(folder).resolve())


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def tree_hash(folder: str | Path, salt: str = "") -> str:
    """A short hash of every file's name and bytes under `folder` (and `salt`): what a cache of things
    built from the folder is keyed by, so a changed model gets a fresh build."""
    import hashlib
    folder = Path(folder)
    h = hashlib.sha256(salt.encode())
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]
