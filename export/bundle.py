"""Export a draft+target pair (or one model) into a bundle folder with a checked manifest.

Everything is written to a temporary folder beside the destination and renamed into place at the
end, so an export that fails halfway leaves nothing at `out`.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from specedge.engines.base import EngineError
from specedge.runtime.manifest import MANIFEST, QUANTIZED_WEIGHTS, Manifest, ModelInfo, io_names, read_prompts

from .loader import ExportError, check_source, load_model, read_json_object

GENERATION_KEYS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
PARITY_PROMPT = 7      # prompt tokens of the parity check (specedge.export.parity.measure)
# Largest relative logit difference (to max |logit|) an export may show; int4 is lossy by design.
PARITY_BOUND = {"fp32": 1e-3, "fp16": 5e-2}


@contextlib.contextmanager
def phase(label: str, quiet: bool = False):
    t0 = time.perf_counter()
    if not quiet:
        print(f"{label} ...", file=sys.stderr, flush=True)
    yield
    if not quiet:
        print(f"{label}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def tokenizer_json(folder: Path) -> str:
    """The folder's fast-tokenizer JSON; converted with transformers when only slow files exist."""
    path = Path(folder) / "tokenizer.json"
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ExportError(f"{path} is not UTF-8 text ({e}); replace it with the model's own") from e
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return tok.backend_tokenizer.to_str()
    except (OSError, ValueError, AttributeError) as e:
        raise ExportError(f"{folder} has no tokenizer.json and transformers cannot build one ({e}); "
                          f"add the model's tokenizer files") from e


def _vocab(tok_json: str) -> dict[str, int]:
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_str(tok_json).get_vocab(with_added_tokens=True)
    except Exception as e:  # tokenizers raises its own exception type for a malformed file
        raise ExportError(f"a tokenizer.json cannot be read ({' '.join(str(e).split())[:200]}); replace it with "
                          f"the model's own") from e


def check_vocab(target_tok: str, draft_tok: str) -> int:
    """Draft and target must map the same tokens to the same ids; return the tokenizer's size."""
    t, d = _vocab(target_tok), _vocab(draft_tok)
    if t == d:
        return len(t)
    t_by_id, d_by_id = {i: s for s, i in t.items()}, {i: s for s, i in d.items()}
    first = min(i for i in set(t_by_id) | set(d_by_id) if t_by_id.get(i) != d_by_id.get(i))
    raise ExportError(f"draft and target tokenizers differ: target has {len(t)} tokens, draft {len(d)}; "
                      f"first difference at id {first}: target {t_by_id.get(first)!r} vs draft "
                      f"{d_by_id.get(first)!r}. Speculative decoding needs a draft trained with the "
                      f"target's tokenizer")


def _json(path: Path) -> dict:
    return read_json_object(path) if path.is_file() else {}


def _token_text(value) -> str:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def chat_template(folder: Path) -> tuple[str | None, dict]:
    """The folder's chat template (chat_template.jinja, else tokenizer_config.json's "chat_template",
    its "default" entry when it holds several) and the bos / eos token strings it renders with."""
    folder = Path(folder)
    tc = _json(folder / "tokenizer_config.json")
    path = folder / "chat_template.jinja"
    text = path.read_text(encoding="utf-8") if path.is_file() else tc.get("chat_template")
    if isinstance(text, list):
        text = next((t.get("template") for t in text if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(text, str) or not text.strip():
        return None, {}
    return text, {k: _token_text(tc.get(k)) for k in ("bos_token", "eos_token")}


def generation_defaults(folder: Path) -> tuple[list[int], dict]:
    gen, cfg = _json(folder / "generation_config.json"), _json(folder / "config.json")
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    eos_ids = [] if eos is None else list(eos) if isinstance(eos, list) else [eos]
    if any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in eos_ids):
        raise ExportError(f"{folder}: eos_token_id must be a token id or a list of them, got {eos!r}; fix "
                          f"generation_config.json / config.json")
    return eos_ids, {k: gen[k] for k in GENERATION_KEYS if k in gen}


def draft_kind(folder: Path) -> str:
    """"eagle" for a hidden-state draft head folder (specedge.export.eagle), else "causal_lm"."""
    from .eagle import KIND
    return "eagle" if _json(Path(folder) / "config.json").get("model_type") == KIND else "causal_lm"


def export_head_model(src: Path, dst: Path, *, role: str, k: int, max_context: int | None, dtype: str = "fp32",
                      quiet: bool = False, origin: Path | None = None, target_src: Path | None = None,
                      **_) -> ModelInfo:
    """A hidden-state draft head: its graph reads the target's hidden states (always the torch exporter)."""
    from .eagle import export_eagle_one
    t0 = time.perf_counter()
    dst.mkdir(parents=True)
    with phase(f"[{role}] export the hidden-state head {src}", quiet):
        try:
            dims, parity, inputs, outputs = export_eagle_one(src, dst, k=k, max_context=max_context, weights=dtype,
                                                             target=target_src)
        except ValueError as e:
            raise ExportError(f"{role}: {e}") from e
    worst = max(d["max_rel_diff"] for d in parity.values())
    if not worst <= PARITY_BOUND.get(dtype, float("inf")):
        raise ExportError(f"{role}: ONNX Runtime and PyTorch disagree on the draft head (max relative difference "
                          f"{worst:.2e}); please report it (parity: {parity})")
    shutil.copy2(src / "config.json", dst / "config.json")
    dims.pop("max_positions"), dims.pop("hidden_size")
    return ModelInfo(file=f"{role}/model.onnx", inputs=inputs, outputs=outputs, parity=parity,
                     export_seconds=round(time.perf_counter() - t0, 2), source=str(Path(origin or src).resolve()),
                     opset=20, builder="torch", weights=dtype, kind="eagle", **{**dims, "dtype": "float32"})


def export_one(src: Path, dst: Path, *, role: str, dtype: str, max_context: int | None, k: int,
               allow_pickle: bool, opset: int, builder: str = "torch", quant_block: int | None = None,
               quiet: bool = False, origin: Path | None = None, hidden: bool = False, **_) -> ModelInfo:
    from .genai import export_genai
    from .graph import export_onnx
    from .heads import KEEP, add_logits_to_keep
    from .parity import measure

    t0 = time.perf_counter()
    dst.mkdir(parents=True)
    with phase(f"[{role}] load {src}", quiet):     # the PyTorch reference (fp32 for int4 graphs)
        model, dims = load_model(src, dtype=_reference_dtype(dtype), max_context=max_context,
                                 allow_pickle=allow_pickle)
    block = (quant_block or QUANT_BLOCK) if builder == "genai" and dtype in QUANTIZED else None
    with phase(f"[{role}] export ONNX ({builder})", quiet):
        if builder == "genai":
            inputs, outputs = export_genai(src, dst, precision=dtype,
                                           extra_options={"block_size": str(block)} if block else None)
        else:
            export_onnx(model, dims, dst / "model.onnx", opset=opset)
            inputs, outputs = io_names(dims["num_layers"])
        if add_logits_to_keep(dst / "model.onnx") and KEEP not in inputs:
            inputs = [*inputs, KEEP]
        if hidden:     # a hidden-state draft head reads the target's final hidden states
            from .heads import HIDDEN, add_hidden_output
            if not add_hidden_output(dst / "model.onnx", width=model.config.hidden_size, half=dtype == "fp16"):
                raise ExportError(f"{role}: cannot find the LM head in the graph to output its hidden states; "
                                  f"use a draft model instead of a hidden-state head")
            outputs = [*outputs, HIDDEN]
    with phase(f"[{role}] parity ONNX Runtime vs PyTorch", quiet):
        try:
            parity = measure(model, dst / "model.onnx", vocab_size=dims["vocab_size"], k=k,
                             prompt_len=PARITY_PROMPT, num_kv_heads=dims["num_kv_heads"],
                             head_dim=dims["head_dim"], in_place=builder == "genai", max_context=dims["max_context"])
        except EngineError as e:
            raise ExportError(f"{role}: the exported graph does not run in ONNX Runtime ({e}); export it with "
                              f"the other --builder, or report it") from e
    if not quiet:
        for case, d in parity.items():
            print(f"[{role}]   {case:8s} max|diff| {d['max_abs_diff']:.2e}  relative {d['max_rel_diff']:.2e}",
                  file=sys.stderr)
    bound = PARITY_BOUND.get(dtype)
    worst = max(d["max_rel_diff"] for d in parity.values())
    if not (worst <= bound if bound is not None else worst < float("inf")):     # NaN fails both
        raise ExportError(f"{role}: ONNX Runtime and PyTorch disagree (max relative logit difference {worst:.2e} "
                          f"> {bound:g} for {dtype}); the graph is wrong for this model -- please report it "
                          f"(parity: {parity})")
    for name in ("config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return ModelInfo(file=f"{role}/model.onnx", inputs=inputs, outputs=outputs, parity=parity,
                     export_seconds=round(time.perf_counter() - t0, 2), source=str(Path(origin or src).resolve()),
                     opset=opset if builder == "torch" else 0, builder=builder, weights=dtype,
                     quant_block=block, **dims)


QUANTIZED = QUANTIZED_WEIGHTS
QUANT_BLOCKS = (16, 32, 64, 128, 256)   # what MatMulNBits takes
QUANT_BLOCK = 32                 # as llama.cpp's Q8_0 / Q4_0; larger blocks decode faster and agree less with fp32


def _reference_dtype(dtype: str) -> str:
    return "fp32" if dtype in QUANTIZED else dtype


OWNER = ".spec-export-pid"     # in a partial export: the process writing it


def _remove_stale_partials(out: Path) -> None:
    """Partial exports of `out` that an interrupted spec-export left behind: ours (they hold OWNER) and
    whose process is gone. Anything else is left alone."""
    for tmp in out.parent.glob(f".{out.name}.partial-*"):
        try:
            pid = int((tmp / OWNER).read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue                     # still running (another export of the same folder)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            continue


@contextlib.contextmanager
def staged(out: Path, *, overwrite: bool):
    """Yield a temp folder beside `out`; on success it replaces `out`, on failure it vanishes."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists; pass --overwrite to replace it")
    if out.exists() and not (out / MANIFEST).is_file() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not a bundle (no {MANIFEST}); --overwrite only replaces "
                          f"bundles -- choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    (tmp / OWNER).write_text(str(os.getpid()))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)          # mkdtemp makes it 0700; a bundle is read by other users too
    try:
        yield tmp
        (tmp / OWNER).unlink()
        if out.exists():
            old = out.with_name(f".{out.name}.old-{tmp.name[-8:]}")
            out.rename(old)
            try:
                tmp.rename(out)
            except OSError:
                old.rename(out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


EXPORTERS = {"causal_lm": export_one, "eagle": export_head_model}


def head_check(folder: Path, max_context: int | None) -> dict:
    """What can be refused about a draft head folder before any heavy work; its dims."""
    from .eagle import head_dims
    if not (Path(folder) / "model.safetensors").is_file():
        raise ExportError(f"{folder} is a draft head folder without model.safetensors; re-train or re-save it")
    try:
        dims = head_dims(folder)
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"{folder}/config.json is not a draft head's config ({e})") from e
    limit = dims["max_positions"]
    context = max_context or min(limit, 4096)
    if context > limit:
        raise ExportError(f"--max-context {context} exceeds the draft head's position limit of {limit}")
    return {**dims, "max_context": context}


def _check_prompts(path: Path) -> None:
    """The prompts file the runtime will read (read_prompts), every prompt a string."""
    if not path.is_file():
        raise ExportError(f"prompts file {path} does not exist")
    try:
        prompts = read_prompts(path)
    except ValueError as e:
        raise ExportError(str(e)) from None
    bad = [i for i, p in enumerate(prompts, 1) if not isinstance(p, str)]
    if bad:
        raise ExportError(f"{path}: prompt {bad[0]} (of {len(prompts)}) is not a string; each line must be a "
                          f"JSON object with a string 'prompt'")


@contextlib.contextmanager
def model_folder(src: Path, *, out: Path, quiet: bool):
    """`src` as a Hugging Face folder: a GGUF file is converted into a temp folder beside `out`, removed
    afterwards; a folder is used as it is."""
    from .gguf import gguf_to_folder, is_gguf
    src = Path(src)
    if not is_gguf(src):
        yield src
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{src.stem}.hf-", dir=Path(out).parent))
    try:
        with phase(f"convert {src.name} (GGUF -> Hugging Face, dequantized to fp32)", quiet):
            folder = gguf_to_folder(src, tmp / "model")
        yield folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_bundle(*, target: Path, draft: Path | None, out: Path, **options) -> Manifest:
    """Export `target` (and `draft`, when given): Hugging Face folders or GGUF files, into the bundle
    folder `out`. Options: see _export_folders."""
    from .gguf import is_gguf
    for src in (target, draft):
        if src is not None and Path(src).resolve().is_relative_to(Path(out).resolve()):
            raise ExportError(f"{src} lies inside --out {out}, which the export would replace; write the bundle "
                              f"somewhere else")
        if src is not None and Path(src).is_file() and not is_gguf(src):
            raise ExportError(f"{src} is a file but not a GGUF model (no GGUF magic); pass a Hugging Face "
                              f"model folder or a .gguf file")
    with contextlib.ExitStack() as stack:
        t = stack.enter_context(model_folder(target, out=out, quiet=options.get("quiet", False)))
        d = stack.enter_context(model_folder(draft, out=out, quiet=options.get("quiet", False))) if draft else None
        origins = {"target": Path(target)} | ({"draft": Path(draft)} if draft else {})
        return _export_folders(target=t, draft=d, out=out, origins=origins, **options)


def _export_folders(*, target: Path, draft: Path | None, out: Path, origins: dict, dtype: str = "fp32",
                    draft_dtype: str | None = None, k: int = 8, max_context: int | None = None,
                    prompts: Path | None = None, overwrite: bool = False, allow_pickle: bool = False,
                    opset: int | None = None, builder: str = "torch", quant_block: int | None = None,
                    quiet: bool = False) -> Manifest:
    from specedge.runtime import __version__

    from .graph import DEFAULT_OPSET, OPSETS

    if k < 1:
        raise ExportError(f"--max-draft-tokens must be >= 1, got {k}")
    opset = opset or DEFAULT_OPSET
    if opset not in OPSETS:
        raise ExportError(f"--opset {opset} is not supported; use one of {', '.join(map(str, OPSETS))}")
    if builder not in ("torch", "genai"):
        raise ExportError(f"--builder {builder!r} is not supported; use torch or genai")
    if quant_block is not None and (quant_block not in QUANT_BLOCKS or builder != "genai"
                                    or not {dtype, draft_dtype} & set(QUANTIZED)):
        raise ExportError(f"--quant-block {quant_block}: the block size of int8/int4 weights (--builder genai) is one "
                          f"of {', '.join(map(str, QUANT_BLOCKS))}")
    sources = {"target": Path(target)} | ({"draft": Path(draft)} if draft else {})
    # fail fast: every refusal before any heavy work
    kinds = {role: draft_kind(src) for role, src in sources.items()}
    if kinds["target"] != "causal_lm":
        raise ExportError(f"{target} is a draft head (it reads a target's hidden states); pass it as --draft")
    # an int8 draft beside an fp32 target: the draft's precision moves its speed, never the output's law
    dtypes = {"target": dtype, "draft": draft_dtype or dtype}
    if kinds.get("draft") == "eagle":      # a head is exported by torch: fp32, or its MatMuls in int8
        dtypes["draft"] = draft_dtype or ("int8" if dtype in QUANTIZED else "fp32")
        if dtypes["draft"] not in ("fp32", "int8"):
            raise ExportError(f"--draft-dtype {dtypes['draft']} is not available for a hidden-state head; use fp32 "
                              f"or int8")
    for role, flag in (("target", "--dtype"), ("draft", "--draft-dtype")):
        d = dtypes.get(role)
        if d in QUANTIZED and builder != "genai" and kinds.get(role) == "causal_lm":
            raise ExportError(f"{flag} {d} needs --builder genai (onnxruntime-genai's MatMulNBits graphs)")
    dims = {role: head_check(src, max_context) if kinds[role] == "eagle" else
            check_source(src, dtype=_reference_dtype(dtypes[role]), max_context=max_context, allow_pickle=allow_pickle)
            for role, src in sources.items()}
    for role, d in dims.items():
        if builder == "genai" and kinds[role] == "causal_lm" and d["head_dim"] % 16:
            raise ExportError(f"{role}: {sources[role]} has head_dim {d['head_dim']}, and onnxruntime's "
                              f"GroupQueryAttention (the attention of --builder genai graphs) needs a multiple "
                              f"of 16; export it with --builder torch")
    context = min(d["max_context"] for d in dims.values())
    if context < PARITY_PROMPT + k + 2:      # the parity check's prompt, a (k+1)-token verify, one more step
        raise ExportError(f"--max-context {context} leaves no room for a {k + 1}-token verify after a prompt; "
                          f"use --max-context {PARITY_PROMPT + k + 2} or more (or fewer --max-draft-tokens)")
    if prompts:
        _check_prompts(Path(prompts))
    toks = {role: tokenizer_json(src) for role, src in sources.items()}
    tok_size = check_vocab(toks["target"], toks.get("draft", toks["target"]))
    shared = min(d["vocab_size"] for d in dims.values())
    if tok_size > shared:
        raise ExportError(f"the tokenizer has {tok_size} tokens but a model's logits only {shared}; "
                          f"the tokenizer does not belong to these models")
    eos_ids, generation = generation_defaults(sources["target"])
    with staged(Path(out), overwrite=overwrite) as tmp:     # refuses an existing --out before any work
        hidden = kinds.get("draft") == "eagle"
        models = {role: EXPORTERS[kinds[role]](src, tmp / role, role=role, dtype=dtypes[role], max_context=max_context,
                                               k=k, allow_pickle=allow_pickle, opset=opset, builder=builder,
                                               quant_block=quant_block, quiet=quiet, origin=origins[role],
                                               hidden=hidden and role == "target",
                                               target_src=sources["target"])
                  for role, src in sources.items()}
        for role, info in list(models.items()):      # the weights file too: a missing one is named at load
            data = f"{role}/model.onnx.data"
            if (tmp / data).is_file():
                models[role] = replace(info, data=data)
        (tmp / "tokenizer.json").write_text(toks["target"], encoding="utf-8")
        template, chat_tokens = chat_template(sources["target"])
        if template:
            (tmp / "chat_template.jinja").write_text(template, encoding="utf-8")
        if prompts:
            shutil.copy2(prompts, tmp / "prompts.jsonl")
        manifest = Manifest(models=models, tokenizer="tokenizer.json", vocab_size=shared,
                            eos_token_ids=eos_ids, max_context=min(m.max_context for m in models.values()),
                            max_draft_tokens=k, generation=generation,
                            prompts="prompts.jsonl" if prompts else None,
                            chat_template="chat_template.jinja" if template else None, chat_tokens=chat_tokens,
                            created_by=f"specedge {__version__} spec-export")
        manifest.write(tmp)
    if not quiet:
        print(f"wrote {out}", file=sys.stderr)
    return manifest
