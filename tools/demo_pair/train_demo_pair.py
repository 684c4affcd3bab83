"""Train the demo pair (a Llama target and a small Llama draft) on the Python standard library.

Dev-time tool (torch + transformers). Deterministic (seeded) and resumable: every phase keeps its
state under --work (default ~/.cache/specedge/demo), outside the git tree, and picks up where it
stopped. Phases, run in order (each one needs the previous):

  data      collect stdlib .py files, split held-out BY FILE, train an 8k byte-level BPE,
            tokenize train/held-out into uint16 files
  target    train the target (LlamaForCausalLM, GQA) at constant LR after warm-up
            (warm-up/stable/decay: the budget is open-ended, a cool-down ends it)
  draft     train the draft: KL to the (frozen) target's distribution plus a little CE on the
            corpus; its tied embedding starts as the target's, projected to its width (SVD);
            --tvd W adds W x the total variation distance at T=0.8 (1 - alpha there); --shape LxH
            trains a draft of another size (4x128 by default)
  cooldown  linear decay of the LR to 0 over --steps steps for --model target|draft
  unlikelihood  fine-tune the cooled target against its greedy loops: sequence-level unlikelihood
            (Welleck et al. 2020) on the repeated n-grams of its own greedy continuations of
            training-file function openings, anchored by KL to the target as it was; LR decays to 0
  teacher   (instead of data..unlikelihood's target) target.pt from the packaged models/target, to
            distil a draft from the shipped target elsewhere (tools/demo_pair/gpu_train_pair.sh, DRAFT_ONLY=1)
  package   write both as Hugging Face folders (fp16 safetensors, config, generation_config,
            tokenizer) into --out, plus held-out prompts and figures for the model card

  python tools/demo_pair/train_demo_pair.py data
  python tools/demo_pair/train_demo_pair.py target --minutes 150 --threads 1      # resumable; --until-step N
  python tools/demo_pair/train_demo_pair.py draft --minutes 60
  python tools/demo_pair/train_demo_pair.py cooldown --model target --steps 400
  python tools/demo_pair/train_demo_pair.py unlikelihood                          # needs the cooled target
  python tools/demo_pair/train_demo_pair.py package --out models/
Runs on CUDA when one is present (same recipe, bigger throughput).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sysconfig
import time
from pathlib import Path

import numpy as np

from recipe import (CONTEXT, DRAFT, SEED, SPECIALS, TARGET, TVD_TEMPERATURE, VOCAB, batches, build, continuation,
                    extra_files, function_openings, is_held_out, save, stdlib_files, stdlib_train_tokens)


def phase_data(work: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = Path(sysconfig.get_paths()["stdlib"])
    train_txt, held_txt, held_files = [], [], []
    for p in stdlib_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = str(p.relative_to(root))
        (held_txt if is_held_out(rel) else train_txt).append(text)
        if is_held_out(rel):
            held_files.append(rel)
    if (work / "tokenizer.json").is_file():     # a checkpoint may already depend on it
        tok = Tokenizer.from_file(str(work / "tokenizer.json"))
    else:
        tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, min_frequency=2,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(train_txt, trainer=trainer)
    # vendored copies of stdlib modules (setuptools/_distutils, importlib_metadata) would leak held-out code
    held_lines = {ln.strip() for t in held_txt for ln in t.splitlines() if len(ln.strip()) > 20}
    extra, skipped = [], 0
    for p in extra_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines = [ln.strip() for ln in text.splitlines() if len(ln.strip()) > 20]
        if lines and sum(ln in held_lines for ln in lines) > 0.3 * len(lines):
            skipped += 1
            continue
        extra.append(text)
    print(f"stdlib train {len(train_txt)} files, held out {len(held_txt)}, extra {len(extra)} files "
          f"({skipped} near-copies of held-out files skipped)")
    train_txt += extra
    work.mkdir(parents=True, exist_ok=True)
    tok.save(str(work / "tokenizer.json"))
    eos = tok.token_to_id(SPECIALS[0])
    for name, texts in (("train", train_txt), ("heldout", held_txt)):
        ids: list[int] = []
        for enc in tok.encode_batch(texts):
            ids.extend(enc.ids)
            ids.append(eos)
        np.asarray(ids, dtype=np.uint16).tofile(work / f"{name}.bin")
    meta = {"files_train": len(train_txt), "files_heldout": len(held_txt), "heldout_files": held_files,
            "bytes_train": sum(len(t.encode()) for t in train_txt),
            "bytes_heldout": sum(len(t.encode()) for t in held_txt),
            "tokens_train": int(os.path.getsize(work / "train.bin") // 2),
            "tokens_heldout": int(os.path.getsize(work / "heldout.bin") // 2), "stdlib": str(root)}
    (work / "data.json").write_text(json.dumps(meta, indent=1))
    print({k: v for k, v in meta.items() if k != "heldout_files"})


def draft_shape(shape: str) -> dict:
    """"LxH" or "LxHxM" -> a draft of L layers, hidden H, MLP M (default 3H), head_dim 32, 2 KV heads
    (DRAFT is "4x128"). Width is cheaper than depth at one token a step (docs/benchmarks.md)."""
    try:
        dims = [int(v) for v in shape.lower().split("x")]
        if len(dims) not in (2, 3):
            raise ValueError(shape)
    except ValueError:
        raise SystemExit(f"--shape takes LAYERSxHIDDEN[xMLP], e.g. 4x192 or 3x128x768; got {shape!r}") from None
    layers, hidden, mlp = dims if len(dims) == 3 else (*dims, 3 * dims[1])
    if layers < 1 or hidden < 64 or hidden % 64 or mlp < 1:
        raise SystemExit(f"--shape {shape}: need >= 1 layer, a hidden size that is a multiple of 64 and an MLP >= 1")
    return dict(hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                num_attention_heads=hidden // 32, num_key_value_heads=2)


def init_draft_embedding(model, emb) -> None:
    """Start the draft's tied embedding as the target's `emb`, projected onto its top principal directions:
    the draft begins with the target's token geometry (which tokens the target confuses with which)."""
    import torch
    u, s, _ = torch.linalg.svd(emb.float(), full_matrices=False)           # [vocab, 384], [384]
    width = model.config.hidden_size
    proj = u[:, :width] * s[:width]                                          # [vocab, width]
    proj *= model.model.embed_tokens.weight.std() / proj.std()               # keep the init's scale
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(proj)
    print(f"draft embedding from the target's: top {width} directions keep "
          f"{(s[:width] ** 2).sum() / (s ** 2).sum():.1%} of its energy")


def target_continued(teacher, x, y, *, rows: int, seed: int):
    """The first `rows` rows keep their first half and the target samples the rest at T=0.8: the draft
    learns the contexts the sampled benchmark puts it in (on-policy data, as in DistillSpec / GKD)."""
    import torch
    gen = torch.Generator(x.device).manual_seed(seed)
    full = torch.cat([x[:rows], y[:rows, -1:]], 1)                   # [rows, CONTEXT + 1]
    half = full.shape[1] // 2
    pick = lambda logits: torch.multinomial(torch.softmax(logits.float() / TVD_TEMPERATURE, -1), 1, generator=gen)
    seq = torch.cat([full[:, :half], continuation(teacher, full[:, :half], full.shape[1] - half, pick)], 1)
    x, y = x.clone(), y.clone()
    x[:rows], y[:rows] = seq[:, :-1], seq[:, 1:]
    return x, y


def lr_at(step: int, *, base: float, warmup: int, cooldown: tuple[int, int] | None, warm_from: int = 0) -> float:
    if step - warm_from < warmup:
        return base * (step - warm_from + 1) / warmup
    if cooldown is None:
        return base
    start, length = cooldown
    return base * max(0.0, 1.0 - (step - start) / length)


def kept_option(state: dict, key: str, field: str, value, *, flag: str, ckpt: Path) -> dict:
    """A loss option the checkpoint keeps from the step it was first given ({field, "from"}); it cannot change."""
    cur = state.get(key, {field: 0, "from": None})
    if value is not None and value != cur[field]:
        if cur[field]:
            raise SystemExit(f"{ckpt} trains with {flag} {cur[field]:g} since step {cur['from']}; it cannot change")
        cur = state[key] = {field: value, "from": state["step"]}
        print(f"{flag} {value:g} from step {state['step']}")
    return cur


def train(kind: str, work: Path, args) -> None:
    import torch
    torch.manual_seed(SEED + (kind == "draft"))
    torch.set_num_threads(args.threads)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = work / f"{kind}.pt"
    saved = torch.load(ckpt, map_location=dev, weights_only=False) if ckpt.exists() else None
    # the draft's dims: the checkpoint's (DRAFT before they were recorded), else --shape, else DRAFT
    shape = draft_shape(args.shape) if kind == "draft" and getattr(args, "shape", None) else None
    if kind == "target":
        dims = TARGET
    elif saved:
        dims = saved["state"].get("dims", DRAFT)
        if shape and shape != dims:
            raise SystemExit(f"--shape {args.shape} differs from {ckpt}'s draft {dims}; use another --work")
    else:
        dims = shape or DRAFT
    model = build(kind, dims).to(dev)
    base_lr = 2e-3 if kind == "target" else 3e-3
    opt = torch.optim.AdamW(model.parameters(), lr=base_lr, betas=(0.9, 0.95), weight_decay=0.1)
    state = {"step": 0, "tokens": 0, "seconds": 0.0, "cooldown": None, "log": [], "dims": dims}
    teacher = None
    if kind == "draft":     # built after the draft, so the draft's random init does not depend on it
        teacher = build("target").to(dev)
        t_saved = torch.load(work / "target.pt", map_location=dev, weights_only=False)
        teacher.load_state_dict(t_saved["model"])
        teacher.eval().requires_grad_(False)
    if saved:
        if saved.get("opt") is None:
            raise SystemExit(f"{ckpt} was imported from {saved['state'].get('imported_from')} (no optimizer "
                             "state): it can teach a draft, not be trained on")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        print(f"resumed {kind} at step {state['step']} ({state['tokens'] / 1e6:.1f} M tokens)")
    elif kind == "draft":
        init_draft_embedding(model, teacher.model.embed_tokens.weight)
    if teacher is not None:   # which target each stretch distilled from: the card orders its commands by it
        t_step = t_saved["state"]["step"]
        # a checkpoint from before this record distilled from the target as it was before any fine-tune
        first = (t_saved["state"].get("unlikelihood") or {}).get("from", t_step) if state["step"] else t_step
        teachers = state.setdefault("teachers", [{"from": 0, "target_step": first}])
        if teachers[-1]["target_step"] != t_step:
            teachers.append({"from": state["step"], "target_step": t_step})
            print(f"draft: distils from the target at its step {t_step} from draft step {state['step']}")
    cd = state["cooldown"]
    if getattr(args, "rewarm", False) and not (cd is None and state.get("stages")):   # (else: resumed re-warm)
        if cd is None or state["step"] < cd[0] + cd[1]:
            raise SystemExit(f"--rewarm continues a {kind} whose cool-down has finished; {ckpt} has none finished: "
                             f"run `{kind}` without --rewarm")
        # warm-up/stable/decay again from the cooled weights: the budget grows, the recipe stays one command list
        state.setdefault("stages", []).append({"step": state["step"], "cooldown": cd, "lr": state.get("lr")})
        state["cooldown"], state["warm_from"] = None, state["step"]
        state["lr"] = getattr(args, "lr", None)      # this stage's peak LR (None: the base LR)
        print(f"re-warming {kind} from step {state['step']} to LR {state['lr'] or base_lr:g}")
    elif getattr(args, "lr", None) is not None and args.lr != state.get("lr"):
        raise SystemExit(f"--lr sets the peak LR of a --rewarm stage; {ckpt}'s stage runs at "
                         f"{state.get('lr') or base_lr:g}")
    tvd = kept_option(state, "tvd", "weight", getattr(args, "tvd", None), flag="--tvd", ckpt=ckpt)
    onp = kept_option(state, "on_policy", "rows", getattr(args, "on_policy", None), flag="--on-policy", ckpt=ckpt)
    if args.phase == "cooldown":
        if state["cooldown"] is None:
            state["cooldown"] = (state["step"], args.steps)
    data = [stdlib_train_tokens(work), np.fromfile(work / "train.bin", dtype=np.uint16)]
    stop = []       # SIGTERM / SIGINT (a session ending) -> save a checkpoint, then exit
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    t_end = time.time() + 60 * args.minutes
    t_save = time.time()
    t0 = time.time()
    while time.time() < t_end and not stop:
        cd = state["cooldown"]
        if cd is not None and state["step"] >= cd[0] + cd[1]:
            break
        if args.until_step is not None and state["step"] >= args.until_step:
            break
        lr = lr_at(state["step"], base=state.get("lr") or base_lr, warmup=200, cooldown=cd,
                   warm_from=state.get("warm_from", 0))
        for g in opt.param_groups:
            g["lr"] = lr
        # batches depend on the step alone: a run resumed anywhere sees the same data as one that never stopped
        t_step = time.time()
        rng = np.random.default_rng([SEED, state["step"], kind == "draft"])
        x, y = batches(data, batch=args.batch, rng=rng)
        x, y = x.to(dev), y.to(dev)
        if teacher is not None and onp["rows"]:
            x, y = target_continued(teacher, x, y, rows=onp["rows"], seed=int(rng.integers(1 << 62)))
        # bf16 autocast (fp32 master weights and optimizer): much faster than fp32 where the CPU has
        # bf16 units (docs/benchmarks.md)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=x).logits.float()
            if teacher is not None:
                with torch.no_grad():
                    t_logits = teacher(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        if teacher is not None:
            with torch.no_grad():
                t_logp = torch.log_softmax(t_logits, -1)
            kl = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), t_logp, log_target=True,
                                            reduction="batchmean") / CONTEXT
            loss = 0.1 * loss + 0.9 * kl     # acceptance is agreement with the target, not with the corpus
            if tvd["weight"]:   # 1 - alpha at temperature T is this total variation distance (DistillSpec)
                p_t = torch.softmax(t_logits / TVD_TEMPERATURE, -1)
                q_t = torch.softmax(logits / TVD_TEMPERATURE, -1)
                loss = loss + tvd["weight"] * 0.5 * (p_t - q_t).abs().sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += x.numel()
        state["seconds"] += time.time() - t_step
        if state["step"] % 50 == 0:
            el = time.time() - t0
            print(f"{kind} step {state['step']} loss {loss.item():.3f} lr {lr:.2e} "
                  f"{state['tokens'] / 1e6:.2f} M tok  {x.numel() * 50 / max(el, 1e-9):.0f} tok/s", flush=True)
            t0 = time.time()
        if time.time() - t_save > 600:
            save(ckpt, model, opt, state, work)
            t_save = time.time()
    save(ckpt, model, opt, state, work)


def held_out_prompts(work: Path, *, n_function: int = 60, n_edit: int = 24) -> list[dict]:
    """Prompts from held-out files only: function openings (context + `def ...:` line) and
    edit-style continuations (context ending at a line boundary inside a function body)."""
    root = Path(json.loads((work / "data.json").read_text())["stdlib"])
    rng = np.random.default_rng(SEED)
    funcs, edits = [], []
    for rel in json.loads((work / "data.json").read_text())["heldout_files"]:
        text = (root / rel).read_text(encoding="utf-8")
        for prompt, m in function_openings(text):
            funcs.append({"prompt": prompt, "kind": "function", "file": rel})
            body_end = text.find("\n\n", m.end())
            lines = [i for i in range(m.end(), body_end if body_end > 0 else len(text)) if text[i] == "\n"]
            if len(lines) >= 4:
                cut = lines[len(lines) // 2] + 1
                edits.append({"prompt": text[max(0, text.rfind("\n", 0, cut - 600) + 1):cut], "kind": "edit",
                              "file": rel})
    pick = lambda xs, n: [xs[i] for i in sorted(rng.choice(len(xs), size=min(n, len(xs)), replace=False))]
    return pick(funcs, n_function) + pick(edits, n_edit)


def package(work: Path, out: Path) -> None:
    """Write both models as Hugging Face folders (fp16 safetensors) plus tokenizer and prompts, into a
    temporary folder renamed over `out` at the end: an interrupted run leaves the old pair whole."""
    import torch
    from transformers import GenerationConfig

    stage = out.with_name(out.name + ".partial")
    shutil.rmtree(stage, ignore_errors=True)
    for kind in ("target", "draft"):
        saved = torch.load(work / f"{kind}.pt", map_location="cpu", weights_only=False)
        model = build(kind, saved["state"].get("dims"))
        model.load_state_dict(saved["model"])
        dst = stage / kind
        model.half().save_pretrained(dst, safe_serialization=True)
        GenerationConfig(eos_token_id=0, pad_token_id=1, do_sample=False).save_pretrained(dst)
        shutil.copy2(work / "tokenizer.json", dst / "tokenizer.json")
        (dst / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": SPECIALS[0], "pad_token": SPECIALS[1],
             "model_max_length": 1024}, indent=1))
        (dst / "training_log.json").write_text(json.dumps(saved["state"]["log"], indent=1))
    with open(stage / "prompts.jsonl", "w") as f:
        for p in held_out_prompts(work):
            f.write(json.dumps(p) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("target", "draft", "prompts.jsonl"):     # keep anything else in out/ (the model card)
        if (out / name).is_dir():
            shutil.rmtree(out / name)
        os.replace(stage / name, out / name)
    stage.rmdir()
    print(f"wrote {out}/target, {out}/draft, {out}/prompts.jsonl")


def pack(work: Path, out: Path) -> None:
    """Everything a GPU machine needs to train the pair, under the device tool's 64 MiB: the token
    files xz-compressed (~4x), the tokenizer and data.json. Held-out prompts stay here (they read
    this machine's stdlib), so `package` runs here on the weights that come back."""
    import lzma
    out.mkdir(parents=True, exist_ok=True)
    for name in ("train.bin", "train_stdlib.bin", "heldout.bin"):
        with open(work / name, "rb") as src, lzma.open(out / f"{name}.xz", "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
    for name in ("tokenizer.json", "data.json"):
        shutil.copy2(work / name, out / name)
    print(f"packed {out}: {sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB")


def slim(work: Path, out: Path, kinds: tuple[str, ...] = ("target", "draft")) -> None:
    """fp16 weights + training state of the checkpoints (no optimizer): what a device run returns."""
    import torch
    out.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        saved = torch.load(work / f"{kind}.pt", map_location="cpu", weights_only=False)
        model = {k: v.half() for k, v in saved["model"].items()}
        torch.save({"model": model, "state": saved["state"]}, out / f"{kind}.pt")


def import_teacher(src: Path, work: Path) -> None:
    """work/target.pt from a packaged target folder (models/target): a draft can then be distilled from
    the shipped target where its training checkpoints are not (a GPU machine gets the repo, not ~/.cache)."""
    import torch
    from transformers import AutoModelForCausalLM
    ckpt = work / "target.pt"
    if ckpt.exists():
        raise SystemExit(f"{ckpt} exists; `teacher` writes a fresh work folder's target (use another --work)")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    got = {k: getattr(model.config, k) for k in TARGET}
    if got != TARGET:
        raise SystemExit(f"{src} is not a demo target: {got} != {TARGET}")
    log = json.loads((src / "training_log.json").read_text())
    state = {"step": log[-1]["step"], "tokens": log[-1]["tokens"], "seconds": 0.0, "cooldown": None, "log": log,
             "imported_from": str(src)}
    work.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": None, "state": state}, ckpt)
    print(f"wrote {ckpt} from {src} (its step {state['step']})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phase", choices=["data", "target", "draft", "cooldown", "unlikelihood", "package", "pack",
                                     "slim", "teacher"])
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "specedge" / "demo")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in plain fp32")
    ap.add_argument("--model", choices=["target", "draft"], default="target")
    ap.add_argument("--steps", type=int, default=400, help="cool-down length in steps")
    ap.add_argument("--until-step", type=int, default=None,
                    help="target/draft: stop at this step (to reproduce a recorded run exactly)")
    ap.add_argument("--rewarm", action="store_true",
                    help="target/draft: train on after a finished cool-down (LR warms up again; cool down later)")
    ap.add_argument("--lr", type=float, default=None,
                    help="with --rewarm: the new stage's peak LR (kept by the checkpoint; default the base LR)")
    ap.add_argument("--tvd", type=float, default=None,
                    help="draft: add W x total variation distance to the target at T=0.8 (kept by the checkpoint)")
    ap.add_argument("--on-policy", type=int, default=None, metavar="ROWS",
                    help="draft: ROWS of each batch continued by the target's T=0.8 samples (kept by the checkpoint)")
    ap.add_argument("--shape", default=None, metavar="LxH",
                    help="draft: layers x hidden [x MLP] of a new draft, e.g. 4x192 or 3x128x768 (kept by the checkpoint; "
                         "default 4x128, MLP 3 x hidden)")
    ap.add_argument("--from", dest="src", type=Path, default=Path("models/target"),
                    help="teacher: the packaged target folder to distil from")
    ap.add_argument("--out", type=Path, default=Path("models"))
    ap.add_argument("--kinds", default="target,draft", choices=("target,draft", "draft", "target"),
                    help="slim: which checkpoints")
    args = ap.parse_args(argv)
    if args.phase == "data":
        phase_data(args.work)
    elif args.phase in ("target", "draft"):
        train(args.phase, args.work, args)
    elif args.phase == "cooldown":
        train(args.model, args.work, args)
    elif args.phase == "unlikelihood":
        from train_unlikelihood import unlikelihood
        unlikelihood(args.work, args)
    elif args.phase == "teacher":
        import_teacher(args.src, args.work)
    elif args.phase == "pack":
        pack(args.work, args.out)
    elif args.phase == "slim":
        slim(args.work, args.out, tuple(args.kinds.split(",")))
    else:
        package(args.work, args.out)


if __name__ == "__main__":
    main()
