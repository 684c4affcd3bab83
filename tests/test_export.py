"""spec-export: every architecture's parity, the pair bundle, the manifest, and every bad input."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import byte_tokenizer_json, make_model
from specedge.engines import EngineError, OrtEngine
from specedge.export import ExportError, export_bundle
from specedge.export.cli import main as export_main
from specedge.runtime.manifest import FORMAT_VERSION, Manifest

CASES = ("prefill", "decode", "verify", "rollback")


@pytest.mark.slow
@pytest.mark.parametrize("opset", [20, 23])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2"])
def test_architecture_parity(arch, opset, tmp_path):
    src = make_model(tmp_path / arch, arch, seed=7)
    m = export_bundle(target=src, draft=None, out=tmp_path / "bundle", k=4, max_context=128, opset=opset,
                      quiet=True)
    assert m.models["target"].opset == opset
    parity = m.models["target"].parity
    assert set(parity) == set(CASES)
    for case in CASES:
        assert parity[case]["max_abs_diff"] < 1e-4, (arch, case, parity[case])
        assert 0 <= parity[case]["max_rel_diff"] < 1e-4
    assert m.models["target"].model_type == arch
    assert m.models["target"].inputs[-1] == "logits_to_keep"      # every architecture's head is a MatMul
    # the graph follows the contract: names, order (logits first), dynamic dims
    import onnx
    g = onnx.load(tmp_path / "bundle" / "target" / "model.onnx", load_external_data=False).graph
    assert [i.name for i in g.input] == m.models["target"].inputs
    assert [o.name for o in g.output][0] == "logits"
    dims = [d.dim_param for d in g.input[3].type.tensor_type.shape.dim]
    assert dims[0] and dims[2] and not dims[1] and not dims[3]   # batch, past dynamic; heads, head_dim fixed


@pytest.mark.slow
def test_pair_cli_and_manifest_round_trip(tmp_path, llama_target, llama_drafts):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):", "kind": "function"}\n')
    out = tmp_path / "pair"
    rc = export_main(["--target", str(llama_target), "--draft", str(llama_drafts["agree"]), "--out", str(out),
                      "--max-draft-tokens", "6", "--max-context", "200", "--prompts", str(prompts), "--quiet"])
    assert rc == 0
    m = Manifest.load(out)
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["format_version"] == FORMAT_VERSION == m.format_version
    assert Manifest.from_dict(m.to_dict()) == m
    assert m.max_draft_tokens == 6 and m.max_context == 200 and m.eos_token_ids == [256]
    assert m.vocab_size == 320 and m.prompts == "prompts.jsonl" and (out / "prompts.jsonl").is_file()
    for role in ("target", "draft"):
        info = m.models[role]
        assert (out / info.file).is_file() and info.dtype == "float32" and info.num_layers == 2
        for case in CASES:
            assert raw["models"][role]["parity"][case]["max_abs_diff"] < 1e-4
            assert "max_rel_diff" in raw["models"][role]["parity"][case]
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.slow
def test_fp16_weights_export_as_fp32(tmp_path):
    src = make_model(tmp_path / "half", "llama", seed=3, dtype="float16")
    m = export_bundle(target=src, draft=None, out=tmp_path / "b", k=2, max_context=64, quiet=True)
    assert m.models["target"].dtype == "float32"
    assert m.models["target"].parity["verify"]["max_abs_diff"] < 1e-4


def _err(capsys, argv) -> str:
    assert export_main(argv) == 2
    return capsys.readouterr().err


def test_bad_inputs(tmp_path, capsys, llama_target):
    out = str(tmp_path / "out")
    assert "does not exist" in _err(capsys, ["model", str(tmp_path / "nope"), "--out", out])
    (tmp_path / "empty").mkdir()
    assert "no config.json" in _err(capsys, ["model", str(tmp_path / "empty"), "--out", out])
    bad = tmp_path / "bert"
    shutil.copytree(llama_target, bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "bert"}))
    msg = _err(capsys, ["model", str(bad), "--out", out])
    assert "'bert' is not supported" in msg and "llama" in msg and "gpt2" in msg
    pickled = tmp_path / "pickled"
    shutil.copytree(llama_target, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    assert "--allow-pickle" in _err(capsys, ["model", str(pickled), "--out", out])
    assert "max-draft-tokens must be >= 1" in _err(capsys, ["model", str(llama_target), "--out", out,
                                                             "--max-draft-tokens", "0"])
    assert "--opset 17 is not supported" in _err(capsys, ["model", str(llama_target), "--out", out,
                                                          "--opset", "17"])
    msg = _err(capsys, ["model", str(llama_target), "--out", out, "--max-context", "100000"])
    assert "position limit of 512" in msg
    msg = _err(capsys, ["model", str(llama_target), "--out", out, "--max-context", "12", "--max-draft-tokens", "8"])
    assert "--max-context 12 leaves no room for a 9-token verify" in msg and "--max-context 17" in msg
    (tmp_path / "exists").mkdir()
    assert "--overwrite" in _err(capsys, ["model", str(llama_target), "--out", str(tmp_path / "exists")])
    assert not (tmp_path / "out").exists()


def test_pickle_allowed_on_request(tmp_path, llama_target):
    from specedge.export.loader import check_weights
    pickled = tmp_path / "pickled"
    shutil.copytree(llama_target, pickled)
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ExportError, match="pickled"):
        check_weights(pickled, allow_pickle=False)
    assert check_weights(pickled, allow_pickle=True) is False


def test_vocab_mismatch_names_sizes_and_token(tmp_path, llama_target):
    other = make_model(tmp_path / "other", "llama", seed=5, tokenizer=byte_tokenizer_json(swap=(65, 66)))
    with pytest.raises(ExportError) as e:
        export_bundle(target=llama_target, draft=other, out=tmp_path / "b", quiet=True)
    assert "257 tokens" in str(e.value) and "first difference at id 65" in str(e.value)
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_padded_embedding_rows_are_allowed(tmp_path, llama_target):
    """Qwen-style padding: logits wider than the tokenizer, and of different widths in the pair."""
    wide = make_model(tmp_path / "wide", "llama", seed=9, vocab=384, layers=1, hidden=32)
    m = export_bundle(target=llama_target, draft=wide, out=tmp_path / "b", k=2, max_context=64, quiet=True)
    assert m.vocab_size == 320 and m.models["draft"].vocab_size == 384


def test_failure_halfway_leaves_nothing(tmp_path, llama_target, monkeypatch):
    import specedge.export.graph as graph

    def boom(*a, **k):
        raise RuntimeError("simulated exporter crash")
    monkeypatch.setattr(graph, "export_onnx", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        export_bundle(target=llama_target, draft=None, out=tmp_path / "b", quiet=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_overwrite_replaces_bundle(tmp_path, llama_target):
    out = tmp_path / "b"
    export_bundle(target=llama_target, draft=None, out=out, k=2, max_context=64, quiet=True)
    export_bundle(target=llama_target, draft=None, out=out, k=3, max_context=64, quiet=True, overwrite=True)
    assert Manifest.load(out).max_draft_tokens == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


@pytest.mark.slow
def test_fp16_export_runs_in_the_runtime(tmp_path, llama_target):
    from specedge.runtime import SpeculativeDecoder
    out = tmp_path / "half"
    m = export_bundle(target=llama_target, draft=None, out=out, dtype="fp16", k=2, max_context=64, quiet=True)
    info = m.models["target"]
    assert info.dtype == "float16"
    assert all(info.parity[c]["max_rel_diff"] < 1e-2 for c in CASES)    # fp16 vs PyTorch fp16
    res = SpeculativeDecoder.from_bundle(out).generate([1, 2, 3], max_new_tokens=5)
    assert len(res.token_ids) == 5


@pytest.mark.slow
def test_batch_is_dynamic(tmp_path, llama_target):
    """The graph runs batch 2 with a past, matching PyTorch row by row."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM
    export_bundle(target=llama_target, draft=None, out=tmp_path / "b", k=2, max_context=64, quiet=True)
    sess = ort.InferenceSession(str(tmp_path / "b" / "target" / "model.onnx"), providers=["CPUExecutionProvider"])
    model = AutoModelForCausalLM.from_pretrained(llama_target, dtype=torch.float32).eval()
    ids = np.random.default_rng(0).integers(0, 256, size=(2, 7))
    feed = {"input_ids": ids[:, :4], "attention_mask": np.ones((2, 4), np.int64),
            "position_ids": np.tile(np.arange(4), (2, 1))}
    past = [i.name for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    feed.update({name: np.zeros((2, 2, 0, 16), np.float32) for name in past})
    feed["logits_to_keep"] = np.array([4])
    out = sess.run(None, feed)
    feed = {"input_ids": ids[:, 4:], "attention_mask": np.ones((2, 7), np.int64),
            "position_ids": np.tile(np.arange(4, 7), (2, 1)), "logits_to_keep": np.array([3])}
    feed.update(dict(zip(past, out[1:])))
    logits = sess.run(["logits"], feed)[0]                                   # [2, 3, vocab]
    with torch.no_grad():
        ref = model(input_ids=torch.as_tensor(ids)).logits[:, 4:].numpy()
    assert logits.shape == (2, 3, 320) and np.abs(logits - ref).max() < 1e-4
    # logits_to_keep runs the LM head on the last positions only
    last = sess.run(["logits"], {**feed, "logits_to_keep": np.array([1])})[0]
    assert last.shape == (2, 1, 320) and np.abs(last - ref[:, -1:]).max() < 1e-4


def test_pair_refusals_come_before_any_export(tmp_path, llama_target, monkeypatch):
    """A draft whose position limit is below --max-context is refused before the target is exported."""
    import specedge.export.graph as graph
    monkeypatch.setattr(graph, "export_onnx", lambda *a, **k: pytest.fail("exported before refusing"))
    short = make_model(tmp_path / "short", "llama", seed=4, positions=64)
    with pytest.raises(ExportError, match="position limit of 64"):
        export_bundle(target=llama_target, draft=short, out=tmp_path / "b", max_context=128, quiet=True)
    small = make_model(tmp_path / "small", "llama", seed=4, vocab=200)
    with pytest.raises(ExportError, match="tokenizer has 257 tokens but a model's logits only 200"):
        export_bundle(target=llama_target, draft=small, out=tmp_path / "b", quiet=True)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "int4"])
def test_genai_builder_graphs_run_in_our_runtime(tmp_path, llama_target, llama_drafts, dtype):
    """onnxruntime-genai's fused graphs (no position_ids, symbolic head_dim) under our manifest; the fp32
    target's draft in int8 (a draft's precision changes its speed, never the output)."""
    pytest.importorskip("onnxruntime_genai")
    from specedge.runtime import SpeculativeDecoder
    out = tmp_path / dtype
    draft_dtype = "int8" if dtype == "fp32" else None
    block = 64 if dtype == "int4" else None          # the int4 weights' block size, not the default 32
    m = export_bundle(target=llama_target, draft=llama_drafts["agree"], out=out, builder="genai", dtype=dtype,
                      draft_dtype=draft_dtype, k=4, max_context=128, quant_block=block, quiet=True)
    info = m.models["target"]
    assert info.builder == "genai" and info.weights == dtype and "position_ids" not in info.inputs
    assert info.quant_block == block and m.models["draft"].quant_block == (32 if draft_dtype else block)
    if block:
        import onnx
        graph = onnx.load(str(out / info.file), load_external_data=False).graph
        sizes = {a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "block_size"}
        assert sizes == {block}
    assert m.models["draft"].weights == (draft_dtype or dtype)
    bound = 1e-4 if dtype == "fp32" else 0.5          # int4 of random weights is lossy; fp32 is exact
    assert all(info.parity[c]["max_rel_diff"] < bound for c in CASES), info.parity
    dec = SpeculativeDecoder.from_bundle(out, speculative=True)
    assert dec.target.share_buffer and dec.draft.share_buffer      # genai graphs run with the in-place cache
    assert dec.target.has_logits_to_keep and dec.draft.has_logits_to_keep
    spec, plain = (dec.generate([1, 2, 3], max_new_tokens=16, k=4, speculative=s) for s in (True, False))
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    # the in-place cache against the concat one, through a rollback and a refill past the old length
    kw = dict(vocab_size=m.vocab_size, num_kv_heads=info.num_kv_heads, head_dim=info.head_dim, max_context=128)
    concat, in_place = (OrtEngine(out / info.file, share_buffer=s, **kw) for s in (False, True))
    for step in ([5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15], 7, [16], [17, 18, 19, 20], 0, [21, 22]):
        if isinstance(step, int):
            concat.truncate(step)
            in_place.truncate(step)
        else:
            assert np.array_equal(concat.run(np.asarray(step)), in_place.run(np.asarray(step))), step
    assert concat.length == in_place.length == 2
    for ids in ([23], [24, 25]):       # keep=1 (draft and decode steps): one row from a buffer bound once
        assert np.array_equal(concat.run(np.asarray(ids), keep=1), in_place.run(np.asarray(ids), keep=1))
    first = in_place.run(np.asarray([26]), keep=1)
    kept = first.copy()
    in_place.run(np.asarray([27]), keep=1)
    assert np.array_equal(first, kept)                                 # a result outlives the next run
    with pytest.raises(EngineError, match="max context 128"):
        in_place.run(np.arange(127))


def test_in_place_cache_needs_a_gqa_graph(pair_bundles):
    path = pair_bundles["disagree"] / "target" / "model.onnx"          # torch graphs concatenate: present != past
    with pytest.raises(EngineError, match="exceeds|preallocated"):
        OrtEngine(path, share_buffer=True)
    engine = OrtEngine(path, share_buffer=True, max_context=64)
    with pytest.raises(EngineError, match="GroupQueryAttention"):
        engine.run(np.array([1, 2, 3]))


def test_int8_draft_needs_the_genai_builder(tmp_path, llama_target, llama_drafts):
    with pytest.raises(ExportError, match="--draft-dtype int8 needs --builder genai"):
        export_bundle(target=llama_target, draft=llama_drafts["agree"], out=tmp_path / "b", draft_dtype="int8")
    assert not (tmp_path / "b").exists()


def test_genai_builder_refuses_a_head_dim_its_attention_cannot_run(tmp_path, llama_target, llama_drafts):
    """onnxruntime's GroupQueryAttention needs head_dim % 16 == 0 (the 'disagree' draft's is 8): refused
    before any export, with the fix, instead of an engine traceback from the parity check."""
    with pytest.raises(ExportError, match="draft: .* has head_dim 8, .* multiple of 16; export it with --builder torch"):
        export_bundle(target=llama_target, draft=llama_drafts["disagree"], out=tmp_path / "b", builder="genai",
                      quiet=True)
    assert not (tmp_path / "b").exists()


def test_int4_needs_the_genai_builder(tmp_path, llama_target):
    with pytest.raises(ExportError, match="--builder genai"):
        export_bundle(target=llama_target, draft=None, out=tmp_path / "b", dtype="int4", quiet=True)


@pytest.mark.parametrize("options", [dict(quant_block=48, builder="genai", dtype="int4"),
                                     dict(quant_block=64, builder="genai", dtype="fp32"),
                                     dict(quant_block=64, dtype="fp32")])
def test_quant_block_needs_quantized_genai_weights_and_a_size_matmulnbits_takes(tmp_path, llama_target, options):
    with pytest.raises(ExportError, match=f"--quant-block {options['quant_block']}: .* one of 16, 32, 64, 128, 256"):
        export_bundle(target=llama_target, draft=None, out=tmp_path / "b", quiet=True, **options)
    assert not (tmp_path / "b").exists()


def test_overwrite_never_deletes_a_folder_that_is_not_a_bundle(tmp_path, llama_target):
    precious = tmp_path / "models"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not a bundle"):
        export_bundle(target=llama_target, draft=None, out=precious, overwrite=True, quiet=True)
    assert (precious / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_bundle_is_readable_by_others_and_config_errors_are_clear(tmp_path, llama_target):
    import os
    import stat
    out = tmp_path / "b"
    old = os.umask(0o022)
    try:
        export_bundle(target=llama_target, draft=None, out=out, k=2, max_context=64, quiet=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    broken = tmp_path / "broken"
    shutil.copytree(llama_target, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["num_attention_heads"] = 0
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError):
        export_bundle(target=broken, draft=None, out=tmp_path / "c", quiet=True)


def test_vocab_check_with_id_gaps():
    from specedge.export.bundle import check_vocab

    def tok(vocab):
        from tokenizers import Tokenizer, models
        return Tokenizer(models.WordLevel(vocab=vocab, unk_token="a")).to_str()
    with pytest.raises(ExportError, match="first difference at id 5"):
        check_vocab(tok({"a": 0, "b": 5}), tok({"a": 0, "c": 5}))
