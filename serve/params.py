"""OpenAI request bodies -> decoder arguments. Every problem is a RequestError (HTTP 400) naming the field."""
from __future__ import annotations

import math

# OpenAI fields we accept and map; GenerationConfig fields a client may also send (extra_body) as they are
EXTRA_FIELDS = ("top_k", "repetition_penalty", "k", "draft_confidence", "ngram", "ngram_min", "ignore_eos",
                "speculative")
# harmless OpenAI fields: ignored whatever their value
IGNORED = ("user", "stream_options", "metadata", "store", "service_tier")
# OpenAI fields accepted only at their neutral value (what specedge does anyway); any other value is a 400
NEUTRAL = {"logprobs": (None, False, 0), "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
           "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}),
           "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none"),
           "parallel_tool_calls": (None, False, True), "response_format": (None, {"type": "text"})}
COMMON = ("model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream") + EXTRA_FIELDS


class RequestError(Exception):
    """A request the server refuses: status, OpenAI error type, message."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


def _number(body: dict, name: str):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RequestError(f"'{name}' must be a finite number, got {v!r}")
    return float(v)


def _integer(body: dict, name: str, low: int):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise RequestError(f"'{name}' must be an integer >= {low}, got {v!r}")
    return v


def parse(body, chat: bool) -> tuple[dict, dict]:
    """The request body -> (what to decode: {"prompt"} or {"messages"}, decoder overrides + "stream")."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    main = ("messages", "max_completion_tokens") if chat else ("prompt",)
    known = set(COMMON) | set(main) | set(IGNORED) | set(NEUTRAL)
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise RequestError(f"unsupported parameters {unknown}: specedge takes {sorted(COMMON + main)}")
    odd = sorted(k for k, ok in NEUTRAL.items() if k in body and not any(body[k] == v and type(body[k]) is type(v)
                                                                        for v in ok))
    if odd:
        raise RequestError(f"unsupported values for {odd}: specedge accepts them only at their neutral value")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"'model' must be a string, got {model!r}")
    n = _integer(body, "n", 0)
    if n not in (None, 1):
        raise RequestError(f"'n' must be 1 (one completion per request), got {n}")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false, got {stream!r}")

    over: dict = {}
    max_tokens = _integer(body, "max_tokens", 1)
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is not None:
        over["max_new_tokens"] = max_tokens
    for name in ("temperature", "top_p", "repetition_penalty", "draft_confidence"):
        v = _number(body, name)
        if v is not None:
            over[name] = v
    for name, low in (("seed", 0), ("top_k", 0), ("k", 1), ("ngram", 0), ("ngram_min", 1)):
        v = _integer(body, name, low)
        if v is not None:
            over[name] = v
    for name in ("ignore_eos", "speculative"):
        v = body.get(name)
        if v is not None:
            if not isinstance(v, bool):
                raise RequestError(f"'{name}' must be true or false, got {v!r}")
            over[name] = v
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or any(not isinstance(s, str) or not s for s in stop):
            raise RequestError(f"'stop' must be a non-empty string or a list of them, got {body.get('stop')!r}")
        if len(stop) > 16:
            raise RequestError(f"'stop' takes at most 16 strings, got {len(stop)}")
        over["stop"] = tuple(stop)
    over["stream"] = stream

    if chat:
        return {"messages": _messages(body.get("messages"))}, over
    return {"prompt": _prompt(body.get("prompt"))}, over


def _prompt(p):
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]        # a batch of one
    if isinstance(p, str):
        if not p:
            raise RequestError("'prompt' is empty; give at least one character")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p        # token ids; the decoder checks their range
    raise RequestError("'prompt' must be a non-empty string, a list of token ids, or a list of one of those "
                       "(one prompt per request)")


def _messages(ms):
    if not isinstance(ms, list) or not ms:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(ms):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if isinstance(content, list):       # content parts: text only
            if any(not isinstance(c, dict) or c.get("type") != "text" or not isinstance(c.get("text"), str)
                   for c in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported")
            content = "".join(c["text"] for c in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out
