"""Fuzzing: manifests, generation settings, --jsonl lines and mutated bundle files end in a typed error
(SpecedgeError) or a correct result, never another exception."""
from __future__ import annotations

import copy
import io
import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specedge.runtime import GenerationConfig, SpeculativeDecoder
from specedge.runtime.cli import bounded_lines, serve_jsonl
from specedge.runtime.errors import SpecedgeError
from specedge.runtime.manifest import Manifest
from specedge.runtime.sampling import probs

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def manifest_dict(pair_bundles):
    return json.loads((pair_bundles["agree"] / "manifest.json").read_text())


@FAST
@given(data=st.data())
def test_a_mutated_manifest_is_read_or_refused(manifest_dict, data):
    d = copy.deepcopy(manifest_dict)
    where = data.draw(st.sampled_from(["top", "target", "draft"]))
    node = d if where == "top" else d["models"][where]
    key = data.draw(st.sampled_from(sorted(node) + ["unknown_field"]))
    node[key] = data.draw(JSON)
    try:
        m = Manifest.from_dict(d)
    except SpecedgeError:
        return
    assert isinstance(m.vocab_size, int) and m.models["target"].num_layers >= 1


SETTINGS = st.dictionaries(st.sampled_from(["temperature", "top_k", "top_p", "repetition_penalty", "k", "seed",
                                            "max_new_tokens", "draft_confidence", "ngram", "stop", "speculative"]),
                           JSON, max_size=4)


@FAST
@given(kwargs=SETTINGS)
def test_generation_settings_are_valid_or_one_config_error(kwargs):
    try:
        cfg = GenerationConfig().updated(**kwargs)
    except SpecedgeError:
        return
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32) * 20
    p = probs(x, cfg.sampling, history=[1, 2, 3, 1])
    assert np.isfinite(p).all() and np.allclose(p.sum(1), 1, atol=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(st.binary(max_size=40),
                                st.builds(lambda kw: json.dumps({"prompt": "ab", "max_new_tokens": 2, **kw}),
                                          SETTINGS).map(str.encode)), min_size=1, max_size=4))
def test_every_fuzzed_jsonl_line_is_answered(fuzz_decoder, lines):
    lines = [ln.replace(b"\n", b" ") for ln in lines]
    out = io.StringIO()
    serve_jsonl(fuzz_decoder, bounded_lines(io.BytesIO(b"\n".join(lines) + b"\n")), out)
    replies = [json.loads(r) for r in out.getvalue().splitlines()]
    assert len(replies) == sum(1 for ln in lines if ln.strip(b" \t\r"))
    assert all("error" in r or "token_ids" in r for r in replies)
    assert not any("internal error" in r.get("error", "") for r in replies), replies


@pytest.fixture(scope="module")
def fuzz_decoder(pair_bundles):
    return SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=1, speculative=True)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bundle_with_mutated_bytes_loads_and_runs_or_raises_one_error(pair_bundles, tmp_path_factory, data):
    dst = tmp_path_factory.mktemp("mut") / "b"
    shutil.copytree(pair_bundles["disagree"], dst)
    name = data.draw(st.sampled_from(["manifest.json", "tokenizer.json", "target/model.onnx", "draft/model.onnx",
                                      "draft/model.onnx.data"]))
    raw = bytearray((dst / name).read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    (dst / name).write_bytes(bytes(raw))
    try:
        dec = SpeculativeDecoder.from_bundle(dst, threads=1, speculative=True)
        res = dec.generate("def f(x):", max_new_tokens=4, temperature=0.0)
    except SpecedgeError:
        return
    assert len(res.token_ids) <= 4
