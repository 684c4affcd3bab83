"""Goodness of fit against an exact law, numpy and math only: what spec-check and the tests judge
samples with.

A law is a dict outcome -> probability computed without the sampler under test. Bins are formed
from the law alone (never from the data), smallest cells merged until each expects MIN_EXPECTED
hits, so the chi-square approximation holds and the test is valid; an outcome of probability zero
that was seen at all is a failure whatever the statistic says.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from itertools import product

import numpy as np

MIN_EXPECTED = 30


def chi2_sf(stat: float, df: int) -> float:
    """P(X >= stat) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, stat/2),
    by its series below a+1 and its continued fraction above (Numerical Recipes' gammq)."""
    if df < 1:
        raise ValueError(f"chi-square needs df >= 1, got {df}")
    a, x = df / 2.0, stat / 2.0
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:                 # series for P(a, x); Q = 1 - P
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300                 # modified Lentz for the continued fraction of Q(a, x)
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_front) * h)


def merge_bins(law: dict, n: int, min_expected: float = MIN_EXPECTED) -> list[list]:
    """Group the nonzero cells, smallest first, until each group expects >= min_expected of n hits."""
    bins, cur, mass = [], [], 0.0
    for cell in sorted((c for c in law if law[c] > 0), key=law.get):
        cur.append(cell)
        mass += law[cell]
        if mass * n >= min_expected:
            bins, cur, mass = bins + [cur], [], 0.0
    if cur:                                  # a light remainder joins the heaviest bin
        bins = bins[:-1] + [bins[-1] + cur] if bins else [cur]
    return bins


@dataclass(frozen=True)
class Fit:
    n: int                   # samples
    stat: float              # chi-square statistic over the merged bins
    df: int                  # bins - 1 (0: one possible outcome, decided by `impossible` alone)
    p_value: float           # 1.0 when df = 0
    impossible: dict         # outcomes of probability 0 that were seen, with their counts

    def passes(self, threshold: float) -> bool:
        return not self.impossible and self.p_value > threshold


def chi2_fit(law: dict, seen: Counter) -> Fit:
    """Chi-square goodness of fit of the counts `seen` to `law` (probabilities summing to 1)."""
    total = sum(law.values())
    if abs(total - 1) > 1e-6:
        raise ValueError(f"the law's probabilities sum to {total}, not 1")
    n = sum(seen.values())
    impossible = {c: m for c, m in seen.items() if law.get(c, 0.0) <= 0.0}
    bins = merge_bins(law, n)
    if len(bins) < 2:
        return Fit(n, 0.0, 0, 1.0, impossible)
    exp = np.array([n * sum(law[c] for c in b) for b in bins])
    obs = np.array([sum(seen[c] for c in b) for b in bins])
    stat = float(((obs - exp) ** 2 / exp).sum())
    return Fit(n, stat, len(bins) - 1, chi2_sf(stat, len(bins) - 1), impossible)


def accept_law(q: np.ndarray, p: np.ndarray) -> dict:
    """The exact law of accept()'s output for fixed rows q [k, V], p [k+1, V] and drafts x_i ~ q_i:
    drafts x_0..x_{m-1} kept w.p. min(p_i, q_i)(x_i) each, then a token from max(0, p_m - q_m)
    (rejection at m < k) or from p_k (bonus). Its marginal on the first token is p_0, whatever q."""
    k, vocab = q.shape
    law = {}
    for m in range(k + 1):
        last = p[m] if m == k else np.maximum(p[m] - q[m], 0.0)
        for xs in product(range(vocab), repeat=m + 1):
            pr = np.prod([min(p[i, x], q[i, x]) for i, x in enumerate(xs[:-1])]) * last[xs[-1]]
            if pr > 0:
                law[xs] = float(pr)
    return law
