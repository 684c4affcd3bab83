"""Tiny random-weight models built from a config (no downloads) and bundles exported from them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# the speculation guard's verdicts and fetched packages go to a cache of the test run, not the user's
os.environ.setdefault("SPECEDGE_CACHE", __import__("tempfile").mkdtemp(prefix="specedge-cache-"))
from specedge.export.tiny import VOCAB, byte_tokenizer_json, make_model, tiny_config  # noqa: F401


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def llama_target(models_dir) -> Path:
    return make_model(models_dir / "target", "llama", seed=1)


@pytest.fixture(scope="session")
def llama_drafts(models_dir, llama_target) -> dict[str, Path]:
    """A draft that mostly agrees with the target (a perturbed copy) and one that mostly disagrees."""
    return {"agree": make_model(models_dir / "draft_agree", perturb_from=llama_target, noise=0.02, seed=2),
            "disagree": make_model(models_dir / "draft_disagree", "llama", seed=3, layers=1, hidden=32)}


@pytest.fixture(scope="session")
def pair_bundles(tmp_path_factory, llama_target, llama_drafts) -> dict[str, Path]:
    """The two pairs exported, each test session working on its own copy. Exporting is most of the fast
    tier's time, so the exports are kept between sessions (SPECEDGE_TEST_CACHE, default
    ~/.cache/specedge/test-bundles) under a key of all they are made from: the export and manifest code,
    the source models' files and the versions of torch, transformers and onnxruntime."""
    import hashlib
    import json
    import shutil
    import tempfile

    import onnxruntime
    import torch
    import transformers

    import specedge.export
    from specedge.export import export_bundle
    from specedge.runtime import manifest
    from specedge.runtime.files import tree_hash
    h = hashlib.sha256(f"{torch.__version__} {transformers.__version__} {onnxruntime.__version__}".encode())
    for f in sorted(Path(specedge.export.__file__).parent.glob("*.py")) + [Path(manifest.__file__)]:
        h.update(f.name.encode() + f.read_bytes())
    key = tree_hash(llama_target, h.hexdigest() + "".join(tree_hash(d) for d in llama_drafts.values()))
    cache = Path(os.environ.get("SPECEDGE_TEST_CACHE", Path.home() / ".cache" / "specedge" / "test-bundles"))
    kept = cache / key
    if not kept.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=cache))
        try:
            for name, draft in llama_drafts.items():
                export_bundle(target=llama_target, draft=draft, out=tmp / name, k=8, max_context=256, quiet=True)
            for old in cache.iterdir():       # earlier keys: this fixture made them, and only it reads them
                if old.is_dir() and not old.name.startswith("."):
                    shutil.rmtree(old, ignore_errors=True)
            tmp.rename(kept)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    root = tmp_path_factory.mktemp("bundles")
    out = {}
    for name, draft in llama_drafts.items():
        out[name] = Path(shutil.copytree(kept / name, root / name))
        # the models it names as sources (peers in spec-bench read them) are this session's identical copies
        m = json.loads((out[name] / "manifest.json").read_text())
        m["models"]["target"]["source"], m["models"]["draft"]["source"] = str(llama_target), str(draft)
        (out[name] / "manifest.json").write_text(json.dumps(m, indent=1))
    return out
