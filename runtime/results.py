"""What a request returns: its Result (text, ids, finish reason), its Stats, and the Stream that yields
its text as it is committed."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterator


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
    # proposer name -> {"rounds", "accepted", "evaluated"}: which proposer drafted what
    proposers: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds_prefill: float = 0.0
    seconds_target: float = 0.0
    seconds_draft: float = 0.0
    seconds_total: float = 0.0        # decode phase (after prefill)

    def record_round(self, source: str | None, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.target_calls += 1
        if not drafted:
            return
        evaluated = accepted + (accepted < drafted)       # the drafts the verifier reached
        self.drafted += drafted
        self.accepted += accepted
        self.evaluated += evaluated
        self.accepted_hist[accepted] += 1
        mine = self.proposers.setdefault(source, {"rounds": 0, "accepted": 0, "evaluated": 0})
        mine["rounds"] += 1
        mine["accepted"] += accepted
        mine["evaluated"] += evaluated

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.evaluated if self.evaluated else 0.0

    def _lookup(self, key: str) -> int:
        return self.proposers.get("lookup", {}).get(key, 0)

    @property
    def lookup_rounds(self) -> int:       # rounds drafted by prompt lookup instead of the draft model
        return self._lookup("rounds")

    @property
    def lookup_accepted(self) -> int:
        return self._lookup("accepted")

    @property
    def lookup_evaluated(self) -> int:
        return self._lookup("evaluated")

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
        for name in ("acceptance_rate", "alpha", "lookup_rounds", "lookup_accepted", "lookup_evaluated",
                     "lookup_alpha", "tokens_per_target_call", "tokens_per_second", "seconds_host"):
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
        """Stop this request and free the decoder for the next one (dropping the stream does the same)."""
        self._gen.close()
