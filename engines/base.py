"""The narrow engine interface: one exported graph that owns its KV cache.

The runtime only ever uses these members (length, run, truncate, writes), so an ONNX Runtime session,
a TensorRT plan or a test double are interchangeable.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from specedge.runtime.errors import EngineError  # noqa: F401  (engines raise it; re-exported)


class Engine(Protocol):
    vocab_size: int      # logits width returned by run()
    max_context: int     # cache capacity in tokens

    @property
    def length(self) -> int:
        """Tokens currently held in the KV cache."""

    def run(self, ids: np.ndarray, *, keep: int | None = None) -> np.ndarray:
        """Append `ids` [n] int64 to the cache and return the logits of the last `keep` of them
        (all n by default) [keep, vocab_size] float32. Graphs with a `logits_to_keep` input skip
        the LM head on the others (a prefill keeps 1)."""

    def truncate(self, length: int) -> None:
        """Keep only the first `length` cached tokens (rollback: no recomputation)."""

    writes: int
    """Bumped by every run (before it runs: a failed run leaves the cache unknown), truncate and
    reset. The decoder reuses a cache across requests (GenerationConfig.prefix_cache) only while this
    is unchanged since the last request ended, so code that runs the engine in between cannot leave
    stale KV behind."""
