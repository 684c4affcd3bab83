"""GGUF files for the llama.cpp peer: a Hugging Face folder converted with llama.cpp's own
convert_hf_to_gguf.py and quantized with llama-quantize --pure, cached under
~/.cache/specedge/llama.cpp/gguf/ by the folder's content."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from specedge.runtime.files import tree_hash

from .llamacpp_tools import BUILD_HINT, PRECISIONS, PeerError, build_info, cache_root, check, log

def content_key(folder: Path, extra: str = "") -> str:
    return tree_hash(folder, extra)


def gguf_dir() -> Path:
    return cache_root() / "gguf"


def _publish(tmp: Path, out: Path) -> Path:
    os.replace(tmp, out)           # written whole under a temporary name, then renamed
    return out


def default_pre(hf_dir: Path) -> str | None:
    """The llama.cpp pre-tokenizer that does what tokenizer.json's does, for hashes convert_hf_to_gguf.py
    does not know: a plain byte-level BPE with GPT-2's split regex is llama.cpp's "gpt-2"."""
    try:
        pre = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    return None


# runs convert_hf_to_gguf.py with get_vocab_base_pre falling back to a named pre-tokenizer on an unknown hash;
# without sentencepiece installed, a folder with no tokenizer.model (a BPE tokenizer.json) still converts: the
# Llama converter imports sentencepiece before it looks for tokenizer.model, and falls back to BPE after
_CONVERT_SHIM = r"""
import os, runpy, sys, types
src, pre = sys.argv[1], sys.argv[2]
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[3:]
sys.path[0:0] = [src, src + "/gguf-py"]
try:
    import conversion.base as base      # imports transformers, which must not see a stub sentencepiece
    cls = base.TextModel
except (ImportError, AttributeError):
    cls = None
try:
    import sentencepiece
except ImportError:
    if not os.path.isfile(os.path.join(sys.argv[1], "tokenizer.model")):
        stub = types.ModuleType("sentencepiece")
        class SentencePieceProcessor:
            def __init__(self, *a, **k):
                raise ImportError("sentencepiece is not installed")
        stub.SentencePieceProcessor = SentencePieceProcessor
        sys.modules["sentencepiece"] = stub
if pre and cls is not None and hasattr(cls, "get_vocab_base_pre"):
    orig = cls.get_vocab_base_pre
    def get_vocab_base_pre(self, tokenizer):
        try:
            return orig(self, tokenizer)
        except NotImplementedError:
            print(f"[llama.cpp] unknown BPE pre-tokenizer hash: using {pre!r}", file=sys.stderr)
            return pre
    cls.get_vocab_base_pre = get_vocab_base_pre
runpy.run_path(sys.argv[0], run_name="__main__")
"""


# a config.json without "architectures" (transformers' GGUF loader leaves it null): the class to name
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel"}


def _with_architectures(hf_dir: Path, shadow: Path) -> Path:
    """hf_dir, or a shadow folder of links to its files with "architectures" filled in from model_type
    (convert_hf_to_gguf.py picks its converter by architecture only)."""
    try:
        cfg = json.loads((hf_dir / "config.json").read_text())
    except (OSError, ValueError):
        return hf_dir
    if cfg.get("architectures") or cfg.get("model_type") not in ARCHITECTURES:
        return hf_dir
    shadow.mkdir(parents=True, exist_ok=True)
    for f in hf_dir.iterdir():
        if f.name != "config.json":
            (shadow / f.name).symlink_to(f.resolve())
    cfg["architectures"] = [ARCHITECTURES[cfg["model_type"]]]
    (shadow / "config.json").write_text(json.dumps(cfg, indent=2))
    log(f"{hf_dir}/config.json names no architecture: converting as {cfg['architectures'][0]}")
    return shadow


def convert_hf(hf_dir: Path, out: Path, *, bin_dir: Path, outtype: str = "f32", pre: str | None = "auto",
               python: str = sys.executable, timeout: float = 3600.0) -> Path:
    """A Hugging Face folder -> GGUF with llama.cpp's own convert_hf_to_gguf.py (from the build's source
    tree, with its gguf-py), run by `python` (it needs torch, numpy, and sentencepiece for SPM vocabularies)."""
    src = bin_dir.parent / "source"
    if not (src / "convert_hf_to_gguf.py").is_file():
        raise PeerError(f"no convert_hf_to_gguf.py in {src}: rebuild with `{BUILD_HINT}`")
    hf_dir = Path(hf_dir)
    if pre == "auto":
        pre = default_pre(hf_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    shadow = tempfile.TemporaryDirectory(prefix="hf-", dir=out.parent)
    folder = _with_architectures(hf_dir, Path(shadow.name) / hf_dir.name)
    argv = [python, "-c", _CONVERT_SHIM, str(src), pre or "", str(folder), "--outfile", str(tmp),
            "--outtype", outtype]
    log(f"converting {hf_dir} -> {out} ({outtype}) with convert_hf_to_gguf.py")
    try:
        _, err = check(argv, "convert_hf_to_gguf.py", timeout=timeout)
        for line in err.splitlines():
            if line.startswith("[llama.cpp]"):
                print(line, file=sys.stderr, flush=True)
        if not tmp.is_file():
            raise PeerError(f"convert_hf_to_gguf.py wrote no {tmp.name}")
        return _publish(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        shadow.cleanup()


def quantize(src: Path, out: Path, qtype: str, *, bin_dir: Path, pure: bool = True, threads: int | None = None,
             timeout: float = 3600.0) -> Path:
    """llama-quantize [--pure] [--allow-requantize] src out TYPE: --pure quantizes every tensor to TYPE
    (without it, llama.cpp keeps the embeddings and output at a higher precision)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    argv = [bin_dir / "llama-quantize", "--allow-requantize"] + (["--pure"] if pure else []) \
        + [src, tmp, qtype.upper()] + ([str(threads)] if threads else [])
    log(f"quantizing {src.name} -> {out.name} ({qtype.upper()}{', pure' if pure else ''})")
    try:
        check(argv, "llama-quantize", timeout=timeout)
        return _publish(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _hf_supported(hf_dir: Path) -> str | None:
    """Why convert_hf_to_gguf.py cannot take this folder, or None."""
    try:
        cfg = json.loads((hf_dir / "config.json").read_text())
    except (OSError, ValueError):
        return f"{hf_dir} is neither a .gguf file nor a Hugging Face folder (no config.json)"
    if cfg.get("model_type") == "specedge_eagle":
        return f"{hf_dir} is a specedge hidden-state draft head, which llama.cpp cannot run"
    return None


def prepare_gguf(source: str | Path, precision: str, *, bin_dir: Path, cache: Path | None = None) -> Path:
    """A GGUF of `source` (a .gguf or a Hugging Face folder) at `precision` (f32, f16, q8_0, q4_0, or
    as-is: a .gguf as given, a folder at F32), cached by content."""
    source = Path(source).expanduser()
    cache = cache or gguf_dir()
    if precision not in PRECISIONS:
        raise PeerError(f"precision {precision!r} is not one of {PRECISIONS}")
    if source.is_file() and source.suffix == ".gguf":
        if precision == "as-is":
            return source
        st = source.stat()
        key = hashlib.sha256(f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
        out = cache / f"{source.stem}-{key}-{precision}.gguf"
        if not out.is_file():
            quantize(source, out, precision, bin_dir=bin_dir)
        return out
    if not source.is_dir():
        raise PeerError(f"{source} does not exist")
    why = _hf_supported(source)
    if why:
        raise PeerError(why)
    info = build_info(bin_dir)
    key = content_key(source, extra=f"llama.cpp={info.get('version', '?')}")
    base = cache / f"{source.name}-{key}-f32.gguf"
    if not base.is_file():
        convert_hf(source, base, bin_dir=bin_dir, outtype="f32")
    if precision in ("f32", "as-is"):
        return base
    out = cache / f"{source.name}-{key}-{precision}.gguf"
    if not out.is_file():
        quantize(base, out, precision, bin_dir=bin_dir)
    return out


# ---------------------------------------------------------------------------------------------------------
# the runs
