"""GGUF files as export sources, and chat templates rendered without transformers."""
from __future__ import annotations

import io
import json

import pytest

from specedge.export.cli import main as export_main
from specedge.export.tiny import make_gguf
from specedge.runtime import ConfigError, SpeculativeDecoder
from specedge.runtime.chat import ChatTemplate
from specedge.runtime.cli import main as run_main
from specedge.runtime.cli import serve_jsonl

# SmolLM2-Instruct's template (a default system turn), Gemma's shape (no system role: it raises), and
# one with Jinja whitespace control that trim_blocks / lstrip_blocks change.
WITH_SYSTEM = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
               "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
NO_SYSTEM = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
             "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
BLOCKS = ("{% for m in messages %}\n  {% if m.role == 'user' %}\n[U] {{ m.content }}\n  {% else %}\n"
          "[{{ m.role }}] {{ m.content }}\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}[A]{% endif %}")
TINY = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
        "{% if add_generation_prompt %}<|{{ 'assistant' }}|>{% endif %}")
CHATS = [[{"role": "user", "content": "Hi there"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": " and 3+3? "}]]


def _hf_render(template: str, messages, **tokens) -> str:
    """transformers' own rendering, the reference."""
    from transformers.utils.chat_template_utils import render_jinja_template
    out, _ = render_jinja_template(conversations=[messages], chat_template=template, add_generation_prompt=True,
                                   **tokens)
    return out[0]


@pytest.mark.parametrize("template", [WITH_SYSTEM, BLOCKS, NO_SYSTEM])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_templates_render_as_transformers_renders_them(template, chat):
    messages = CHATS[chat]
    ours = ChatTemplate(template, bos_token="<bos>", eos_token="<eos>")
    if template is NO_SYSTEM and messages[0]["role"] == "system":
        with pytest.raises(ConfigError, match="System role not supported"):
            ours.render(messages)
        return
    assert ours.render(messages) == _hf_render(template, messages, bos_token="<bos>", eos_token="<eos>")


@pytest.mark.parametrize("bad, match", [("hi", "messages must be"), ([], "empty"), ([{"role": "user"}], "message 0"),
                                        ([{"role": "user", "content": 3}], "message 0")])
def test_bad_messages_are_one_config_error(bad, match):
    with pytest.raises(ConfigError, match=match):
        ChatTemplate(TINY).render(bad)


def test_the_sandbox_refuses_unsafe_templates():
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ConfigError, match="chat template failed"):
        ChatTemplate(evil).render(CHATS[0])


def test_a_bundle_without_a_template_refuses_chat(pair_bundles, capsys):
    dec = SpeculativeDecoder.from_bundle(pair_bundles["agree"], threads=1, speculative=False)
    with pytest.raises(ConfigError, match="no chat template"):
        dec.generate(messages=CHATS[0])
    assert run_main([str(pair_bundles["agree"]), "--chat", "hi", "--threads", "1", "--no-speculation"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no chat template" in err[0]


@pytest.fixture(scope="module")
def gguf_bundle(tmp_path_factory):
    """A target and a draft, both GGUF files, exported into one bundle by the CLI."""
    root = tmp_path_factory.mktemp("gguf")
    target = make_gguf(root / "target.gguf", seed=1, chat_template=TINY)
    draft = make_gguf(root / "draft.gguf", seed=2, layers=1)
    out = root / "bundle"
    assert export_main(["--target", str(target), "--draft", str(draft), "--out", str(out), "--max-context", "128",
                        "--quiet"]) == 0
    return out


@pytest.mark.slow
def test_gguf_pair_exports_with_its_tokenizer_and_template(gguf_bundle):
    from transformers import AutoTokenizer
    m = json.loads((gguf_bundle / "manifest.json").read_text())
    assert m["chat_template"] == "chat_template.jinja" and m["chat_tokens"]["eos_token"] == "<|endoftext|>"
    assert m["models"]["target"]["source"].endswith("target.gguf") and m["eos_token_ids"] == [256]
    assert max(d["max_rel_diff"] for d in m["models"]["target"]["parity"].values()) < 1e-4
    assert not [p for p in gguf_bundle.parent.iterdir() if ".hf-" in p.name]     # the conversions are gone
    ref = AutoTokenizer.from_pretrained(gguf_bundle.parent, gguf_file="target.gguf")
    dec = SpeculativeDecoder.from_bundle(gguf_bundle, threads=1, speculative=True)
    text = "def héllo(x):\n"
    assert dec.encode(text) == ref(text)["input_ids"]
    chat = dec.encode_chat(CHATS[0])
    assert chat == ref.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=True)["input_ids"]
    spec = dec.generate(messages=CHATS[0], max_new_tokens=24, temperature=0.0)
    plain = dec.generate(messages=CHATS[0], max_new_tokens=24, temperature=0.0, speculative=False)
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    assert spec.finish_reason in ("eos", "length")


@pytest.mark.slow
def test_chat_stops_at_the_templates_end_of_turn(gguf_bundle, capsys):
    from dataclasses import replace
    dec = SpeculativeDecoder.from_bundle(gguf_bundle, threads=1, speculative=False)
    dec.eos = set()                    # only the template's end-of-turn token can stop the request now
    free = dec.generate(messages=CHATS[1], max_new_tokens=12, temperature=1.0, seed=3)
    eot = free.token_ids[6]            # make a token of that very draw the template's end of turn
    dec.chat = replace(dec.chat, eos_token=dec.tokenizer.id_to_token(eot))
    res = dec.generate(messages=CHATS[1], max_new_tokens=12, temperature=1.0, seed=3)
    first = free.token_ids.index(eot)
    assert res.finish_reason == "eos" and res.token_ids == free.token_ids[:first + 1]
    plain = dec.generate(dec.encode_chat(CHATS[1]), max_new_tokens=12, temperature=1.0, seed=3)
    assert plain.token_ids == free.token_ids          # a plain prompt does not stop there
    out = io.StringIO()
    lines = [json.dumps({"id": 1, "messages": CHATS[0], "max_new_tokens": 4}),
             json.dumps({"id": 2, "messages": "hi"}), json.dumps({"id": 3, "prompt": "x", "messages": CHATS[0]})]
    assert serve_jsonl(dec, lines, out) == 2
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert "text" in replies[0] and "messages must be" in replies[1]["error"] and "not both" in replies[2]["error"]


@pytest.mark.slow
def test_bad_gguf_files_are_one_error(tmp_path, capsys):
    good = make_gguf(tmp_path / "m.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:200])
    odd = make_gguf(tmp_path / "odd.gguf", arch="rwkv6")
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    for path, why in ((cut, "not a readable GGUF"), (odd, "does not read"), (text, "not a GGUF model")):
        assert export_main(["model", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_chat_renders_the_template(gguf_bundle, capsys):
    args = [str(gguf_bundle), "--chat", "Hi there", "--system", "Be brief.", "--max-new-tokens", "6", "--threads", "1",
            "--json", "--no-speculation"]
    assert run_main(args) == 0
    got = json.loads(capsys.readouterr().out)
    dec = SpeculativeDecoder.from_bundle(gguf_bundle, threads=1, speculative=False)
    want = dec.generate(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
                        max_new_tokens=6)
    assert got["token_ids"] == want.token_ids and got["stats"]["prompt_tokens"] == want.stats.prompt_tokens
    assert run_main([str(gguf_bundle), "--system", "x", "--threads", "1"]) == 2       # --system needs --chat
