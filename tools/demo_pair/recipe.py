"""The demo pair's recipe: its constants and the helpers that train_demo_pair.py (the phases),
train_unlikelihood.py (its `unlikelihood` phase), demo_card.py (the card states the constants) and
eval_demo_pair.py (the held-out overlap) share. Imported by those scripts as a sibling module (their
folder is on sys.path when they run); torch and transformers are imported inside the functions that
need them."""
from __future__ import annotations

import hashlib
import json
import math
import os
import sysconfig
from pathlib import Path

import numpy as np

SEED = 1234
CONTEXT = 256
VOCAB = 8192
SPECIALS = ["<|endoftext|>", "<|pad|>"]
HELD_OUT_PERCENT = 4
TVD_TEMPERATURE = 0.8    # the sampled benchmark's temperature: --tvd optimises acceptance there

TARGET = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
              num_key_value_heads=2)
# 4 layers cost about what 2 do in onnxruntime (a 128-wide draft's step is mostly its 8k x 128 head
# and per-run overhead) and hold twice the non-embedding weights
DRAFT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2)


def stdlib_files() -> list[Path]:
    """Real code on every machine: the interpreter's own Lib/, without tests and site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts[:-1]) & skip)]
    return sorted(files, key=lambda p: str(p.relative_to(root)))


EXTRA_PACKAGES = ("torch", "transformers", "numpy", "pip", "setuptools", "onnx", "onnxscript", "sympy")


def extra_files() -> list[Path]:
    """More real code for training only: the stdlib's own tests and the sources of the packages
    installed beside this interpreter (the dev venv). Held-out data stays stdlib, never these."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for d in ("test", "idlelib/idle_test") for p in (root / d).rglob("*.py"))
    site = Path(sysconfig.get_paths()["purelib"])
    for name in EXTRA_PACKAGES:
        files += sorted((site / name).rglob("*.py"))
    return files


def is_held_out(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 100 < HELD_OUT_PERCENT


def build(kind: str, dims: dict | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dims or (TARGET if kind == "target" else DRAFT)
    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=1024, tie_word_embeddings=True,
                      bos_token_id=0, eos_token_id=0, pad_token_id=1, rope_theta=10000.0, **dims)
    return LlamaForCausalLM(cfg)


def stdlib_train_tokens(work: Path) -> np.ndarray:
    """The stdlib's own (non-held-out) sources alone: half of every batch comes from them, so the
    held-out stdlib style is not drowned by the larger extra corpus."""
    path = work / "train_stdlib.bin"
    if not path.exists():
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(work / "tokenizer.json"))
        root = Path(sysconfig.get_paths()["stdlib"])
        texts = [p.read_text(encoding="utf-8") for p in stdlib_files() if not is_held_out(str(p.relative_to(root)))]
        ids = [t for enc in tok.encode_batch(texts) for t in enc.ids + [tok.token_to_id(SPECIALS[0])]]
        np.asarray(ids, dtype=np.uint16).tofile(path)
    return np.fromfile(path, dtype=np.uint16)


def batches(sources: list[np.ndarray], *, batch: int, rng: np.random.Generator):
    """Random windows, an equal share of the batch from each source."""
    import torch
    rows = []
    for i in range(batch):
        data = sources[i % len(sources)]
        s = int(rng.integers(0, len(data) - CONTEXT - 1))
        rows.append(data[s:s + CONTEXT + 1])
    x = np.stack(rows).astype(np.int64)
    return torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:])


def evaluate(model, work: Path, *, windows: int = 64) -> dict:
    """Held-out loss, top-1 accuracy and bits per byte on fixed, non-overlapping windows."""
    import torch
    data = np.fromfile(work / "heldout.bin", dtype=np.uint16)
    meta = json.loads((work / "data.json").read_text())
    step = max(CONTEXT + 1, (len(data) - CONTEXT - 1) // windows)
    nll, correct, count = 0.0, 0, 0
    dev = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        for s in range(0, len(data) - CONTEXT - 1, step)[:windows]:
            x = torch.from_numpy(data[s:s + CONTEXT + 1].astype(np.int64))[None].to(dev)
            logits = model(input_ids=x[:, :-1]).logits.float()
            nll += torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
            correct += (logits[0].argmax(-1) == x[0, 1:]).sum().item()
            count += CONTEXT
    model.train()
    bytes_per_token = meta["bytes_heldout"] / meta["tokens_heldout"]
    return {"loss": nll / count, "top1": correct / count,
            "bits_per_byte": nll / count / math.log(2) / bytes_per_token}


def continuation(model, prefixes, new: int, pick):
    """[B, new] tokens after `prefixes` [B, P], one cached step each; pick: last logits [B, V] -> [B, 1]."""
    import torch
    toks = []
    with torch.no_grad():
        out = model(input_ids=prefixes, use_cache=True)
        for _ in range(new):
            toks.append(pick(out.logits[:, -1]))
            out = model(input_ids=toks[-1], cache=out.cache if hasattr(out, "cache") else out.past_key_values,
                        use_cache=True)
    return torch.cat(toks, 1)


def save(ckpt: Path, model, opt, state: dict, work: Path) -> None:
    import torch
    state["log"].append({"step": state["step"], "tokens": state["tokens"], **evaluate(model, work, windows=16)})
    print("eval", state["log"][-1], flush=True)
    tmp = ckpt.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)
    os.replace(tmp, ckpt)


def function_openings(text: str):
    """(context + `def ...:` line + the body's indent, match) for every function in `text`."""
    import re
    for m in re.finditer(r"^([ \t]*)def [^\n]*:\n", text, flags=re.M):
        start = max(0, text.rfind("\n", 0, max(0, m.start() - 400)) + 1)
        yield text[start:m.end()] + m.group(1) + "    ", m
