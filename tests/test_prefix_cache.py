"""Prefix reuse across requests: a request prefills only what its prompt does not share with the
tokens the caches already hold, and its greedy output is a fresh decoder's (sampled draws keep the law;
reused KV computed token by token may shift q slightly, so they are compared on exact repeats only)."""
from __future__ import annotations

import pytest

from specedge.runtime.config import ConfigError, GenerationConfig
from specedge.runtime.errors import BusyError
from specedge.runtime.decoder import SpeculativeDecoder

P = [ord(c) for c in "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n"]
Q = [ord(c) for c in "import os\nprint(os.getcwd())\n"]
GREEDY = dict(max_new_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def decoders(pair_bundles):
    """One decoder that keeps its caches between requests, one that never does (the reference)."""
    load = lambda: SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=1, speculative=True)
    return load(), load()


def fresh(dec, prompt, **kw):
    return dec.generate(prompt, prefix_cache=False, **kw)


def test_requests_reuse_what_they_share_and_match_a_fresh_decoder(decoders):
    dec, ref = decoders
    first = dec.generate(P, **GREEDY)
    out = first.token_ids
    steps = [  # (prompt, speculative, KV tokens the target keeps (at most len(prompt) - 1), the draft's)
        (P, True, len(P) - 1, len(P) - 1),                # the same prompt again
        (P + out[:5], True, len(P) + 4, None),            # the editor's next keystrokes / a chat's next turn
        (P + out[:5], False, len(P) + 4, 0),              # target-only: the draft's cache is left alone ...
        (P[:-3] + [ord("x")], True, len(P) - 3, len(P) - 3),   # ... and reused here: an edit 3 tokens back
        (Q, True, 0, 0),                                  # nothing in common
        (P[:-3] + [ord("x")], True, 0, 0),                # the caches now hold Q's tokens
    ]
    for i, (prompt, spec, reused, draft_reused) in enumerate(steps):
        got = dec.generate(prompt, speculative=spec, **GREEDY)
        want = fresh(ref, prompt, speculative=spec, **GREEDY)
        assert got.token_ids == want.token_ids, i
        assert got.stats.reused_tokens == reused and want.stats.reused_tokens == 0, i
        if draft_reused is not None:      # (after an output the draft lags or leads by what it drafted)
            assert got.stats.draft_reused_tokens == draft_reused, i
        assert got.stats.prompt_tokens == len(prompt)


def test_sampled_repeat_is_the_same_draw(decoders):
    dec, ref = decoders
    kw = dict(max_new_tokens=12, temperature=0.9, seed=5, ignore_eos=True)
    dec.generate(Q, **kw)
    again = dec.generate(Q, **kw)
    assert again.stats.reused_tokens == len(Q) - 1
    assert again.token_ids == fresh(ref, Q, **kw).token_ids


def test_abandoned_stream_and_outside_runs_are_not_trusted(decoders):
    dec, ref = decoders
    dec.generate(P, **GREEDY)
    stream = dec.stream(P + [ord(" ")], **GREEDY)
    next(iter(stream))                                    # abandoned after its first piece
    stream.close()
    assert dec.generate(P, **GREEDY).stats.reused_tokens == 0
    dec.target.truncate(0)                                # code that runs an engine directly in between
    dec.target.run(Q[:-1])
    got = dec.generate(Q, **GREEDY)
    assert got.stats.reused_tokens == 0
    assert got.token_ids == fresh(ref, Q, **GREEDY).token_ids


def test_a_second_request_from_the_streams_own_thread_is_refused(decoders):
    """A decoder serves one request at a time: while this thread's stream is open, another request
    from the same thread raises BusyError (waiting would deadlock), and the stream still completes."""
    dec, ref = decoders
    stream = dec.stream(P, speculative=False, **GREEDY)
    pieces = iter(stream)
    next(pieces)
    with pytest.raises(BusyError, match="one request at a time"):
        dec.generate(Q + Q, **GREEDY)
    with pytest.raises(BusyError, match="close"):
        dec.stream(Q, **GREEDY)
    list(pieces)
    assert stream.result.token_ids == fresh(ref, P, speculative=False, **GREEDY).token_ids
    got = dec.generate(Q + Q + [ord("z")], **GREEDY)
    assert got.token_ids == fresh(ref, Q + Q + [ord("z")], **GREEDY).token_ids


def test_prefix_cache_off_and_bad_values(decoders):
    dec, _ = decoders
    dec.generate(P, **GREEDY)
    assert dec.generate(P, prefix_cache=False, **GREEDY).stats.reused_tokens == 0
    with pytest.raises(ConfigError, match="prefix_cache"):
        GenerationConfig(prefix_cache="yes")


def test_generate_from_several_threads_takes_turns(decoders):
    """Threads sharing one decoder get the outputs they would get alone (and reuse stays correct)."""
    import threading
    dec, ref = decoders
    prompts = [P, Q, P + [ord("#")], Q + Q, P[:20]] * 2
    want = [fresh(ref, p, **GREEDY).token_ids for p in prompts]
    got, errors = [None] * len(prompts), []

    def work(idx):
        try:
            for i in idx:
                got[i] = dec.generate(prompts[i], **GREEDY).token_ids
        except Exception as e:  # noqa: BLE001 -- reported by the assertion below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(range(j, len(prompts), 3),)) for j in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == want


def test_a_stream_and_generate_from_two_threads_both_complete(decoders):
    """A stream being read in one thread holds the engines: another thread's generate() waits for it
    (it does not break it), and a stream that is closed early lets the waiting request go at once."""
    import threading
    dec, ref = decoders
    want_p, want_q = fresh(ref, P, **GREEDY).token_ids, fresh(ref, Q, **GREEDY).token_ids
    stream, got = dec.stream(P, **GREEDY), {}
    pieces = iter(stream)
    next(pieces)                                          # the stream holds the engines from here
    asking = threading.Event()

    def ask_q():
        asking.set()
        got.setdefault("q", dec.generate(Q, **GREEDY).token_ids)
    worker = threading.Thread(target=ask_q)
    worker.start()
    assert asking.wait(timeout=30)
    worker.join(timeout=0.3)                              # it cannot finish while the stream holds the engines
    assert worker.is_alive() and "q" not in got           # waiting, not interleaving
    for _ in pieces:
        worker.join(timeout=0.01)                         # room to cut in between pieces (it must not)
    worker.join(timeout=30)
    assert stream.result.token_ids == want_p and got["q"] == want_q
    stream = dec.stream(P, **GREEDY)
    pieces = iter(stream)                                 # still referenced: only close() ends the request
    next(pieces)
    stream.close()                                        # stopped early: the next request need not wait
    worker = threading.Thread(target=lambda: got.__setitem__("q2", dec.generate(Q, **GREEDY).token_ids))
    worker.start()
    worker.join(timeout=30)
    assert got["q2"] == want_q
