#!/usr/bin/env python3
"""Train SmolLM2's EAGLE-style draft head on the shards of make_data.py (the target's own answers,
its hidden states and top-k log-probabilities), resumable: a checkpoint every --save-every steps under
--work, and a rerun continues from the last one. --eval only measures a checkpoint.

    python tools/smollm2/train_draft.py --model ~/.cache/specedge/smollm2/hf \
        --data ~/.cache/specedge/smollm2/data --work ~/.cache/specedge/smollm2/eagle

Loss per position j (Li et al. 2024, with a second unrolled pass on the head's own predictions, as at
drafting time): cross-entropy of the head's q against the target's top-k law at j+1, plus smooth-L1 of
the predicted feature against the target's f_{j+1}. Held out: the shards with index % 20 == 19.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from specedge.export.eagle_train import batch_tensors, chain_alpha, losses, vocab_subset
from specedge.runtime.files import write_atomic

HELD_OUT = 19     # shard index % 20
ORIGIN = "origin.json"   # in --work: the saved head a run started from (--init-from) and its training
RUN = "run.json"         # in --work: the run's settings, recorded by its first invocation


def shard_paths(data: Path, *, held_out: bool) -> list[Path]:
    """The target's answers (shard_*: every 20th held out) and, for training, its reading of the corpus
    (corpus_*: make_data.py --corpus)."""
    out = []
    for p in sorted(data.glob("shard_*.safetensors")):
        idx = int(p.stem.split("_")[1])
        if (idx % 20 == HELD_OUT) == held_out:
            out.append(p)
    return out if held_out else out + sorted(data.glob("corpus_*.safetensors"))


def load_sequences(paths: list[Path], max_len: int) -> list[dict]:
    from safetensors.numpy import load_file
    seqs = []
    for p in paths:
        d = load_file(str(p))
        o = d["offsets"]
        for i in range(len(o) - 1):
            a, b = int(o[i]), int(o[i + 1])
            b = min(b, a + max_len)
            if b - a < 4:
                continue
            seqs.append({"tokens": d["tokens"][a:b], "hidden": d["hidden"][a:b], "topk_ids": d["topk_ids"][a:b],
                         "topk_logprob": d["topk_logprob"][a:b], "n_prompt": int(d["n_prompt"][i])})
    return seqs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--vocab", type=int, default=8192, help="tokens the draft's LM head covers")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--unroll", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval", action="store_true", help="only measure the latest checkpoint")
    ap.add_argument("--init-from", type=Path, help="start a new run from a saved draft folder (its weights; "
                    "fresh optimizer state) instead of from the target")
    ap.add_argument("--save-draft", type=Path, help="write the latest checkpoint as a draft folder spec-export "
                    "reads (fp16 safetensors, config, the target's tokenizer) and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from transformers import AutoModelForCausalLM
    from specedge.export.eagle import EagleHead

    args.work.mkdir(parents=True, exist_ok=True)
    ckpt = args.work / "head.pt"
    train_paths = shard_paths(args.data, held_out=False)
    eval_seqs = load_sequences(shard_paths(args.data, held_out=True), args.max_len)
    state = torch.load(ckpt, weights_only=True) if ckpt.exists() else None
    if state is None:
        seqs = load_sequences(train_paths, args.max_len)
        subset, covered = vocab_subset(seqs, args.vocab, _config(args.model).vocab_size)
        print(json.dumps({"vocab": len(subset), "argmax_coverage": covered, "train_sequences": len(seqs)}), flush=True)
        if args.init_from:
            from specedge.export.eagle import load_head
            head = load_head(args.init_from, target=args.model)
            head.model.embed_tokens.weight.requires_grad_(False)
            write_atomic(args.work / ORIGIN, json.dumps(_origin(args.init_from)) + "\n")
        else:
            target = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
            head = EagleHead.from_target(target, torch.from_numpy(subset))
            del target
        step = 0
    else:
        head = EagleHead(_config(args.model), state["model"]["vocab_map"])
        head.load_state_dict(state["model"])
        head.model.embed_tokens.weight.requires_grad_(False)
        step = state["step"]
    index = np.full(head.config.vocab_size, -1, dtype=np.int64)
    index[head.vocab_map.numpy()] = np.arange(len(head.vocab_map))
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    if state is not None:
        opt.load_state_dict(state["opt"])
    log = args.work / "log.jsonl"
    if args.save_draft:
        from specedge.export.eagle import save_head
        history = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        # a run that started from a saved head records that head's own training (`continued_from`)
        origin = (json.loads((args.work / ORIGIN).read_text()) if (args.work / ORIGIN).is_file()
                  else _origin(args.init_from) if args.init_from else None)
        # the settings the run trained with, not this invocation's defaults
        run = (json.loads((args.work / RUN).read_text()) if (args.work / RUN).is_file() else
               {"batch": args.batch, "lr": args.lr, "unroll": args.unroll, "noise": args.noise})
        save_head(head, args.save_draft, tokenizer_json=(args.model / "tokenizer.json").read_text(encoding="utf-8"),
                  extra={"training": {**run, "steps": step, "last_eval": history[-1] if history else None,
                                      "continued_from": origin}})
        print(f"draft head at step {step} -> {args.save_draft}")
        return
    if args.eval or step >= args.steps:
        head.eval()
        print(json.dumps({"step": step, **chain_alpha(head, eval_seqs, head.vocab_map)}), flush=True)
        return
    if not (args.work / RUN).is_file():
        write_atomic(args.work / RUN, json.dumps({"batch": args.batch, "lr": args.lr, "unroll": args.unroll,
                                                  "noise": args.noise, "schedule_steps": args.steps,
                                                  "max_len": args.max_len, "seed": args.seed}) + "\n")
    loaded = set(train_paths)
    seqs = load_sequences(train_paths, args.max_len)
    rng = random.Random(args.seed + step)
    t0, seen = time.time(), 0
    head.train()
    while step < args.steps:
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = rng.sample(seqs, min(args.batch, len(seqs)))
        tensors = batch_tensors(batch, index)
        loss, parts = losses(head, *tensors, noise=args.noise, unroll=args.unroll)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        seen += int(tensors[-1].sum())
        if step % 20 == 0:
            print(json.dumps({"step": step, "loss": round(float(loss.detach()), 4), **{k: round(v, 4) for k, v in parts.items()},
                              "lr": lr, "tok_s": round(seen / (time.time() - t0))}), flush=True)
        if step % args.save_every == 0 or step == args.steps:
            if not eval_seqs:          # the held-out shards may have been written since the start
                eval_seqs = load_sequences(shard_paths(args.data, held_out=True), args.max_len)
            head.eval()
            ev = chain_alpha(head, eval_seqs[:24], head.vocab_map)
            head.train()
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": head.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
            with open(log, "a") as f:
                f.write(json.dumps({"step": step, "time": time.time(), **ev}) + "\n")
            print(json.dumps({"step": step, "eval": ev}), flush=True)
            fresh = [p for p in shard_paths(args.data, held_out=False) if p not in loaded]
            if fresh:                 # shards make_data.py wrote meanwhile join the pool
                seqs += load_sequences(fresh, args.max_len)
                loaded.update(fresh)


def _origin(folder: Path) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    return {"init_from": str(folder), "training": cfg.get("training")}


def _config(model: Path):
    from transformers import AutoConfig
    from specedge.export.eagle import head_config
    return head_config(AutoConfig.from_pretrained(model))


if __name__ == "__main__":
    main()
