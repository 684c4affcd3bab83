"""Training a hidden-state draft head (export/eagle.py) on a target's own outputs: batches of
(token, feature) pairs with the target's next feature and top-k law, the loss, and the chain acceptance
that greedy drafting would reach (tools/smollm2/train_draft.py drives these; the tests train a tiny head).

Each sequence is a dict of numpy arrays: tokens [L], hidden [L, H] (the target's final hidden state after
each token), topk_ids / topk_logprob [L, K] (its top-k law for the next token), and n_prompt."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


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
