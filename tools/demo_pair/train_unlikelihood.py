"""The demo target's fine-tune against its own greedy loops: the `unlikelihood` phase of
train_demo_pair.py (run it from there: `python tools/demo_pair/train_demo_pair.py unlikelihood`)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from recipe import (SEED, batches, build, continuation, function_openings, is_held_out, save, stdlib_files,
                    stdlib_train_tokens)

# the target's fine-tune against greedy loops: a low LR, since higher ones gained more at first and then
# regressed, the model flattening its loops instead (the runs behind these settings: docs/benchmarks.md)
UNLIKELIHOOD = dict(steps=200, lr=5e-5, warmup=20, ngram=4, weight=0.25, prefix=96, new=64)


def greedy_continuations(model, prefixes, new: int):
    """[B, new] greedy tokens after `prefixes` [B, P], EOS ignored (as the eval's continuations)."""
    model.eval()
    toks = continuation(model, prefixes, new, lambda logits: logits.argmax(-1, keepdim=True))
    model.train()
    return toks


def repeated_ngrams(cont, n: int):
    """[B, L] bool: the tokens of every n-gram that already occurred earlier in its row (a loop)."""
    import torch
    mask = torch.zeros(cont.shape, dtype=torch.bool)
    for b, row in enumerate(cont.tolist()):
        seen = set()
        for t in range(n - 1, len(row)):
            gram = tuple(row[t - n + 1:t + 1])
            if gram in seen:
                mask[b, t - n + 1:t + 1] = True
            seen.add(gram)
    return mask


def unlikelihood(work: Path, args) -> None:
    """Sequence-level unlikelihood (Welleck et al. 2020): the target's own greedy continuations are
    penalised, -log(1 - p(x_t)), on tokens of repeated n-grams; KL to the target as it was, on the usual
    batches, keeps its distribution on real code (plain cross-entropy drifted as far)."""
    import torch
    from tokenizers import Tokenizer
    torch.set_num_threads(args.threads)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt, anchor_path = work / "target.pt", work / "target_anchor.pt"
    saved = torch.load(ckpt, map_location=dev, weights_only=False)
    state = saved["state"]
    ul = state.get("unlikelihood")
    if ul is None:
        cd = state["cooldown"]
        if cd is None or state["step"] < cd[0] + cd[1]:
            raise SystemExit(f"unlikelihood fine-tunes a cooled target; {ckpt} has no finished cool-down: "
                             "run `cooldown --model target` first")
        ul = state["unlikelihood"] = {"from": state["step"], **UNLIKELIHOOD}
        torch.save({"model": saved["model"], "step": state["step"]}, anchor_path)
    elif state["step"] >= ul["from"] + ul["steps"]:
        print(f"unlikelihood: done at step {state['step']}; nothing to do")
        return
    model, anchor = build("target").to(dev), build("target").to(dev)
    model.load_state_dict(saved["model"])
    anchor.load_state_dict(torch.load(anchor_path, map_location=dev, weights_only=False)["model"])
    anchor.eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=ul["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    opt.load_state_dict(saved["opt"])
    tok = Tokenizer.from_file(str(work / "tokenizer.json"))
    root = Path(json.loads((work / "data.json").read_text())["stdlib"])
    texts = [p.read_text(encoding="utf-8") for p in stdlib_files() if not is_held_out(str(p.relative_to(root)))]
    pool = [ids[-ul["prefix"]:] for ids in (e.ids for e in tok.encode_batch(
        [o for t in texts for o, _ in function_openings(t)])) if len(ids) >= ul["prefix"]]
    data = [stdlib_train_tokens(work), np.fromfile(work / "train.bin", dtype=np.uint16)]
    print(f"unlikelihood from step {ul['from']}: {len(pool)} training-file openings, {ul}", flush=True)
    t_end, t0 = time.time() + 60 * args.minutes, time.time()
    while time.time() < t_end and state["step"] < ul["from"] + ul["steps"]:
        i = state["step"] - ul["from"]
        for g in opt.param_groups:
            g["lr"] = ul["lr"] * min(1.0, (i + 1) / ul["warmup"]) * (1 - i / ul["steps"])
        t_step = time.time()
        rng = np.random.default_rng([SEED, state["step"], 2])
        pre = torch.tensor(np.stack([pool[j] for j in rng.choice(len(pool), args.batch)]), dtype=torch.long).to(dev)
        cont = greedy_continuations(model, pre, ul["new"])                       # [B, new]
        mask = repeated_ngrams(cont.cpu(), ul["ngram"]).to(dev)
        x, _ = batches(data, batch=args.batch, rng=rng)
        x = x.to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=args.bf16):
            gen_logits = model(input_ids=torch.cat([pre, cont], 1)).logits.float()
            logits = model(input_ids=x).logits.float()
            with torch.no_grad():
                ref = torch.log_softmax(anchor(input_ids=x).logits.float(), -1)
        kl = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), ref, log_target=True,
                                        reduction="batchmean") / x.shape[1]
        # position t predicts token t + 1: continuation token j comes from position prefix - 1 + j
        p = torch.softmax(gen_logits[:, ul["prefix"] - 1:-1], -1).gather(-1, cont[..., None])[..., 0]   # [B, new]
        loss_ul = -(torch.log(torch.clamp(1 - p, min=1e-5)) * mask).sum() / mask.sum().clamp(min=1)
        loss = kl + ul["weight"] * loss_ul
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += x.numel() + pre.numel() + cont.numel()
        state["seconds"] += time.time() - t_step
        if state["step"] % 10 == 0:
            print(f"unlikelihood step {state['step']} kl {kl.item():.4f} ul {loss_ul.item():.3f} "
                  f"repeated {mask.float().mean().item():.3f}  {(time.time() - t0) / 10:.1f} s/step", flush=True)
            t0 = time.time()
    save(ckpt, model, opt, state, work)
