"""spec-run BUNDLE "prompt": speculative decoding on an exported bundle, streamed to the terminal.

spec-run BUNDLE --jsonl: a request per standard-input line, a JSON result per standard-output line, the
bundle loaded once and each request reusing the KV of what it shares with the last (prefix_cache): an
editor or a script can keep one process and pipe completions through it."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .console import ENGINE_HELP, PROVIDERS_HELP
from .config import DEFAULT_K, GenerationConfig, SamplingParams, load_toml, model_defaults
from .errors import ConfigError, SpecedgeError
from .manifest import Manifest

_G, _S = GenerationConfig(), SamplingParams()
# flag -> GenerationConfig / SamplingParams field; a flag left out keeps the --config value, else the
# bundle's (its target's generation_config.json sampling settings), else GenerationConfig's
_FIELDS = {"max_new_tokens": "max_new_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
           "repetition_penalty": "repetition_penalty", "k": "k", "draft_confidence": "draft_confidence",
           "seed": "seed", "ngram": "ngram", "ngram_min": "ngram_min"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="spec-run", description=__doc__)
    ap.add_argument("bundle", help="bundle folder written by spec-export")
    ap.add_argument("prompt", nargs="?", help="prompt text ('-' reads standard input); not with --jsonl")
    ap.add_argument("--chat", metavar="MESSAGE",
                    help="a user message, rendered by the bundle's chat template (instead of a prompt)")
    ap.add_argument("--system", metavar="TEXT", help="with --chat: a system message before it")
    ap.add_argument("--config", help="TOML file of generation settings (flags override it)")
    ap.add_argument("--max-new-tokens", type=int, help=f"default {_G.max_new_tokens}")
    ap.add_argument("--temperature", type=float, help=f"0 = greedy (default: the model's, else {_S.temperature})")
    ap.add_argument("--top-k", type=int, help="0 = off (default: the model's, else off)")
    ap.add_argument("--top-p", type=float, help="1 = off (default: the model's, else off)")
    ap.add_argument("--repetition-penalty", type=float, help="1 = off (default: the model's, else off)")
    ap.add_argument("--k", type=int, help=f"most draft tokens per round (default: {DEFAULT_K}, or the "
                    f"bundle's max draft tokens when lower)")
    ap.add_argument("--draft-confidence", type=float,
                    help=f"stop drafting once the product of the round's draft top probabilities falls "
                         f"below this (0 = always k; default {_G.draft_confidence})")
    ap.add_argument("--ngram", type=int,
                    help="prompt lookup: when the context's last N..--ngram-min tokens occurred before, draft "
                         "what followed them instead of calling the draft model (works without a draft "
                         "model; pays on greedy, repetitive output; 0 = off, the default)")
    ap.add_argument("--ngram-min", type=int, help=f"shortest n-gram prompt lookup matches (default {_G.ngram_min})")
    ap.add_argument("--seed", type=int, help=f"default {_G.seed}")
    ap.add_argument("--stop", action="append", help="stop string (repeatable)")
    ap.add_argument("--no-speculation", action="store_true", help="target-only decoding")
    ap.add_argument("--force-draft", action="store_true",
                    help="keep the draft model even where the start-up check finds speculation slower than "
                         "target-only decoding on this machine (it then says so on stderr)")
    ap.add_argument("--stream", action="store_true", help="print text as it is committed")
    ap.add_argument("--json", action="store_true", help="print one JSON object (text, ids, stats)")
    ap.add_argument("--jsonl", action="store_true",
                    help="serve requests from standard input, one JSON object a line: \"prompt\" (text or token "
                         "ids) or \"messages\" ([{\"role\", \"content\"}, ...]: chat), optional \"id\" (echoed) and any generation setting (max_new_tokens, temperature, "
                         "stop, seed, ...; the flags give their defaults); one JSON result a line on standard "
                         "output, {\"id\", \"error\"} for a bad line")
    ap.add_argument("--providers", default="cpu", help=PROVIDERS_HELP)
    ap.add_argument("--engine", default="onnxruntime", choices=["onnxruntime", "tensorrt"], help=ENGINE_HELP)
    ap.add_argument("--threads", type=int, default=0, help="the target's ONNX Runtime intra-op threads (0 = all cores)")
    ap.add_argument("--draft-threads", type=int, default=1,
                    help="the draft's intra-op threads (default 1: a draft step is too small to split)")
    return ap


def config_from_args(args, base: GenerationConfig = GenerationConfig()) -> GenerationConfig:
    base = load_toml(args.config, base) if args.config else base
    overrides = {f: getattr(args, a) for a, f in _FIELDS.items() if getattr(args, a) is not None}
    if args.stop:
        overrides["stop"] = tuple(args.stop)
    if args.no_speculation:
        overrides["speculative"] = False
    return base.updated(**overrides)


def stats_line(stats) -> str:
    line = f"[{stats.new_tokens} tokens, {stats.tokens_per_second:.1f} tokens/s"
    if stats.drafted:
        line += (f", k={stats.k}, acceptance {stats.acceptance_rate:.2f}, alpha {stats.alpha:.2f}, "
                 f"{stats.tokens_per_target_call:.2f} tokens/target call")
    if stats.lookup_rounds:
        line += f", prompt lookup drafted {stats.lookup_rounds}/{stats.rounds} rounds (alpha {stats.lookup_alpha:.2f})"
    return line + "]"


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


MAX_LINE_BYTES = 1 << 20     # a request line; longer ones are answered with an error, unread


class _TooLong:
    def __init__(self, size: int):
        self.size = size


def bounded_lines(stream, cap: int = MAX_LINE_BYTES):
    """The lines of a binary stream; a line longer than `cap` bytes is skipped in chunks (never held
    whole) and given as a _TooLong marker."""
    while True:
        line = stream.readline(cap + 1)
        if not line:
            return
        if len(line) <= cap or line.endswith(b"\n") and len(line) <= cap + 1:
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = stream.readline(cap)
            if not line:
                break
            size += len(line)
        yield _TooLong(size)


def serve_jsonl(dec, lines, out) -> int:
    """One request per line of `lines` (JSON), one JSON result per line to `out`; returns the number of
    lines answered with an error. A bad line is answered, never fatal."""
    errors = 0
    for n, line in enumerate(lines, 1):
        rid = None
        try:
            if isinstance(line, _TooLong):
                raise ConfigError(f"the line has {line.size} bytes, more than the {MAX_LINE_BYTES} a request may have")
            if isinstance(line, bytes):       # standard input as bytes: a bad line is that line's error
                try:
                    line = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ConfigError(f"not UTF-8 ({e})") from None
            if not line.strip(" \t\r\n"):      # blank in JSON's sense
                continue
            try:
                req = json.loads(line, parse_constant=_no_constant)
            except (json.JSONDecodeError, ValueError, RecursionError) as e:
                raise ConfigError(f"not JSON ({type(e).__name__}: {str(e)[:200]})") from None
            if not isinstance(req, dict) or ("prompt" in req) == ("messages" in req):
                raise ConfigError('each line must be a JSON object with a "prompt" or "messages" (not both)')
            rid = req.pop("id", None)
            prompt, messages = req.pop("prompt", None), req.pop("messages", None)
            if "stop" in req and isinstance(req["stop"], str):
                req["stop"] = (req["stop"],)
            res = dec.generate(prompt, messages=messages, **req)
            reply = {"text": res.text, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
                     "stats": res.stats.to_dict()}
        except (SpecedgeError, TypeError) as e:    # this request fails, the next one runs
            errors += 1
            reply = {"error": f"line {n}: {e}"}
        except Exception as e:      # a defect of ours: still answered, and the next request still runs
            errors += 1
            reply = {"error": f"line {n}: internal error {type(e).__name__}: {str(e)[:200]} (please report it)"}
        if rid is not None:
            reply = {"id": rid, **reply}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return errors


def main(argv: list[str] | None = None) -> int:
    from specedge.runtime.console import guarded
    return guarded(_main, argv, prog="spec-run")


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    given = (args.prompt is not None) + (args.chat is not None) + args.jsonl
    if args.json and args.stream:
        print("spec-run: error: --json prints one object at the end and --stream prints text as it comes; "
              "choose one", file=sys.stderr)
        return 2
    if given != 1 or args.jsonl and (args.json or args.stream) or args.system is not None and args.chat is None:
        print("spec-run: error: give one of a prompt, --chat MESSAGE, or --jsonl to read requests from standard "
              "input (--jsonl answers in JSON lines, without --json or --stream; --system goes with --chat)",
              file=sys.stderr)
        return 2
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if prompt and args.prompt != "-" and "\n" not in prompt and len(prompt) < 4096 and os.path.isfile(prompt):
        print(f"spec-run: note: the prompt is the text {prompt!r}; for the file's contents use: spec-run "
              f"{args.bundle} - < {prompt}", file=sys.stderr)
    try:
        cfg = config_from_args(args, model_defaults(Manifest.load(args.bundle).generation))
        from .decoder import SpeculativeDecoder
        mode = (True if args.force_draft else "auto") if cfg.speculative else False   # "auto": the guard decides
        dec = SpeculativeDecoder.from_bundle(args.bundle, providers=args.providers.split(","),
                                             threads=args.threads, draft_threads=args.draft_threads,
                                             speculative=mode, config=cfg, engine=args.engine)
        if dec.draft_note:
            print(f"spec-run: {dec.draft_note}", file=sys.stderr)
        if mode == "auto" and not dec.guard_cached:
            print("spec-run: timed speculation against target-only decoding on this machine; the verdict is "
                  "cached for this bundle, later runs start at once", file=sys.stderr)
        if args.jsonl:
            try:
                serve_jsonl(dec, bounded_lines(sys.stdin.buffer), sys.stdout)
            except BrokenPipeError:       # the reader went away: nothing left to answer
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if args.chat is not None:
            messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + \
                [{"role": "user", "content": args.chat}]
            stream = dec.stream(messages=messages)
        else:
            stream = dec.stream(prompt)
        for piece in stream:
            if args.stream and not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()
        res = stream.result
    except (SpecedgeError, ImportError) as e:
        print(f"spec-run: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"text": res.text, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
                          "stats": res.stats.to_dict()}))
        return 0
    if not args.stream:
        sys.stdout.write(res.text)
    print(f"\n{stats_line(res.stats)} finish: {res.finish_reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
