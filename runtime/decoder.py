"""The speculative loop: draft -> verify -> accept -> commit / roll back. Glossary in __init__."""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from .config import DEFAULT_K, ConfigError, GenerationConfig, model_defaults
from .costs import speculation_pays
from .manifest import BundleError, Manifest, read_prompts
from .ngram import NgramLookup
from .sampling import accept, accept_greedy, confidence, greedy_tokens, probs, sample
from .text import TextStream


@dataclass
class Stats:
    """What one request did. alpha = accepted / evaluated: Leviathan et al.'s per-token acceptance.
    The draft counts are the verifier's decisions: the last round may accept drafts beyond the EOS or
    stop string that ends the output (new_tokens counts what was output)."""
    k: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0            # prompt tokens whose target KV came from the previous request
    draft_reused_tokens: int = 0      # ... and whose draft KV did (prefix_cache)
    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    evaluated: int = 0                # drafts the verifier reached: accepted + one per rejecting round
    accepted_hist: list[int] = field(default_factory=list)   # [k+1]: rounds that accepted j drafts
    target_calls: int = 0
    draft_calls: int = 0
    lookup_rounds: int = 0            # rounds drafted by prompt lookup (ngram) instead of the draft model
    lookup_accepted: int = 0          # their share of accepted and evaluated
    lookup_evaluated: int = 0
    seconds_prefill: float = 0.0
    seconds_target: float = 0.0
    seconds_draft: float = 0.0
    seconds_total: float = 0.0        # decode phase (after prefill)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.evaluated if self.evaluated else 0.0

    @property
    def lookup_alpha(self) -> float:
        return self.lookup_accepted / self.lookup_evaluated if self.lookup_evaluated else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds_total if self.seconds_total else 0.0

    @property
    def seconds_host(self) -> float:
        return max(0.0, self.seconds_total - self.seconds_target - self.seconds_draft)

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("acceptance_rate", "alpha", "lookup_alpha", "tokens_per_target_call", "tokens_per_second",
                     "seconds_host"):
            d[name] = getattr(self, name)
        return d


@dataclass
class Result:
    text: str
    token_ids: list[int]              # generated ids (the prompt excluded)
    finish_reason: str                # "stop" | "eos" | "length"
    stats: Stats


class Stream:
    """Iterate for text pieces as they are committed; `.result` holds the Result afterwards."""

    def __init__(self, gen):
        self._gen = gen
        self.result: Result | None = None

    def __iter__(self) -> Iterator[str]:
        if self.result is None:            # a finished stream iterates as empty, keeping its result
            self.result = yield from self._gen

    def close(self) -> None:
        """Stop this request (its decoder's other requests may go on). Leaving a `for` loop early, or
        dropping the stream, does the same."""
        self._gen.close()


class SpeculativeDecoder:
    def __init__(self, *, target, draft, tokenizer, vocab_size: int, eos_token_ids=(), max_context: int,
                 max_draft_tokens: int, config: GenerationConfig = GenerationConfig()):
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.vocab_size = vocab_size
        self.eos = set(int(e) for e in eos_token_ids)
        self.max_context = max_context
        self.max_draft_tokens = max_draft_tokens
        self.config = config
        self.draft_note: str | None = None       # why from_bundle dropped the draft model, if it did
        # role -> (the tokens its KV cache holds, the engine's writes then), recorded when a request
        # ends: a request that is abandoned or fails leaves no record, and an engine run by other
        # code since (its writes moved on) is not trusted: the next request prefills from scratch
        self._held: dict[str, tuple[list[int], int | None]] = {}
        self._request = 0                        # the request that owns the engines (one at a time)
        self._lock = threading.Lock()            # requests from several threads take turns (see _decode)
        self._owner: int | None = None           # the thread whose request holds it

    @property
    def default_k(self) -> int:
        """Most draft tokens per round when a request gives none: the config's k, else DEFAULT_K
        bounded by the bundle."""
        return self.config.k or min(DEFAULT_K, self.max_draft_tokens)

    @classmethod
    def from_bundle(cls, path: str | Path, *, providers: list[str] | None = None, threads: int = 0,
                    draft_threads: int = 1, speculative: bool | str = "auto", config: GenerationConfig | None = None):
        """Load a bundle written by spec-export; its manifest is checked before any graph loads.

        `speculative`: "auto" loads the draft and times the loop on the bundle's first prompt (seven short
        greedy requests, ~0.5 s on the demo pair; specedge.runtime.costs): where the costs and acceptance
        seen there give no k a Leviathan bound of 1.0x, the draft model is dropped and `draft_note` says
        why (requests then decode target-only, or with prompt lookup when they ask for it). True keeps
        the draft whatever it costs; False never loads it.

        `config` holds the request defaults; without one they are GenerationConfig()'s under the target's
        own generation_config.json sampling settings (do_sample, temperature, top_k, top_p,
        repetition_penalty), as transformers' generate() would use them.

        `threads` are the target's intra-op threads (0: onnxruntime's default, all cores), and
        `draft_threads` the draft's. The draft runs on the calling thread by default: two thread pools
        taking turns spin against each other (demo pair, 2 cores, both sessions on 2 threads:
        speculative 524 tokens/s against target-only 734), and a draft step is too small to split."""
        if speculative not in (True, False, "auto"):
            raise ConfigError(f"speculative must be True, False or 'auto', got {speculative!r}")
        if min(threads, draft_threads) < 0:
            raise ConfigError(f"threads must be >= 0 (0 = all cores), got threads={threads}, "
                              f"draft_threads={draft_threads}")
        from specedge.engines import OrtEngine
        from tokenizers import Tokenizer

        path = Path(path)
        m = Manifest.load(path)
        config = model_defaults(m.generation) if config is None else config
        try:
            tokenizer = Tokenizer.from_file(str(path / m.tokenizer))
        except Exception as e:  # tokenizers raises its own exception type for a malformed file
            raise BundleError(f"cannot read the bundle's tokenizer {path / m.tokenizer} ({e}); re-export "
                              f"the bundle") from e
        if tokenizer.get_vocab_size(with_added_tokens=True) > m.vocab_size:
            raise BundleError(f"bundle tokenizer has {tokenizer.get_vocab_size()} tokens, more than the "
                              f"manifest's shared vocab {m.vocab_size}; re-export the bundle")
        engines = {}
        for role, info in m.models.items():
            if role == "draft" and not speculative:
                continue
            e = OrtEngine(path / info.file, vocab_size=m.vocab_size, max_context=m.max_context,
                          providers=providers, threads=draft_threads if role == "draft" else threads,
                          num_kv_heads=info.num_kv_heads,
                          head_dim=info.head_dim, share_buffer=info.kv_in_place)
            got = (e.num_layers, e.num_kv_heads, e.head_dim)
            if got != (info.num_layers, info.num_kv_heads, info.head_dim):
                raise BundleError(f"{role} graph has (layers, kv heads, head dim) {got} but the manifest says "
                                  f"{(info.num_layers, info.num_kv_heads, info.head_dim)}; re-export the bundle")
            engines[role] = e
        if not speculative:
            config = replace(config, speculative=False)
        dec = cls(target=engines["target"], draft=engines.get("draft"), tokenizer=tokenizer,
                  vocab_size=m.vocab_size, eos_token_ids=m.eos_token_ids, max_context=m.max_context,
                  max_draft_tokens=m.max_draft_tokens, config=config)
        if speculative == "auto" and dec.draft is not None:
            prompt = _guard_prompt(path, m, tokenizer, dec.max_context)
            pays, why = speculation_pays(dec, prompt, max_k=dec.default_k)
            if not pays:      # the draft session's memory goes with it
                dec.draft, dec.draft_note = None, f"speculation off: {why}; pass speculative=True to force it"
        return dec

    # -- public API ------------------------------------------------------------------------------
    def generate(self, prompt, **overrides) -> Result:
        """Generate from a prompt (str or token ids). Overrides: any GenerationConfig/SamplingParams field.
        Thread-safe: concurrent requests take turns (one batch-1 cache pair serves one at a time)."""
        stream = self.stream(prompt, **overrides)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt, **overrides) -> Stream:
        """Like generate(), but iterate for text pieces as soon as they are committed. Requests from
        other threads wait until this one ends: finish, leave the loop, or close() a stream you stop
        reading. Another request from this thread meanwhile makes this one raise when resumed."""
        cfg = self.config.updated(**overrides)
        if cfg.k is None:
            cfg = replace(cfg, k=self.default_k)
        elif cfg.speculative and cfg.k > self.max_draft_tokens:      # the bundle's verify profile
            raise ConfigError(f"k={cfg.k} exceeds the bundle's max draft tokens ({self.max_draft_tokens}); "
                              f"use k <= {self.max_draft_tokens} or re-export with --max-draft-tokens {cfg.k}")
        ids = self.encode(prompt)
        return Stream(self._decode(ids, cfg))

    def encode(self, prompt) -> list[int]:
        """Prompt (text or ids) -> checked token ids; ConfigError names what is wrong."""
        if isinstance(prompt, str):
            if not prompt:
                raise ConfigError("the prompt is empty; give at least one character")
            try:
                ids = self.tokenizer.encode(prompt).ids
            except TypeError as e:       # e.g. a lone surrogate: not text the tokenizer can read
                raise ConfigError(f"the prompt is not valid text ({e}); give UTF-8 text") from None
        else:
            ids = _token_ids(prompt)
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise ConfigError(f"prompt token ids must be in [0, {self.vocab_size})")
        if not ids:
            raise ConfigError("the prompt encodes to no tokens; give a non-empty prompt")
        if len(ids) >= self.max_context:
            raise ConfigError(f"the prompt has {len(ids)} tokens but the bundle's max context is "
                              f"{self.max_context}; shorten the prompt (leave room for new tokens) or "
                              f"re-export with a larger --max-context")
        return ids

    # -- the loop --------------------------------------------------------------------------------
    def _decode(self, ids: list[int], cfg: GenerationConfig):
        """_rounds as the one request the engines serve: requests from other threads wait until it
        ends or is closed. The same thread starting another request while this one is paused does not
        wait (it would wait for itself); this one then raises ConfigError if resumed."""
        me = threading.get_ident()
        mine = self._owner != me
        if mine:
            self._lock.acquire()
            self._owner = me
        try:
            return (yield from self._rounds(ids, cfg))
        finally:      # (also when the stream is closed or dropped while paused, from whichever thread)
            if mine:
                self._owner = None
                self._lock.release()

    def _rounds(self, ids: list[int], cfg: GenerationConfig):
        speculative = cfg.speculative and (self.draft is not None or cfg.ngram > 0)
        roles = {"target": self.target} | ({"draft": self.draft} if speculative and self.draft is not None else {})
        engines = list(roles.values())
        lookup = (NgramLookup(ids, max_n=cfg.ngram, min_n=cfg.ngram_min, capacity=self.max_context)
                  if speculative and cfg.ngram else None)
        stats = Stats(k=cfg.k if speculative else 0, prompt_tokens=len(ids),
                      accepted_hist=[0] * ((cfg.k if speculative else 0) + 1))
        rng = np.random.default_rng(cfg.seed)
        text = TextStream(self.tokenizer, cfg.stop)
        self._request += 1
        mine = self._request
        t0 = time.perf_counter()
        for role, e in roles.items():       # invariant: caches hold committed tokens only, never the last one
            held, writes = self._held.pop(role, (None, None))
            fresh = cfg.prefix_cache and held and writes is not None and writes == getattr(e, "writes", None)
            keep = _common_prefix(held, ids, limit=min(e.length, len(ids) - 1)) if fresh else 0
            e.truncate(keep)
            for s in range(keep, len(ids) - 1, cfg.prefill_chunk):
                e.run(np.asarray(ids[s:min(s + cfg.prefill_chunk, len(ids) - 1)]), keep=1)
            setattr(stats, "reused_tokens" if role == "target" else "draft_reused_tokens", keep)
        stats.seconds_prefill = time.perf_counter() - t0
        tokens, finish = list(ids), None
        eos = () if cfg.ignore_eos else self.eos
        t0 = time.perf_counter()
        writes_now = lambda: [getattr(e, "writes", None) for e in engines]
        paused, before = False, None      # whether a piece was handed out since the last round, and the writes then
        overtaken = lambda: paused and (self._request != mine or writes_now() != before)
        while finish is None:
            if overtaken():
                # another request (or code running an engine) used the caches while this stream waited
                raise ConfigError("the decoder's engines ran another request while this stream was paused; a "
                                  "decoder serves one request at a time: finish a stream before starting "
                                  "another, or load a second decoder")
            paused = False
            budget = cfg.max_new_tokens - stats.new_tokens
            k = min(stats.k, budget - 1, self.max_context - len(tokens))
            if budget <= 0 or k < 0:
                finish = "length"
                break
            new = self._step(tokens, k, cfg, rng, stats, lookup)
            eos_at = next((i for i, t in enumerate(new) if t in eos), None)
            if eos_at is not None:
                new, finish = new[:eos_at + 1], "eos"
            shown = len(text.ids)
            piece = text.push(new if finish is None else new[:-1])
            if text.stopped:       # the tokens after the one completing the stop string were never said
                new, finish = new[:len(text.ids) - shown], "stop"
            tokens += new
            stats.new_tokens += len(new)
            if lookup is not None:
                lookup.extend(new)
            if finish:             # drop what the caches hold beyond the last kept token
                for e in engines:
                    e.truncate(min(e.length, len(tokens) - 1))
            if piece:
                before = writes_now()
                yield piece
                paused = True
        stats.seconds_total = time.perf_counter() - t0
        if not overtaken():                # (a finished stream's output stands either way)
            for role, e in roles.items():      # each cache holds a prefix of the committed tokens
                self._held[role] = (tokens[:e.length], getattr(e, "writes", None))
        tail = text.flush()
        if tail:
            yield tail
        return Result(text=text.text, token_ids=tokens[len(ids):], finish_reason=finish, stats=stats)

    def _step(self, tokens: list[int], k: int, cfg: GenerationConfig, rng: np.random.Generator,
              stats: Stats, lookup: NgramLookup | None) -> list[int]:
        """One round: draft up to k tokens (prompt lookup when the context's last n-gram recurred, else
        the draft model), verify them in ONE target call over k+1 positions, accept, and roll both
        caches back to the committed prefix. Returns the newly committed tokens."""
        n, params, greedy = len(tokens), cfg.sampling, cfg.sampling.greedy
        drafts = lookup.propose(k) if lookup is not None and k else []
        from_lookup = bool(drafts)
        if from_lookup:      # point masses: q is one-hot (greedy never reads q)
            q = np.zeros((0 if greedy else len(drafts), self.vocab_size), dtype=np.float32)   # [k, vocab]
            q[np.arange(len(q)), drafts[:len(q)]] = 1.0
        elif k and self.draft is not None:
            drafts, q = self._draft(tokens, k, cfg, rng, stats)
        else:
            q = np.empty((0, self.vocab_size), dtype=np.float32)
        k = len(drafts)
        t0 = time.perf_counter()
        logits = self.target.run(np.asarray([tokens[-1]] + drafts))        # [k+1, vocab]
        stats.seconds_target += time.perf_counter() - t0
        if greedy:
            new, n_accepted = accept_greedy(drafts, greedy_tokens(logits, params, history=tokens, drafts=drafts))
        else:
            p = probs(logits, params, history=tokens, drafts=drafts)       # [k+1, vocab]
            new, n_accepted = accept(drafts, q, p, rng)
        self.target.truncate(n + n_accepted)     # committed prefix; the last new token is not fed yet
        if self.draft is not None and stats.k:   # (after lookup rounds it lags: the next draft call catches up)
            self.draft.truncate(min(self.draft.length, n + n_accepted))
        if k:
            evaluated = n_accepted + (n_accepted < k)    # the drafts the verifier reached
            stats.drafted += k
            stats.accepted += n_accepted
            stats.evaluated += evaluated
            stats.accepted_hist[n_accepted] += 1
            if from_lookup:
                stats.lookup_rounds += 1
                stats.lookup_accepted += n_accepted
                stats.lookup_evaluated += evaluated
        stats.target_calls += 1
        stats.rounds += 1
        return new

    def _draft(self, tokens: list[int], k: int, cfg: GenerationConfig, rng: np.random.Generator,
               stats: Stats) -> tuple[list[int], np.ndarray]:
        """Up to k tokens from the draft model, one call each, and the q they were sampled from."""
        params, greedy = cfg.sampling, cfg.sampling.greedy
        drafts: list[int] = []
        q = np.empty((0 if greedy else k, self.vocab_size), dtype=np.float32)   # [k, vocab]
        feed = tokens[self.draft.length:]     # 1 token; more when it missed a bonus or lookup rounds
        reach = 1.0          # the draft's own estimate that every draft so far is accepted
        for i in range(k):
            t0 = time.perf_counter()
            logits = self.draft.run(np.asarray(feed), keep=1)              # [1, vocab]
            stats.seconds_draft += time.perf_counter() - t0
            stats.draft_calls += 1
            if greedy:       # point masses: the token is the argmax, q is never materialised
                drafts.append(int(greedy_tokens(logits, params, history=tokens, drafts=drafts, first=i)[0]))
                if cfg.draft_confidence > 0:      # a softmax over the vocab: skipped when unused
                    reach *= confidence(logits[0])
            else:
                q[i] = probs(logits, params, history=tokens, drafts=drafts, first=i)[0]
                drafts.append(sample(q[i], rng))
                reach *= q[i].max()
            feed = drafts[-1:]
            if reach < cfg.draft_confidence:   # the next drafts would likely be wasted: verify what we have
                break
        return drafts, q[:len(drafts)]


def _token_ids(prompt) -> list[int]:
    """A 1-D sequence of integer token ids (list, tuple, range, numpy or torch array) as a list."""
    listed = isinstance(prompt, (list, tuple))
    bad = next((t for t in prompt if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer))),
               None) if listed else None
    arr = None
    if bad is None and not isinstance(prompt, (str, bytes, bytearray)):
        try:
            arr = np.asarray(prompt)
        except (ValueError, TypeError, OverflowError):
            pass
    if arr is not None and arr.ndim == 1 and (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        return arr.tolist()
    shaped = listed or hasattr(prompt, "shape")
    detail = (f" holding {bad!r}" if bad is not None else
              f" of {arr.ndim} dimensions" if shaped and arr is not None and arr.ndim != 1 else "")
    raise ConfigError(f"the prompt must be text (str) or a 1-D sequence of token ids (ints), got "
                      f"{type(prompt).__name__}{detail}")


def _common_prefix(a: list[int], b: list[int], *, limit: int) -> int:
    """Length of the longest common prefix of a and b, at most `limit`."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def _guard_prompt(path: Path, m: Manifest, tokenizer, max_context: int) -> list[int]:
    """The bundle's first prompt that leaves room to generate (its own kind of text), else fixed
    pseudo-random ids: what the speculation guard times the loop on."""
    try:
        prompts = read_prompts(path / m.prompts) if m.prompts else []
    except (OSError, ValueError):     # a missing or edited prompts file costs the guard its text, nothing more
        prompts = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt).ids
        if 0 < len(ids) < max_context // 2:
            return ids
    return np.random.default_rng(0).integers(0, tokenizer.get_vocab_size(), size=min(64, max_context // 4)).tolist()
