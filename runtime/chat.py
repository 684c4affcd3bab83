"""Chat templates: a bundle carries its tokenizer's Jinja template, rendered here as transformers'
apply_chat_template renders it (sandboxed Jinja, trim_blocks and lstrip_blocks, the special tokens in
its context), without transformers."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .errors import BundleError, ConfigError

ROLES_HINT = 'a list of {"role": "system" | "user" | "assistant", "content": "..."} objects'


@dataclass(frozen=True)
class ChatTemplate:
    source: str                    # the Jinja text
    bos_token: str = ""
    eos_token: str = ""            # the template's end-of-turn token: a chat request stops there

    def render(self, messages, *, add_generation_prompt: bool = True) -> str:
        messages = check_messages(messages)
        from jinja2 import TemplateError
        try:
            return _compile(self.source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=self.bos_token, eos_token=self.eos_token)
        except ConfigError:
            raise
        except TemplateError as e:
            raise ConfigError(f"the bundle's chat template failed on these messages: {e}") from None


def check_messages(messages) -> list[dict]:
    if isinstance(messages, (str, bytes)) or not hasattr(messages, "__iter__"):
        raise ConfigError(f"messages must be {ROLES_HINT}; got {type(messages).__name__}")
    out = list(messages)
    if not out:
        raise ConfigError(f"messages is empty; give {ROLES_HINT}")
    for i, m in enumerate(out):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ConfigError(f"message {i} must be an object with a string 'role' and 'content' "
                              f"({ROLES_HINT}); got {m!r:.120}")
    return [{"role": m["role"], "content": m["content"]} for m in out]


def _raise(message: str):
    raise ConfigError(f"the bundle's chat template refused these messages: {message}")


_CACHE: dict[str, object] = {}


def _compile(source: str):
    if source not in _CACHE:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        from jinja2 import TemplateError
        try:
            _CACHE[source] = env.from_string(source)
        except TemplateError as e:
            raise BundleError(f"the bundle's chat template is not valid Jinja ({e}); re-export the bundle") from None
    return _CACHE[source]
