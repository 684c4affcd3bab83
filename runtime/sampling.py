"""Logits -> probabilities, token sampling, and modified rejection sampling. Pure numpy, no I/O.

`accept` is the whole of speculative sampling's correctness: whatever q is, the tokens it returns
are distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023).
"""
from __future__ import annotations

import numpy as np

from .config import SamplingParams


def _penalize(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    vals = logits[seen]
    logits[seen] = np.where(vals > 0, vals / penalty, vals * penalty)


def penalized(logits: np.ndarray, params: SamplingParams, *, history=None, drafts=(), first: int = 0) -> np.ndarray:
    """A float32 copy of logits [n, vocab] with the repetition penalty applied.

    Row i sees `history` + drafts[:first + i] (what that position of a verify pass sees), so the
    draft's q and the target's p are warped from the same prefix.
    """
    x = np.array(logits, dtype=np.float32)                       # [n, vocab], a private copy
    if params.repetition_penalty != 1.0 and history is not None:
        seen = np.unique(np.asarray(history, dtype=np.int64))
        for i in range(x.shape[0]):
            _penalize(x[i], np.union1d(seen, np.asarray(drafts[:first + i], dtype=np.int64)),
                      params.repetition_penalty)
    return x


def greedy_tokens(logits: np.ndarray, params: SamplingParams, **prefix) -> np.ndarray:
    """The argmax tokens [n] of the penalized logits: what probs() puts its point masses on."""
    if params.repetition_penalty == 1.0:
        return np.asarray(logits).argmax(axis=1)
    return penalized(logits, params, **prefix).argmax(axis=1)


def probs(logits: np.ndarray, params: SamplingParams, **prefix) -> np.ndarray:
    """Warp logits [n, vocab] into probabilities [n, vocab] float32 (prefix: see penalized()).

    float32 because it is cheaper on the host than float64; sampling takes its CDF in float64, and
    accept() reads the very q the draft token was drawn from, so exactness does not rest on it."""
    x = penalized(logits, params, **prefix)
    n, vocab = x.shape
    if params.greedy:
        out = np.zeros_like(x)
        out[np.arange(n), x.argmax(axis=1)] = 1.0
        return out
    if 0 < params.top_k < vocab:
        kth = np.partition(x, vocab - params.top_k, axis=1)[:, vocab - params.top_k, None]
        x[x < kth] = -np.inf
    x -= x.max(axis=1, keepdims=True)           # before scaling: a tiny temperature must not overflow
    x /= np.float32(max(params.temperature, 1e-30))   # below that, float32 would divide by zero
    np.exp(x, out=x)
    x /= x.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        for row in x:
            _top_p(row, params.top_p)
    return x


def _top_p(row: np.ndarray, top_p: float) -> None:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (the token crossing it
    included) and renormalise, in place. Sorts only the top 256 (or 4096) candidates when they hold
    that mass: a full sort of a 150k vocabulary per verified position would dominate the round."""
    idx = np.flatnonzero(row)        # zero-probability tokens are never kept (and tie up argpartition)
    for m in (256, 4096):
        if len(idx) > m:
            top = idx[np.argpartition(row[idx], len(idx) - m)[-m:]]
            if row[top].sum() >= top_p:
                idx = top
                break
    order = idx[np.argsort(-row[idx], kind="stable")]
    sorted_p = row[order]
    keep = order[:max(1, int(np.count_nonzero(np.cumsum(sorted_p) - sorted_p < top_p)))]   # the top one at least
    total = row[keep].sum()
    kept = row[keep] / total
    row[:] = 0.0
    row[keep] = kept


_BLOCK = 128


def sample(dist: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector [vocab] by inverse CDF (one uniform per draw).

    Two-level: block sums, then the CDF inside the chosen block. np.cumsum is not vectorised (over the
    whole vocabulary it was the largest host cost of a sampled round); this reads the vector once at
    SIMD speed and accumulates only ~vocab/128 + 128 terms. Exact in the same sense as a full float64
    CDF; a zero-probability token is never returned."""
    u = rng.random()
    blocks = -(-len(dist) // _BLOCK)
    w = np.zeros(blocks * _BLOCK)                # float64; the zero padding is never drawn
    w[:len(dist)] = dist
    w = w.reshape(blocks, _BLOCK)                # [blocks, 128]
    sums = w.sum(axis=1)                         # [blocks]
    cdf = np.cumsum(sums)
    x = u * cdf[-1]
    # side="right" lands on an entry that raises the running sum, never on a zero; only running past
    # the end (u * total rounded up to the total; a block's cumsum rounding below its sum) needs help
    b = int(np.searchsorted(cdf, x, side="right"))
    if b >= blocks:
        b = int(np.flatnonzero(sums)[-1])
    x -= cdf[b - 1] if b else 0.0
    j = int(np.searchsorted(np.cumsum(w[b]), x, side="right"))
    if j >= _BLOCK:
        j = int(np.flatnonzero(w[b])[-1])
    return b * _BLOCK + j


def accept(draft_tokens, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[list[int], int]:
    """Modified rejection sampling over one verify pass.

    draft_tokens [k] were sampled from q [k, vocab]; p [k+1, vocab] are the target's distributions
    at the same positions plus one. Accept x_i with probability min(1, p_i(x)/q_i(x)); at the first
    rejection return a recovered token from norm(max(0, p_i - q_i)); if all k pass, return a bonus
    token from p_k. Returns (accepted drafts + one recovered-or-bonus token, number accepted).
    """
    for i, x in enumerate(draft_tokens):
        if rng.random() * q[i, x] < p[i, x]:     # u < p/q without dividing (q[i, x] > 0: x ~ q_i)
            continue
        residual = np.maximum(p[i] - q[i], 0.0)  # [vocab]
        # all-zero residual means p == q up to rounding: p itself is then the right distribution
        dist = residual if residual.sum() > 1e-6 else p[i]
        return [int(t) for t in draft_tokens[:i]] + [sample(dist, rng)], i
    return [int(t) for t in draft_tokens] + [sample(p[len(draft_tokens)], rng)], len(draft_tokens)


def accept_greedy(draft_tokens, target_tokens) -> tuple[list[int], int]:
    """accept() for point masses (temperature 0), without building them: keep drafts while they
    equal the target's argmax target_tokens [k+1]; then the target's token (recovered or bonus)."""
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_tokens[n]:
        n += 1
    return [int(t) for t in draft_tokens[:n]] + [int(target_tokens[n])], n


def confidence(logits: np.ndarray) -> float:
    """The draft's top probability at temperature 1 from its raw logits [vocab]: how likely its
    greedy token is to be accepted (it only decides when to stop drafting, never what is output)."""
    return float(1.0 / np.exp(logits - logits.max()).sum())
