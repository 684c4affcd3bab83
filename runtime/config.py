"""One source of defaults: frozen dataclasses, checked in __post_init__. TOML and CLI map onto them."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .errors import ConfigError


MIN_TEMPERATURE = 1e-4               # logits / T stay finite in float32
PENALTY_RANGE = (1e-3, 1e3)


@dataclass(frozen=True)
class SamplingParams:
    """How logits become probabilities, applied identically to the draft's q and the target's p."""
    temperature: float = 0.0          # 0 = greedy
    top_k: int = 0                    # 0 = off
    top_p: float = 1.0                # 1 = off
    repetition_penalty: float = 1.0   # 1 = off (CTRL-style: positive logits divided, negative multiplied)

    def __post_init__(self):
        for name in ("temperature", "top_p", "repetition_penalty"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), (int, float)):
                raise ConfigError(f"{name} must be a number, got {getattr(self, name)!r}")
        for name in ("temperature", "top_p", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{name} must be a finite number, got {getattr(self, name)}")
        if not (self.temperature == 0 or self.temperature >= MIN_TEMPERATURE):
            raise ConfigError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE} (lower only overflows the "
                              f"logits), got {self.temperature}")
        if isinstance(self.top_k, bool) or not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not PENALTY_RANGE[0] <= self.repetition_penalty <= PENALTY_RANGE[1]:
            raise ConfigError(f"repetition_penalty must be in [{PENALTY_RANGE[0]}, {PENALTY_RANGE[1]}] (1 = off; "
                              f"beyond, logits overflow), got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


DEFAULT_K = 6     # k when none is given, bounded by the bundle's max_draft_tokens


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    k: int | None = None              # most draft tokens per round; None: min(DEFAULT_K, the bundle's max)
    speculative: bool = True          # False: target-only decoding through the same loop (k = 0)
    # a round stops drafting once the product of its drafts' top probabilities (the draft's estimate
    # that all are accepted) falls below this (0 = always k): a draft unlikely to be reached costs a
    # draft step and a wider verify all the same. The output's law does not depend on it (how the
    # default was chosen: docs/benchmarks.md)
    draft_confidence: float = 0.1
    # prompt lookup (runtime/ngram.py): a round whose context ends in an n-gram seen before, n from
    # ngram down to ngram_min, drafts what followed it instead of calling the draft model; 0 = off.
    # It also drafts for a bundle without a draft model
    ngram: int = 0
    ngram_min: int = 2
    seed: int | None = 0              # per request: same seed -> same output (prefix_cache: see there)
    stop: tuple[str, ...] = ()        # stop strings (never emitted, not even in part)
    prefill_chunk: int = 256          # prompt tokens per prefill call: bounds logits to chunk x vocab
    # reuse the KV caches of the previous request where its tokens (prompt + output) share a prefix
    # with this prompt: an editor's next completion, a chat's next turn prefill only what is new.
    # The output's law is unchanged; the draws are not bit-for-bit a fresh decoder's once the reused
    # KV was computed token by token (a previous output) rather than in one prefill: graphs whose
    # numerics depend on how many tokens a call takes (the demo's int8 draft, docs/runtime.md)
    # give a slightly different q, so a seed can draw differently. False: every request prefills its
    # whole prompt (bit-reproducible runs; benchmarks that time prefill)
    prefix_cache: bool = True
    ignore_eos: bool = False          # benchmarks: always produce max_new_tokens
    sampling: SamplingParams = SamplingParams()

    def __post_init__(self):
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}")
        if self.k is not None and (isinstance(self.k, bool) or not (isinstance(self.k, int) and self.k >= 1)):
            raise ConfigError(f"k (draft tokens per round) must be an integer >= 1 (or None: the bundle's "
                              f"default), got {self.k!r}")
        if isinstance(self.draft_confidence, bool) or not (isinstance(self.draft_confidence, (int, float))
                                                            and 0 <= self.draft_confidence <= 1):
            raise ConfigError(f"draft_confidence must be a number in [0, 1] (0 = off), got {self.draft_confidence!r}")
        if isinstance(self.ngram, bool) or not (isinstance(self.ngram, int) and self.ngram >= 0):
            raise ConfigError(f"ngram (the longest n-gram prompt lookup matches) must be an integer >= 0 "
                              f"(0 = off), got {self.ngram!r}")
        if isinstance(self.ngram_min, bool) or not (isinstance(self.ngram_min, int) and self.ngram_min >= 1):
            raise ConfigError(f"ngram_min must be an integer >= 1, got {self.ngram_min!r}")
        if self.ngram and self.ngram < self.ngram_min:
            raise ConfigError(f"ngram ({self.ngram}, the longest n-gram looked up; 0 = off) must be >= "
                              f"ngram_min ({self.ngram_min})")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            raise ConfigError(f"seed must be an integer >= 0 (or None), got {self.seed!r}")
        for name in ("speculative", "prefix_cache", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.sampling, SamplingParams):
            raise ConfigError(f"sampling must be SamplingParams (or give temperature, top_k, top_p and "
                              f"repetition_penalty flat), got {type(self.sampling).__name__}")
        if not (isinstance(self.prefill_chunk, int) and self.prefill_chunk >= 1):
            raise ConfigError(f"prefill_chunk must be an integer >= 1, got {self.prefill_chunk}")
        if not isinstance(self.stop, (list, tuple)) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))

    def updated(self, **overrides) -> "GenerationConfig":
        """A copy with `overrides`; sampling fields (temperature, top_k, ...) may be given flat."""
        names = {f.name for f in fields(SamplingParams)}
        sampling = {k: overrides.pop(k) for k in list(overrides) if k in names}
        unknown = set(overrides) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown generation parameters {sorted(unknown)}")
        cfg = replace(self, **overrides)
        return replace(cfg, sampling=replace(cfg.sampling, **sampling)) if sampling else cfg


def model_defaults(generation: dict) -> GenerationConfig:
    """GenerationConfig() under a model's generation_config.json sampling keys (the manifest's
    `generation`), read as transformers' generate() reads them: without do_sample: true it decodes
    greedily whatever the temperature, and with it an unset top_k is 50."""
    g = {k: v for k, v in (generation or {}).items() if v is not None}
    sampling = {}
    if g.get("do_sample") is True:
        sampling = {"temperature": g.get("temperature", 1.0), "top_k": g.get("top_k", 50),
                    "top_p": g.get("top_p", 1.0)}
    if "repetition_penalty" in g:
        sampling["repetition_penalty"] = g["repetition_penalty"]
    try:
        return GenerationConfig().updated(**sampling)
    except ConfigError as e:
        raise ConfigError(f"the bundle's generation defaults (the model's generation_config.json) are "
                          f"invalid: {e}; fix it and re-export the bundle (or give from_bundle a config=)") from e


def load_toml(path: str | Path, base: GenerationConfig = GenerationConfig()) -> GenerationConfig:
    """A GenerationConfig from a TOML file: top-level keys are GenerationConfig fields, and sampling
    fields may sit at top level or in a [sampling] table; keys it leaves out keep `base`'s values.
    Unknown keys are errors."""
    try:
        import tomllib
    except ImportError:           # Python < 3.11
        import tomli as tomllib
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read generation config {path}: {e}") from e
    sampling = data.pop("sampling", {})
    if not isinstance(sampling, dict):
        raise ConfigError(f"{path}: [sampling] must be a table, got {sampling!r}")
    flat = {**sampling, **data}
    if isinstance(flat.get("stop"), list):     # a bare string stays a string, which is refused
        flat["stop"] = tuple(flat["stop"])
    return base.updated(**flat)
