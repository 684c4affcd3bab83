#!/usr/bin/env python3
"""Distillation data for SmolLM2's draft: the target answers the training prompts (greedy or sampled),
and every position of prompt and answer is stored with the target's final hidden state (fp16) and its
top-k log-probabilities. Shards are written whole (temp file, then rename); a rerun skips the shards
that exist, so the job resumes where it stopped, and `--part i/n` lets n processes share the shards.

    python tools/smollm2/make_data.py --model ~/.cache/specedge/smollm2/hf --out ~/.cache/specedge/smollm2/data
    python tools/smollm2/make_data.py --write-held-out models/smollm2/prompts.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

import prompts as prompt_sets

TOP_K = 32


def render(tok, item: dict) -> list[int]:
    if item["chat"]:
        ids = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}],
                                      add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tok(item["prompt"])["input_ids"]


def _rows(model, hidden, torch):
    """Top-k log-probabilities of each hidden row, in chunks (a full row is 49 152 floats)."""
    vals, idx, lse = [], [], []
    for chunk in torch.split(hidden, 256):
        logits = model.lm_head(chunk).float()
        z = torch.logsumexp(logits, -1)
        v, i = torch.topk(logits, TOP_K, -1)
        vals.append((v - z[:, None]).half()), idx.append(i.int()), lse.append(z)
    return torch.cat(vals), torch.cat(idx), torch.cat(lse)


def generate(model, tok, batch: list[list[int]], *, max_new: int, temperature: float, seed: int, torch):
    from transformers.cache_utils import DynamicCache
    eos = int(tok.eos_token_id)
    n = len(batch)
    width = max(map(len, batch))
    ids = torch.full((n, width), eos, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for r, p in enumerate(batch):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    hidden_steps, out_tokens = [], []
    done = torch.zeros(n, dtype=torch.bool)
    x, step_pos = ids, pos
    for step in range(max_new + 1):
        h = model.model(input_ids=x, attention_mask=mask, position_ids=step_pos, past_key_values=cache,
                        use_cache=True).last_hidden_state
        hidden_steps.append(h)
        if step == max_new or bool(done.all()):
            break
        logits = model.lm_head(h[:, -1]).float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, -1)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
        else:
            nxt = logits.argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
        out_tokens.append(nxt)
        done |= nxt == eos
        x = nxt[:, None]
        mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], -1)
        step_pos = step_pos[:, -1:] + 1
    hidden = torch.cat(hidden_steps, 1)               # [n, width + steps, H]
    gen_ids = torch.stack(out_tokens, 1) if out_tokens else torch.zeros((n, 0), dtype=torch.long)
    seqs = []
    for r, p in enumerate(batch):
        resp = gen_ids[r].tolist()
        if eos in resp:
            resp = resp[:resp.index(eos) + 1]
        # hidden row j holds the state after token j; the last token of a sequence needs none.
        h = hidden[r, width - len(p): width - len(p) + len(p) + len(resp)]
        seqs.append((p + resp, len(p), h))
    return seqs


def write_shard(path: Path, seqs, model, torch) -> int:
    from safetensors.numpy import save_file
    tokens, offsets, n_prompt, hid = [], [0], [], []
    for ids, np_, h in seqs:
        tokens += ids
        offsets.append(len(tokens))
        n_prompt.append(np_)
        hid.append(h[:len(ids)])
    hidden = torch.cat(hid)
    vals, idx, lse = _rows(model, hidden, torch)
    arrays = {"tokens": np.asarray(tokens, np.int32), "offsets": np.asarray(offsets, np.int64),
              "n_prompt": np.asarray(n_prompt, np.int32), "hidden": hidden.half().numpy(),
              "topk_logprob": vals.numpy(), "topk_ids": idx.numpy(), "lse": lse.numpy().astype(np.float32)}
    tmp = path.with_suffix(".tmp")
    save_file(arrays, str(tmp))
    os.replace(tmp, path)
    return len(tokens)


WINDOW, WINDOWS_PER_SHARD = 256, 16


def corpus(model, tok, out: Path, *, part: int, parts: int, torch) -> None:
    """Shards corpus_NNNNN: windows of training-split standard library files, read by the target in one
    pass each (n_prompt 0: every position is the target's own reading of real text)."""
    import sysconfig
    lib = Path(sysconfig.get_paths()["stdlib"])
    windows = []
    for path in prompt_sets.code_files():
        rel = str(path.relative_to(lib))
        if prompt_sets.held_out(rel):
            continue
        try:
            ids = tok(path.read_text(encoding="utf-8"))["input_ids"]
        except (UnicodeDecodeError, OSError):
            continue
        windows += [ids[i:i + WINDOW] for i in range(0, len(ids) - WINDOW + 1, WINDOW)]
    import random
    random.Random(0).shuffle(windows)
    n_shards = len(windows) // WINDOWS_PER_SHARD
    for s in range(part, n_shards, parts):
        path = out / f"corpus_{s:05d}.safetensors"
        if path.exists():
            continue
        t0 = time.time()
        batch = windows[s * WINDOWS_PER_SHARD:(s + 1) * WINDOWS_PER_SHARD]
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor(batch)).last_hidden_state
            n = write_shard(path, [(ids, 0, h[r]) for r, ids in enumerate(batch)], model, torch)
        print(json.dumps({"corpus_shard": s, "of": n_shards, "tokens": n, "seconds": round(time.time() - t0, 1)}),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--max-prompt", type=int, default=384)
    ap.add_argument("--part", default="0/1", help="i/n: this process makes shards i, i+n, ...")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write-held-out", type=Path, help="write the held-out evaluation prompts and exit")
    ap.add_argument("--corpus", action="store_true",
                    help="teacher-forced instead: the target reads the training split of the standard library's "
                         "files in 256-token windows (no generation: several times the tokens per second)")
    args = ap.parse_args()
    train, held = prompt_sets.build()
    if args.write_held_out:
        rows = prompt_sets.held_out_set(held)
        args.write_held_out.parent.mkdir(parents=True, exist_ok=True)
        args.write_held_out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{len(rows)} held-out prompts -> {args.write_held_out}")
        return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    args.out.mkdir(parents=True, exist_ok=True)
    part, parts = map(int, args.part.split("/"))
    if args.corpus:
        return corpus(model, tok, args.out, part=part, parts=parts, torch=torch)
    encoded = [(item, render(tok, item)) for item in train]
    encoded = [(item, ids) for item, ids in encoded if len(ids) <= args.max_prompt]
    n_shards = (len(encoded) + args.batch - 1) // args.batch
    for s in range(part, n_shards, parts):
        path = args.out / f"shard_{s:05d}.safetensors"
        if path.exists():
            continue
        t0 = time.time()
        chunk = sorted(encoded[s * args.batch:(s + 1) * args.batch], key=lambda e: len(e[1]))
        temperature = 0.0 if s % 5 < 3 else 0.7     # mostly greedy, as the benchmark decodes; some sampled
        with torch.no_grad():
            seqs = generate(model, tok, [ids for _, ids in chunk], max_new=args.max_new,
                            temperature=temperature, seed=s, torch=torch)
            n = write_shard(path, seqs, model, torch)
        print(json.dumps({"shard": s, "of": n_shards, "tokens": n, "seconds": round(time.time() - t0, 1),
                          "temperature": temperature}), flush=True)


if __name__ == "__main__":
    main()
