"""Bad export sources are one ExportError (spec-export: exit 2, one line), and leave nothing behind."""
from __future__ import annotations

import json
import pickle
import shutil

import pytest

from specedge.export import export_bundle
from specedge.export.cli import main as export_main
from specedge.runtime.errors import ExportError


def _truncate(p):
    p.write_bytes(p.read_bytes()[:1000])


def _random(p):
    p.write_bytes(bytes(range(256)) * 40)


def _huge_header(p):
    raw = p.read_bytes()
    p.write_bytes((10 ** 15).to_bytes(8, "little") + raw[8:])


def _wrong_shape(p):
    from safetensors.torch import load_file, save_file
    state = load_file(str(p))
    key = next(k for k in state if k.endswith("q_proj.weight"))
    state[key] = state[key][:, :7].contiguous()
    save_file(state, str(p))


CASES = {
    "truncated safetensors": ("model.safetensors", _truncate, "cannot load the weights"),
    "random safetensors": ("model.safetensors", _random, "cannot load the weights"),
    "oversized header": ("model.safetensors", _huge_header, "cannot load the weights"),
    "wrong-shape tensor": ("model.safetensors", _wrong_shape, "cannot load the weights"),
    "config is a list": ("config.json", lambda p: p.write_text("[1, 2]"), "not an object"),
    "corrupt tokenizer": ("tokenizer.json", lambda p: p.write_text('{"model": 3'), "tokenizer.json cannot be read"),
    "tokenizer not UTF-8": ("tokenizer.json", lambda p: p.write_bytes(b"\xff\xfe" * 10), "not UTF-8"),
    "eos is text": ("generation_config.json", lambda p: p.write_text(json.dumps({"eos_token_id": "abc"})),
                    "eos_token_id must be a token id"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_bad_sources_are_one_error(llama_target, tmp_path, capsys, case):
    name, spoil, match = CASES[case]
    src = tmp_path / "src"
    shutil.copytree(llama_target, src)
    spoil(src / name)
    with pytest.raises(ExportError, match=match):
        export_bundle(target=src, draft=None, out=tmp_path / "out", max_context=64, quiet=True)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))
    assert export_main(["model", str(src), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]


@pytest.mark.slow
def test_a_pickle_the_weights_only_loader_refuses(llama_target, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(llama_target, src)
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(pickle.dumps(print))     # code, not tensors
    with pytest.raises(ExportError, match="pickled"):
        export_bundle(target=src, draft=None, out=tmp_path / "out", max_context=64, quiet=True)
    with pytest.raises(ExportError, match="cannot load the weights"):
        export_bundle(target=src, draft=None, out=tmp_path / "out", max_context=64, quiet=True, allow_pickle=True)


def test_overwrite_never_deletes_the_source(llama_target, tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "manifest.json").write_text("{}")                  # looks like a bundle --overwrite may replace
    src = out / "model"
    shutil.copytree(llama_target, src)
    with pytest.raises(ExportError, match="inside --out"):
        export_bundle(target=src, draft=None, out=out, overwrite=True, max_context=64, quiet=True)
    assert (src / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_nan_weight_fails_the_export(llama_target, tmp_path):
    from safetensors.torch import load_file, save_file
    src = tmp_path / "src"
    shutil.copytree(llama_target, src)
    state = load_file(str(src / "model.safetensors"))
    key = next(k for k in state if k.endswith("down_proj.weight"))
    state[key][0, 0] = float("nan")
    save_file(state, str(src / "model.safetensors"))
    with pytest.raises(ExportError, match="non-finite|disagree"):
        export_bundle(target=src, draft=None, out=tmp_path / "out", max_context=64, quiet=True)
    assert not (tmp_path / "out").exists()
