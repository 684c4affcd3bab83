"""spec-export triton: a Triton Inference Server model repository for a bundle. No Triton server runs here:
the repository's layout, config.pbtxt (parsed) and model.py (compiled, its entry points) are checked."""
from __future__ import annotations

import ast
import re

from specedge.export.cli import main as export_main
from specedge.runtime.manifest import Manifest


def parse_pbtxt(text: str):
    """Protobuf text format -> nested dicts; a repeated field (or a [ ... ] list) becomes a list."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+', text)
    pos = 0

    def value():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "{":
            return fields("}")
        if tok == "[":
            items = []
            while tokens[pos] != "]":
                items.append(value())
                if tokens[pos] == ",":
                    pos += 1
            pos += 1
            return items
        if tok.startswith('"'):
            return tok[1:-1]
        return int(tok) if re.fullmatch(r"-?\d+", tok) else tok

    def fields(end):
        nonlocal pos
        out = {}
        while pos < len(tokens) and tokens[pos] != end:
            key = tokens[pos]
            pos += 1
            if tokens[pos] == ":":
                pos += 1
            v = value()
            out.setdefault(key, []).append(v)
        pos += 1
        return {k: v[0] if len(v) == 1 else v for k, v in out.items()}

    tokens.append("<end>")
    return fields("<end>")


def test_the_model_repository(pair_bundles, tmp_path, capsys):
    out = tmp_path / "repo"
    assert export_main(["triton", str(pair_bundles["agree"]), str(out), "--instances", "2"]) == 0
    model = out / "specedge"
    cfg = parse_pbtxt((model / "config.pbtxt").read_text())
    assert cfg["name"] == "specedge" and cfg["backend"] == "python" and cfg["max_batch_size"] == 0
    assert cfg["model_transaction_policy"]["decoupled"] == "true" and "dynamic_batching" not in cfg
    inputs = {i["name"]: i for i in cfg["input"]}
    assert inputs["text_input"]["data_type"] == "TYPE_STRING" and inputs["max_tokens"]["optional"] == "true"
    assert [o["name"] for o in cfg["output"]] == ["text_output"]
    assert cfg["instance_group"][0]["count"] == 2 and cfg["instance_group"][0]["kind"] == "KIND_CPU"
    params = {p["key"]: p["value"]["string_value"] for p in cfg["parameters"]}
    assert params["bundle"] == "bundle" and (model / "1" / params["bundle"] / "manifest.json").is_file()
    Manifest.load(model / "1" / "bundle")
    tree = ast.parse((model / "1" / "model.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonPythonModel")
    assert {f.name for f in cls.body if isinstance(f, ast.FunctionDef)} >= {"initialize", "execute", "finalize"}
    compile((model / "1" / "model.py").read_text(), "model.py", "exec")
    assert export_main(["triton", str(pair_bundles["agree"]), str(out)]) == 2           # never over a folder
    assert export_main(["triton", str(tmp_path / "none"), str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "does not exist" in err and not (tmp_path / "r2").exists()
