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
    from specedge.export import export_bundle
    root = tmp_path_factory.mktemp("bundles")
    out = {}
    for name, draft in llama_drafts.items():
        out[name] = root / name
        export_bundle(target=llama_target, draft=draft, out=out[name], k=8, max_context=256, quiet=True)
    return out
