"""Prefix reuse across requests: a cache keeps the KV of the longest prefix a new prompt shares with
the tokens it held when the previous request ended, and prefills only the rest.

A record is made only when a request ends normally, and trusted only while the engine's `writes`
counter is unchanged since: an abandoned or failed request, or code that ran the engine in between,
leaves the next request to prefill from scratch.
"""
from __future__ import annotations

import numpy as np


class PrefixCache:
    def __init__(self):
        self._held: dict[str, tuple[list[int], int]] = {}    # name -> (tokens its cache holds, writes then)

    def reusable(self, name: str, engine, ids: list[int], cfg, *, offset: int = 0) -> int:
        """How many of `engine`'s cached positions a request for `ids` may keep (its record is used up).
        `offset`: position j of the cache depends on tokens up to j + offset."""
        held, writes = self._held.pop(name, (None, None))
        if not (cfg.prefix_cache and held and writes == engine.writes):
            return 0
        return max(0, common_prefix(held, ids, limit=min(engine.length + offset, len(ids) - 1)) - offset)

    def restore(self, name: str, engine, ids: list[int], cfg) -> int:
        """Leave `engine` holding ids[:-1] (the invariant: a cache holds all committed tokens but the
        last); return how many of them were reused."""
        keep = self.reusable(name, engine, ids, cfg)
        engine.truncate(keep)
        for s in range(keep, len(ids) - 1, cfg.prefill_chunk):
            engine.run(np.asarray(ids[s:min(s + cfg.prefill_chunk, len(ids) - 1)]), keep=1)
        return keep

    def record(self, name: str, engine, tokens: list[int], *, offset: int = 0) -> None:
        self._held[name] = (tokens[:engine.length + offset], engine.writes)


def common_prefix(a: list[int], b: list[int], *, limit: int) -> int:
    """Length of the longest common prefix of a and b, at most `limit`."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
