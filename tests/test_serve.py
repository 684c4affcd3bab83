"""spec-serve: a real uvicorn server in this process on a free loopback port, over the tiny test pair,
driven by the official openai client and raw httpx."""
from __future__ import annotations

import json
import re
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from specedge.runtime import SpeculativeDecoder  # noqa: E402
from specedge.serve import create_app  # noqa: E402

KEY = "test-key-123"
PROMPT = "def add(a, b):"
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
            "{% if add_generation_prompt %}<|{{ 'assistant' }}|>{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(decoder, **kw):
    """create_app(decoder, **kw) served by uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    app = create_app(decoder, model_id="tiny", **kw)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.02)
    assert server.started, "the server did not start"
    try:
        yield url, app
    finally:
        server.should_exit = True
        t.join(timeout=10)


@pytest.fixture(scope="module")
def decoder(pair_bundles):
    return SpeculativeDecoder.from_bundle(pair_bundles["agree"], providers=["cpu"], threads=1, speculative=True)


@pytest.fixture(scope="module")
def chat_decoder(pair_bundles, tmp_path_factory):
    """The agree pair with a chat template written into a copy of its manifest."""
    out = tmp_path_factory.mktemp("chat") / "agree_chat"
    shutil.copytree(pair_bundles["agree"], out)
    m = json.loads((out / "manifest.json").read_text())
    m["chat_template"] = "chat_template.jinja"
    m["chat_tokens"] = {"eos_token": "<|endoftext|>"}
    (out / "manifest.json").write_text(json.dumps(m))
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return SpeculativeDecoder.from_bundle(out, providers=["cpu"], threads=1, speculative=True)


@pytest.fixture(scope="module")
def server(decoder):
    with serving(decoder, api_key=KEY, max_queue=8, timeout=30, max_body_bytes=4096) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=30)


def test_completions_match_the_decoder(server, client, decoder):
    ref = decoder.generate(PROMPT, max_new_tokens=24, temperature=0.0)
    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    assert got.choices[0].text == ref.text
    assert got.choices[0].finish_reason == {"eos": "stop", "stop": "stop", "length": "length"}[ref.finish_reason]
    assert got.usage.completion_tokens == len(ref.token_ids) and got.usage.prompt_tokens == ref.stats.prompt_tokens
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    ext = got.model_extra["specedge"]
    assert set(ext) >= {"alpha", "tokens_per_target_call", "accepted", "drafted"} and ext["drafted"] > 0
    # streamed: the same text; usage and stats in the final chunk
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert "specedge" in chunks[-1].model_extra
    # stop strings and seeds reach the decoder
    ref = decoder.generate(PROMPT, max_new_tokens=24, temperature=0.8, top_p=0.9, seed=7, stop=["\n"])
    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0.8, top_p=0.9,
                                    seed=7, stop="\n")
    assert got.choices[0].text == ref.text


def test_models_health_metrics(server, client):
    url, _ = server
    assert [m.id for m in client.models.list()] == ["tiny"] and client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    assert httpx.get(url + "/health").json()["status"] == "ok"
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for name in ("specedge_requests_total", "specedge_generated_tokens_total", "specedge_alpha",
                 "specedge_tokens_per_target_call", "specedge_queue_depth", "specedge_request_duration_seconds_sum",
                 "specedge_request_duration_seconds_count"):
        assert re.search(rf"^{name}(\{{.*\}})? [0-9.e+-]+$", text, re.M), name


@pytest.mark.parametrize("body, status, words", [
    ({"prompt": PROMPT, "n": 2}, 400, "'n'"),
    ({"prompt": PROMPT, "frobnicate": 1}, 400, "frobnicate"),
    ({"prompt": PROMPT, "max_tokens": "many"}, 400, "max_tokens"),
    ({"prompt": PROMPT, "temperature": -1}, 400, "temperature"),
    ({"prompt": PROMPT, "logprobs": 3}, 400, "logprobs"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": [999999]}, 400, "token ids"),
    ({"prompt": PROMPT, "stop": [1]}, 400, "stop"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_requests_are_400_with_a_json_error(server, body, status, words):
    r = httpx.post(server[0] + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error"


def test_bad_json_big_bodies_keys_and_routes(server):
    url, auth = server[0], {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", json={"prompt": "x" * 5000}, headers=auth)
    assert r.status_code == 413 and "max-body-bytes" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.post(url + "/v1/completions", json={"prompt": PROMPT}).status_code == 401
    assert httpx.get(url + "/v1/models").status_code == 401
    r = httpx.get(url + "/v2/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(url + "/v1/completions").status_code == 405
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt=PROMPT, max_tokens=4)


def test_chat_without_a_template_is_a_400(server, client):
    with pytest.raises(openai.BadRequestError, match="chat template"):
        client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4)


def test_chat_matches_the_decoder(chat_decoder):
    with serving(chat_decoder) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        ref = chat_decoder.generate(messages=CHAT, max_new_tokens=20, temperature=0.0)
        got = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, temperature=0)
        assert got.choices[0].message.content == ref.text and got.choices[0].message.role == "assistant"
        assert got.usage.completion_tokens == len(ref.token_ids) and got.usage.prompt_tokens == ref.stats.prompt_tokens
        chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
        assert chunks[-1].choices[0].finish_reason and chunks[-1].usage.total_tokens > 0
        # content parts and max_completion_tokens
        got = client.chat.completions.create(
            model="tiny", max_completion_tokens=20, temperature=0,
            messages=[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                      {"role": "user", "content": "2+2?"}])
        assert got.choices[0].message.content == ref.text
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny", messages=[{"content": "no role"}], max_tokens=4)


@contextmanager
def _decoder_held(dec):
    """Hold the decoder from this thread (a stream's first piece takes its lock): the server's worker
    then blocks on its next request until the stream is closed."""
    s = dec.stream(PROMPT, max_new_tokens=200, ignore_eos=True, temperature=0.0)
    it = iter(s)          # kept: a dropped iterator closes the request
    next(it)
    try:
        yield
    finally:
        it.close()
        s.close()


def _wait(pred, seconds=10.0):
    t = time.monotonic() + seconds
    while time.monotonic() < t:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_a_full_queue_is_429(decoder):
    with serving(decoder, max_queue=3, timeout=60) as (url, app):
        engine, body = app.state.engine, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        ref = decoder.generate(PROMPT, max_new_tokens=4, temperature=0.0).text
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
        with ThreadPoolExecutor(4) as pool:
            with _decoder_held(decoder):
                futures = [pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=30)]
                assert _wait(lambda: engine.running == 1)
                futures += [pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=30) for _ in range(2)]
                # a streamed request waiting over a second gets SSE keep-alive comments, which clients skip
                streamed = pool.submit(lambda: "".join(c.choices[0].text for c in client.completions.create(
                    model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, stream=True)))
                assert _wait(lambda: engine.waiting == 3)
                r = httpx.post(url + "/v1/completions", json=body)
                assert r.status_code == 429 and r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "rate_limit_error" and "--max-queue" in r.json()["error"]["message"]
                assert "specedge_queue_depth 3" in httpx.get(url + "/metrics").text
                time.sleep(1.5)
            # the decoder free again: the queued requests are all answered
            assert [(f.result().status_code, f.result().json()["choices"][0]["text"]) for f in futures] == [(200, ref)] * 3
            assert streamed.result() == ref
        assert 'status="429"' in httpx.get(url + "/metrics").text


def test_timeouts_are_504_or_a_final_error_event(decoder):
    with serving(decoder, max_queue=4, timeout=1.0) as (url, app):
        body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        with _decoder_held(decoder), ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=30)
            with pytest.raises(openai.APIError, match="longer than"):     # streamed: the error event
                list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, stream=True))
            r = waiting.result()
            assert r.status_code == 504 and "--timeout" in r.json()["error"]["message"]
            assert app.state.engine.waiting == 0          # timed-out waiters leave the queue at once
        r = httpx.post(url + "/v1/completions", json=body)               # and the server carries on
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == decoder.generate(
            PROMPT, max_new_tokens=4, temperature=0.0).text


class _Slow:
    """The decoder, its pieces 50 ms apart: a 240-token stream would hold it for 12 s."""

    def __init__(self, dec):
        self.dec = dec

    def stream(self, *args, **kw):
        from specedge.runtime.results import Stream
        s = self.dec.stream(*args, **kw)

        def slow():
            it = iter(s)
            try:
                for piece in it:
                    time.sleep(0.05)
                    yield piece
            finally:
                it.close()
                s.close()
            return s.result
        return Stream(slow())


def test_a_client_leaving_mid_stream_frees_the_decoder(decoder):
    with serving(_Slow(decoder), timeout=60) as (url, app):
        engine = app.state.engine
        with httpx.Client(timeout=30) as c:
            with c.stream("POST", url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 240,
                                                                  "ignore_eos": True, "stream": True}) as r:
                first = next(r.iter_lines())
                assert first.startswith("data: ")
            # closed after the first chunk: the worker closes the stream at its next piece
            assert _wait(lambda: engine.running == 0 and engine.waiting == 0)
            t = time.monotonic()
            r = c.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200 and time.monotonic() - t < 3
            assert r.json()["choices"][0]["text"] == decoder.generate(PROMPT, max_new_tokens=8, temperature=0.0).text
        assert _wait(lambda: 'status="499"' in httpx.get(url + "/metrics").text, 5)


def test_a_client_leaving_a_plain_request_frees_its_place(decoder):
    with serving(decoder, max_queue=4, timeout=60) as (url, app):
        engine, body = app.state.engine, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}

        def gives_up():     # long enough to be queued on a loaded machine, far shorter than the hold
            with pytest.raises(httpx.TimeoutException):
                httpx.post(url + "/v1/completions", json=body, timeout=2.0)
        with _decoder_held(decoder), ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(gives_up) for _ in range(2)]:
                f.result()
            assert _wait(lambda: engine.waiting == 0)        # the waiter left the queue
        assert _wait(lambda: 'endpoint="completions",status="499"} 2' in httpx.get(url + "/metrics").text)
        assert _wait(lambda: engine.running == 0)
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200


def _rss_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.slow
def test_load_mixed_clients(decoder):
    """40 client threads, 240 requests: plain, streamed, chat-less errors, early disconnects, malformed.
    Every well-formed request is answered correctly, none lost; health ok; RSS flat between halves."""
    refs = {n: decoder.generate(PROMPT + str(n), max_new_tokens=12, temperature=0.0).text for n in range(4)}
    with serving(decoder, api_key=KEY, max_queue=64, timeout=120, max_body_bytes=8192) as (url, app):
        auth = {"Authorization": f"Bearer {KEY}"}
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)

        def one(i: int) -> str:
            n, kind = i % 4, i % 6
            if kind in (0, 1):
                got = client.completions.create(model="tiny", prompt=PROMPT + str(n), max_tokens=12, temperature=0)
                return "ok" if got.choices[0].text == refs[n] else f"wrong text {i}"
            if kind == 2:
                s = client.completions.create(model="tiny", prompt=PROMPT + str(n), max_tokens=12, temperature=0,
                                              stream=True)
                text = "".join(c.choices[0].text for c in s)
                return "ok" if text == refs[n] else f"wrong stream {i}"
            if kind == 3:        # leaves after the first chunk
                with httpx.stream("POST", url + "/v1/completions", headers=auth, timeout=120,
                                  json={"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
                    next(r.iter_lines())
                return "ok"
            if kind == 4:        # malformed
                r = httpx.post(url + "/v1/completions", headers={**auth, "Content-Type": "application/json"},
                               content=[b"{bad", b'{"prompt": 3}', b'{"prompt": "x", "n": 5}'][n % 3], timeout=120)
                return "ok" if r.status_code == 400 and "error" in r.json() else f"malformed {i}: {r.status_code}"
            r = httpx.post(url + "/v1/completions", headers=auth, timeout=120,
                           json={"prompt": PROMPT + str(n), "max_tokens": 12, "temperature": 0, "stream": False})
            return "ok" if r.json()["choices"][0]["text"] == refs[n] else f"wrong raw {i}"

        rss, results, t0 = [], [], time.monotonic()
        with ThreadPoolExecutor(40) as pool:
            for half in range(2):
                results += list(pool.map(one, range(half * 120, half * 120 + 120), timeout=240))
                rss.append(_rss_kb())
        assert len(results) == 240 and all(r == "ok" for r in results), [r for r in results if r != "ok"][:5]
        assert time.monotonic() - t0 < 240
        h = httpx.get(url + "/health").json()
        assert h["status"] == "ok" and h["worker_alive"]
        assert _wait(lambda: app.state.engine.running == 0 and app.state.engine.waiting == 0)

        def answered():      # every request counted once by the server, whatever its status
            text = httpx.get(url + "/metrics", headers=auth).text
            return sum(int(v) for v in re.findall(r'^specedge_requests_total\{endpoint="completions",status="\d+"\} (\d+)',
                                                  text, re.M))
        assert _wait(lambda: answered() == 240), answered()
        text = httpx.get(url + "/metrics", headers=auth).text
        assert 'status="400"' in text and 'status="200"' in text
        assert float(re.search(r"^specedge_alpha (\S+)", text, re.M)[1]) > 0
        print(f"load: 240 requests in {time.monotonic() - t0:.1f} s, VmRSS kB after each half {rss}")
        assert rss[1] <= rss[0] * 1.10, rss


def test_cli_refuses_a_bad_bundle_with_one_line(tmp_path, capsys):
    from specedge.serve.cli import main
    assert main([str(tmp_path / "missing"), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spec-serve: ") and "Traceback" not in err


@pytest.mark.slow
def test_cli_serves_a_bundle(pair_bundles, tmp_path):
    import os
    import subprocess
    import sys
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "specedge.serve.cli", str(pair_bundles["agree"]), "--port", str(port),
                          "--threads", "1", "--api-key", KEY, "--force-draft", "--log-level", "warning"],
                         stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                return httpx.get(url + "/health", timeout=1).json()["status"] == "ok"
            except httpx.HTTPError:
                return False
        assert _wait(up, 60), (tmp_path / "serve.log").read_text()
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        got = client.completions.create(model="agree", prompt=PROMPT, max_tokens=8, temperature=0)
        assert got.usage.completion_tokens >= 1 and got.model == "agree"
    finally:
        p.terminate()
        p.wait(timeout=20)
