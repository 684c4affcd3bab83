"""The speculative loop: draft -> verify -> accept -> commit / roll back. Glossary in __init__."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .chat import ChatTemplate
from .config import DEFAULT_K, ConfigError, GenerationConfig, model_defaults
from .costs import cached_verdict, guard_key, speculation_pays
from .errors import BusyError
from .manifest import BundleError, Manifest, read_prompts
from .prefix import PrefixCache
from .proposers import DraftModel, HiddenStateHead, PromptLookup, Proposal
from .results import Result, Stats, Stream
from .sampling import accept, accept_greedy, greedy_tokens, probs
from .text import TextStream

__all__ = ["Result", "SpeculativeDecoder", "Stats", "Stream"]
ENGINES = ("onnxruntime", "tensorrt")
MAX_THREADS = 1024      # onnxruntime spins up every thread it is given: far beyond the cores only hangs


class SpeculativeDecoder:
    def __init__(self, *, target, draft, tokenizer, vocab_size: int, eos_token_ids=(), max_context: int,
                 max_draft_tokens: int, config: GenerationConfig = GenerationConfig(), draft_kind: str = "causal_lm"):
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.vocab_size = vocab_size
        self.eos = set(int(e) for e in eos_token_ids)
        self.max_context = max_context
        self.max_draft_tokens = max_draft_tokens
        self.config = config
        self.draft_kind = draft_kind             # "eagle": the draft is a head fed the target's hidden states
        if draft is not None and draft_kind == "eagle" and not getattr(target, "hidden_size", None):
            raise BundleError("the draft is a hidden-state head but the target graph has no hidden_states output; "
                              "re-export the pair with spec-export")
        self.draft_note: str | None = None       # why from_bundle dropped the draft model, if it did
        self.chat: ChatTemplate | None = None    # the tokenizer's chat template, when the bundle has one
        self.guard_cached = False                # whether from_bundle's speculation check came from its cache
        self.guard_k: int | None = None          # the k that check found best on this machine
        self.prefix = PrefixCache()
        self._lock = threading.Lock()            # one request at a time; a stream holds it until it ends
        self._owner: int | None = None           # the thread whose request holds it

    @property
    def proposers(self) -> list:
        """Who drafts, in the order the loop asks them each round: prompt lookup (free when it finds a
        match), then the draft model."""
        found = [PromptLookup(vocab_size=self.vocab_size, capacity=self.max_context)]
        if self.draft is not None and self.draft_kind == "eagle":
            found.append(HiddenStateHead(self.draft, target=self.target, vocab_size=self.vocab_size, prefix=self.prefix))
        elif self.draft is not None:
            found.append(DraftModel(self.draft, vocab_size=self.vocab_size, prefix=self.prefix))
        return found

    @property
    def default_k(self) -> int:
        """Most draft tokens per round when a request gives none: the config's k, else the k that
        from_bundle's check measured best on this machine, else DEFAULT_K bounded by the bundle."""
        return self.config.k or self.guard_k or min(DEFAULT_K, self.max_draft_tokens)

    @classmethod
    def from_bundle(cls, path: str | Path, *, providers: list[str] | None = None, threads: int = 0,
                    draft_threads: int = 1, speculative: bool | str = "auto", config: GenerationConfig | None = None,
                    engine: str = "onnxruntime"):
        """Load a bundle written by spec-export; its manifest is checked before any graph loads.

        `speculative`: "auto" loads the draft and times the loop on the bundle's first prompt (short greedy
        requests at a few k; specedge.runtime.costs): where the costs and acceptance
        seen there give no k a Leviathan bound of 1.0x, the draft model is dropped and `draft_note` says
        why (requests then decode target-only, or with prompt lookup when they ask for it); else the
        best k becomes the default (`default_k`). True keeps the draft whatever it costs; False never loads it.

        `config` holds the request defaults; without one they are GenerationConfig()'s under the target's
        own generation_config.json sampling settings (do_sample, temperature, top_k, top_p,
        repetition_penalty), as transformers' generate() would use them.

        `engine`: "onnxruntime" runs the bundle's ONNX graphs on `providers`; "tensorrt" runs the TensorRT
        plans `spec-export engine BUNDLE` built on this machine (specedge.engines.tensorrt).

        `threads` are the target's intra-op threads (0: onnxruntime's default, all cores), and
        `draft_threads` the draft's. The draft runs on the calling thread by default: two thread pools
        taking turns spin against each other (docs/benchmarks.md, "Threads"), and a draft step is too
        small to split."""
        if engine not in ENGINES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if speculative not in (True, False, "auto"):
            raise ConfigError(f"speculative must be True, False or 'auto', got {speculative!r}")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_THREADS
               for t in (threads, draft_threads)):
            raise ConfigError(f"threads must be integers in [0, {MAX_THREADS}] (0 = all cores), got threads={threads}, "
                              f"draft_threads={draft_threads}")
        from tokenizers import Tokenizer

        path = Path(path)
        m = Manifest.load(path)
        if engine == "onnxruntime":
            from specedge.engines.ort import import_onnxruntime
            m.check_onnxruntime(import_onnxruntime().__version__)
        config = model_defaults(m.generation) if config is None else config
        try:
            tokenizer = Tokenizer.from_file(str(path / m.tokenizer))
        except Exception as e:  # tokenizers raises its own exception type for a malformed file
            raise BundleError(f"cannot read the bundle's tokenizer {path / m.tokenizer} ({e}); re-export "
                              f"the bundle") from e
        if tokenizer.get_vocab_size(with_added_tokens=True) > m.vocab_size:
            raise BundleError(f"bundle tokenizer has {tokenizer.get_vocab_size()} tokens, more than the "
                              f"manifest's shared vocab {m.vocab_size}; re-export the bundle")
        roles = [role for role in m.models if speculative or role != "draft"]
        if engine == "tensorrt":
            from specedge.engines.tensorrt import trt_engines
            engines = trt_engines(path, m, roles)
        else:
            engines = _ort_engines(path, m, roles, providers=providers, threads=threads, draft_threads=draft_threads)
        if not speculative:
            config = replace(config, speculative=False)
        dec = cls(target=engines["target"], draft=engines.get("draft"), tokenizer=tokenizer,
                  vocab_size=m.vocab_size, eos_token_ids=m.eos_token_ids, max_context=m.max_context,
                  max_draft_tokens=m.max_draft_tokens, config=config,
                  draft_kind=m.models["draft"].kind if "draft" in m.models else "causal_lm")
        if m.chat_template:
            tokens = {k: v for k, v in m.chat_tokens.items() if k in ("bos_token", "eos_token") and isinstance(v, str)}
            try:
                dec.chat = ChatTemplate((path / m.chat_template).read_text(encoding="utf-8"), **tokens)
            except UnicodeDecodeError as e:
                raise BundleError(f"the bundle's chat template {m.chat_template} is not UTF-8 text ({e}); re-export "
                                  f"the bundle") from None
        if speculative == "auto" and dec.draft is not None:
            # timed once per bundle and machine: later loads read the verdict (runtime/costs.cached_verdict)
            key = guard_key(path, threads=threads, draft_threads=draft_threads,
                            providers=providers if engine == "onnxruntime" else [engine])
            measure = lambda: speculation_pays(dec, _guard_prompt(path, m, tokenizer, dec.max_context),
                                               max_k=dec.default_k)
            pays, why, k, dec.guard_cached = cached_verdict(key, measure)
            if pays:          # a cheap verify (small r(k)) makes a long k pay; a costly one a short k
                dec.guard_k = min(k, dec.max_draft_tokens)
            else:      # the draft session's memory goes with it
                dec.draft, dec.draft_note = None, f"speculation off: {why}; pass speculative=True to force it"
        return dec

    # -- public API ------------------------------------------------------------------------------
    def generate(self, prompt=None, *, messages=None, **overrides) -> Result:
        """Generate from a prompt (str or token ids). Overrides: any GenerationConfig/SamplingParams field.
        Thread-safe: concurrent requests take turns (one batch-1 cache pair serves one at a time)."""
        stream = self.stream(prompt, messages=messages, **overrides)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt=None, *, messages=None, **overrides) -> Stream:
        """Like generate(), but iterate for text pieces as soon as they are committed. The request holds
        the decoder from its first piece until it ends, its loop is left, or close() is called: other
        threads' requests wait; a request from this thread meanwhile raises BusyError.

        `messages` ([{"role", "content"}, ...]) instead of a prompt: rendered by the bundle's chat template
        with the assistant's turn opened, and the request also stops at the template's end-of-turn token."""
        if self._owner == threading.get_ident():
            raise BusyError("this thread's previous stream is still open: a decoder serves one request at a "
                            "time; read that stream to the end or call its close() first")
        cfg = self.config.updated(**overrides)
        if cfg.k is None:
            cfg = replace(cfg, k=self.default_k)
        elif cfg.speculative and cfg.k > self.max_draft_tokens:      # the bundle's verify profile
            raise ConfigError(f"k={cfg.k} exceeds the bundle's max draft tokens ({self.max_draft_tokens}); "
                              f"use k <= {self.max_draft_tokens} or re-export with --max-draft-tokens {cfg.k}")
        eos = frozenset() if cfg.ignore_eos else frozenset(self.eos)
        if messages is not None:
            if prompt is not None:
                raise ConfigError("give a prompt or messages, not both")
            ids, eos = self.encode_chat(messages), eos | self._end_of_turn(cfg)
        else:
            ids = self.encode(prompt)
        return Stream(self._decode(ids, cfg, eos))

    def encode_chat(self, messages) -> list[int]:
        """Messages -> token ids of the chat template's rendering, with the assistant's turn opened."""
        if self.chat is None:
            raise ConfigError("this bundle's tokenizer has no chat template; give a plain prompt, or export "
                              "a model whose tokenizer has one")
        text = self.chat.render(messages, add_generation_prompt=True)
        return self.encode(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _end_of_turn(self, cfg: GenerationConfig) -> frozenset:
        token = self.chat.eos_token if self.chat and not cfg.ignore_eos else ""
        tid = self.tokenizer.token_to_id(token) if token else None
        return frozenset() if tid is None else frozenset([tid])

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
    def _decode(self, ids: list[int], cfg: GenerationConfig, eos: frozenset):
        """_rounds holding the decoder: other threads' requests wait until this one ends or is closed."""
        with self._lock:
            self._owner = threading.get_ident()
            try:
                return (yield from self._rounds(ids, cfg, eos))
            finally:      # also when the stream is closed or dropped while paused, from whichever thread
                self._owner = None

    def _rounds(self, ids: list[int], cfg: GenerationConfig, eos: frozenset):
        """Speculative decoding, one round per iteration (Leviathan et al. 2023, Algorithm 1)."""
        req = self._begin(ids, cfg, eos)
        while req.finish is None:
            k = self._round_size(req)
            if k is None:
                break
            # 1. propose: up to k draft tokens and the laws q they were drawn from
            proposal = self._propose(req, k)
            # 2. verify: ONE target call over the last committed token and the k drafts
            t0 = time.perf_counter()
            logits = self.target.run(np.asarray([req.tokens[-1]] + proposal.tokens))   # [k+1, vocab]
            req.stats.seconds_target += time.perf_counter() - t0
            # 3. accept: the longest accepted prefix, then a recovered or bonus token
            new, n_accepted = self._accept(req, proposal, logits)
            req.stats.record_round(proposal.source, len(proposal.tokens), n_accepted)
            # 4. commit the tokens up to EOS or a stop string; roll every cache back to them
            new, piece = self._stop(req, new)
            self._commit(req, new)
            # 5. emit
            if piece:
                yield piece
        return (yield from self._end(req))

    def _begin(self, ids: list[int], cfg: GenerationConfig, eos: frozenset) -> "_Request":
        """Prefill (reusing the previous request's KV where the prompt shares a prefix with it) and
        start the proposers this request uses."""
        proposers = [p for p in self.proposers if p.enabled(cfg)] if cfg.speculative else []
        k = cfg.k if proposers else 0
        stats = Stats(k=k, prompt_tokens=len(ids), accepted_hist=[0] * (k + 1))
        t0 = time.perf_counter()
        stats.reused_tokens = self.prefix.restore("target", self.target, ids, cfg)
        for p in proposers:
            p.begin(ids, cfg, stats)
        stats.seconds_prefill = time.perf_counter() - t0
        return _Request(cfg=cfg, tokens=list(ids), prompt_len=len(ids), proposers=proposers, stats=stats,
                        rng=np.random.default_rng(cfg.seed), text=TextStream(self.tokenizer, cfg.stop),
                        eos=eos, t0=time.perf_counter())

    def _round_size(self, req: "_Request") -> int | None:
        """Drafts this round may propose: bounded by k, the token budget and the context; None ends
        the request (finish "length")."""
        budget = req.cfg.max_new_tokens - req.stats.new_tokens
        k = min(req.stats.k, budget - 1, self.max_context - len(req.tokens))
        if budget <= 0 or k < 0:
            req.finish = "length"
            return None
        return k

    def _propose(self, req: "_Request", k: int) -> Proposal:
        for p in req.proposers if k else ():
            proposal = p.propose(req.tokens, k, cfg=req.cfg, rng=req.rng, stats=req.stats)
            if proposal is not None:
                return proposal
        return Proposal([], np.empty((0, self.vocab_size), dtype=np.float32), source=None)

    def _accept(self, req: "_Request", proposal: Proposal, logits: np.ndarray) -> tuple[list[int], int]:
        params, drafts = req.cfg.sampling, proposal.tokens
        if params.greedy:
            return accept_greedy(drafts, greedy_tokens(logits, params, history=req.tokens, drafts=drafts))
        p = probs(logits, params, history=req.tokens, drafts=drafts)        # [k+1, vocab]
        return accept(drafts, proposal.q, p, req.rng)

    def _stop(self, req: "_Request", new: list[int]) -> tuple[list[int], str]:
        """The round's tokens up to EOS or the token completing a stop string (setting req.finish), and
        the text they make safe to emit."""
        eos_at = next((i for i, t in enumerate(new) if t in req.eos), None)
        if eos_at is not None:
            new, req.finish = new[:eos_at + 1], "eos"
        shown = len(req.text.ids)
        piece = req.text.push(new if req.finish is None else new[:-1])
        if req.text.stopped:       # the tokens after the one completing the stop string were never said
            new, req.finish = new[:len(req.text.ids) - shown], "stop"
        return new, piece

    def _commit(self, req: "_Request", new: list[int]) -> None:
        """Append the round's tokens and roll every cache back to the committed tokens but the last:
        the one place a rollback happens."""
        req.tokens += new
        req.stats.new_tokens += len(new)
        self.target.truncate(min(self.target.length, len(req.tokens) - 1))
        for p in req.proposers:
            p.commit(req.tokens, len(new))

    def _end(self, req: "_Request"):
        """Record what the caches hold for the next request's prefix reuse; the text's held-back tail."""
        req.stats.seconds_total = time.perf_counter() - req.t0
        self.prefix.record("target", self.target, req.tokens)
        for p in req.proposers:
            p.end(req.tokens)
        tail = req.text.flush()
        if tail:
            yield tail
        return Result(text=req.text.text, token_ids=req.tokens[req.prompt_len:], finish_reason=req.finish,
                      stats=req.stats)


@dataclass
class _Request:
    """One request's state while the loop runs."""
    cfg: GenerationConfig
    tokens: list[int]                 # committed: prompt + output so far
    prompt_len: int
    proposers: list
    stats: Stats
    rng: np.random.Generator
    text: TextStream
    eos: frozenset
    t0: float
    finish: str | None = None


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


def _ort_engines(path: Path, m: Manifest, roles: list[str], *, providers, threads: int, draft_threads: int) -> dict:
    """An OrtEngine per role, each checked against the manifest's cache layout."""
    from specedge.engines import OrtEngine
    engines = {}
    for role in roles:
        info = m.models[role]
        e = OrtEngine(path / info.file, vocab_size=m.vocab_size, max_context=m.max_context, providers=providers,
                      threads=draft_threads if role == "draft" else threads, num_kv_heads=info.num_kv_heads,
                      head_dim=info.head_dim, share_buffer=info.kv_in_place)
        got = (e.num_layers, e.num_kv_heads, e.head_dim)
        if got != (info.num_layers, info.num_kv_heads, info.head_dim):
            raise BundleError(f"{role} graph has (layers, kv heads, head dim) {got} but the manifest says "
                              f"{(info.num_layers, info.num_kv_heads, info.head_dim)}; re-export the bundle")
        engines[role] = e
    return engines


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
