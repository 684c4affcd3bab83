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
import torch.nn.functional as F

HELD_OUT = 19     # shard index % 20


def shard_paths(data: Path, *, held_out: bool) -> list[Path]:
    out = []
    for p in sorted(data.glob("shard_*.safetensors")):
        idx = int(p.stem.split("_")[1])
        if (idx % 20 == HELD_OUT) == held_out:
            out.append(p)
    return out


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


def vocab_subset(seqs: list[dict], size: int, vocab: int) -> tuple[np.ndarray, float]:
    """The `size` tokens the target most often ranks first in the data, then the lowest ids (a BPE
    vocabulary's earliest merges are its most frequent tokens); and the share of first-ranked tokens
    in the data that they cover."""
    counts = np.bincount(np.concatenate([s["topk_ids"][:, 0] for s in seqs]), minlength=vocab)
    order = np.lexsort((np.arange(vocab), -counts))[:size]      # by count, ties by id
    covered = counts[order].sum() / max(1, counts.sum())
    return np.sort(order), float(covered)


def batch_tensors(seqs: list[dict], index: np.ndarray):
    """Pad a batch; inputs are (t_{j+1}, f_j) for j < L-1, targets are f_{j+1} and the top-k law at j+1."""
    n = max(len(s["tokens"]) for s in seqs) - 1
    b = len(seqs)
    ids = torch.zeros(b, n, dtype=torch.long)
    feats = torch.zeros(b, n, seqs[0]["hidden"].shape[1])
    tgt_f = torch.zeros_like(feats)
    k = seqs[0]["topk_ids"].shape[1]
    tgt_ids = torch.full((b, n, k), -1, dtype=torch.long)
    tgt_lp = torch.full((b, n, k), -1e4)
    mask = torch.zeros(b, n)
    for r, s in enumerate(seqs):
        L = len(s["tokens"]) - 1
        ids[r, :L] = torch.from_numpy(s["tokens"][1:L + 1].astype(np.int64))
        feats[r, :L] = torch.from_numpy(s["hidden"][:L].astype(np.float32))
        tgt_f[r, :L] = torch.from_numpy(s["hidden"][1:L + 1].astype(np.float32))
        mapped = index[s["topk_ids"][1:L + 1]]                     # -1 outside the head's vocabulary
        tgt_ids[r, :L] = torch.from_numpy(mapped.astype(np.int64))
        tgt_lp[r, :L] = torch.from_numpy(s["topk_logprob"][1:L + 1].astype(np.float32))
        mask[r, :L] = 1
    tgt_lp = torch.where(tgt_ids >= 0, tgt_lp, torch.full_like(tgt_lp, -1e4))
    tgt_p = torch.softmax(tgt_lp, -1)                              # renormalised over the covered top-k
    return ids, feats, tgt_f, tgt_ids.clamp(min=0), tgt_p, mask


def losses(head, ids, feats, tgt_f, tgt_ids, tgt_p, mask, *, noise: float, unroll: int):
    total, parts = 0.0, {}
    inp = feats + noise * (torch.rand_like(feats) * 2 - 1) if noise else feats
    for step in range(unroll):
        logits, h = head(ids, inp)
        logq = torch.log_softmax(logits, -1)
        ce = -(tgt_p * torch.gather(logq, -1, tgt_ids)).sum(-1)
        reg = F.smooth_l1_loss(h, tgt_f, reduction="none").mean(-1)
        denom = mask.sum()
        ce, reg = (ce * mask).sum() / denom, (reg * mask).sum() / denom
        total = total + ce + 0.5 * reg
        parts[f"ce{step}"], parts[f"reg{step}"] = ce.item(), reg.item()
        # next pass: position j reads the head's prediction of f_j (made at j-1) instead of the real one
        inp = torch.cat([feats[:, :1], h[:, :-1]], 1)
    return total / unroll, parts


@torch.no_grad()
def chain_alpha(head, seqs: list[dict], index_map: torch.Tensor, *, k: int = 4, max_starts: int = 64) -> dict:
    """Greedy drafting as the runtime does it: at each answer position j, the head sees the real features
    up to j and drafts k tokens, feeding its own predictions; a draft is accepted while it equals the
    target's argmax. Returns alpha (accepted / evaluated) and the mean accepted length."""
    from transformers import DynamicCache
    accepted = evaluated = rounds = 0
    top1 = 0
    for s in seqs:
        tokens = torch.from_numpy(s["tokens"].astype(np.int64))
        feats = torch.from_numpy(s["hidden"].astype(np.float32))
        argmax = torch.from_numpy(s["topk_ids"][:, 0].astype(np.int64))
        L = len(tokens)
        starts = list(range(max(0, s["n_prompt"] - 1), L - k - 1))[:max_starts]
        if not starts:
            continue
        cache = DynamicCache()
        first = starts[0]
        if first:
            head(tokens[1:first + 1][None], feats[:first][None], cache=cache,
                 position_ids=torch.arange(first)[None])
        for j in starts:
            _crop(cache, j)
            logits, h = head(tokens[j + 1:j + 2][None], feats[j:j + 1][None], cache=cache,
                             position_ids=torch.tensor([[j]]))
            n_ok = 0
            for d in range(k):
                draft = int(index_map[int(logits[0, -1].argmax())])
                if draft != int(argmax[j + 1 + d]):
                    break
                n_ok += 1
                if d + 1 < k:
                    logits, h = head(torch.tensor([[draft]]), h[:, -1:], cache=cache,
                                     position_ids=torch.tensor([[j + 1 + d]]))
            top1 += n_ok > 0
            accepted += n_ok
            evaluated += n_ok + (n_ok < k)
            rounds += 1
            _crop(cache, j + 1)
    return {"alpha": accepted / max(1, evaluated), "accepted_per_round": accepted / max(1, rounds),
            "top1": top1 / max(1, rounds), "rounds": rounds, "k": k}


def _crop(cache, n: int) -> None:
    """Keep the first n positions of every layer of a DynamicCache."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, :n], layer.values[:, :, :n]


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
    if args.eval or step >= args.steps:
        head.eval()
        print(json.dumps({"step": step, **chain_alpha(head, eval_seqs, head.vocab_map)}), flush=True)
        return
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
            print(json.dumps({"step": step, "loss": round(float(loss), 4), **{k: round(v, 4) for k, v in parts.items()},
                              "lr": lr, "tok_s": round(seen / (time.time() - t0))}), flush=True)
        if step % args.save_every == 0 or step == args.steps:
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


def _config(model: Path):
    from transformers import AutoConfig
    from specedge.export.eagle import head_config
    return head_config(AutoConfig.from_pretrained(model))


if __name__ == "__main__":
    main()
