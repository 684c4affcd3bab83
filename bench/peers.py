"""Peer systems for spec-bench as long-lived workers: HF transformers (plain and assisted generate) and
onnxruntime-genai (plain and speculative) on the same HF pair as specedge. A worker loads its models once,
then times one request at a time, so spec-bench can interleave it per prompt with ours and the other peers
(bench/interleave.py).

    python -m specedge.bench.peers --system ortgenai|hf --target HF_DIR --draft HF_DIR --warmup-prompt TEXT
        --max-new-tokens N [--threads T] [--draft-threads T] [--draft-precision fp32|fp16|int8|int4]
        [--cache DIR] [--ortgenai-spec auto|draft_model|ngram]

The protocol is one JSON object per line. First the worker writes its hello:
    {"ready": true|false, "error", "spec_error", "versions", "ortgenai_spec_mode", "setup_s"}
(ready false: the target could not run, and the worker exits; spec_error: only its speculative mode
cannot run). Then it answers each line of stdin with one line:
    {"op": "generate", "variant": "plain"|"spec", "prompt": TEXT, "mode": "greedy"|"sampled",
     "temperature": 0.8, "k": K, "seed": S, "max_new_tokens": N}
        -> {"new_tokens", "seconds", "tokens", "prompt_tokens", "stats"}
    {"op": "memory"} -> {"peak_mb", "held_mb", "target_only_held_mb"}: MiB above its floor once its
        libraries are imported, as bench/memory.py measures ours
A request that failed is answered {"error": "one line"}; end of stdin ends the worker.

"seconds" is the generate call alone, timed in the worker: prefill included, tokenizing and the pipe
excluded. Every run makes exactly max_new_tokens (EOS is masked), with the request's seed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from specedge.runtime.files import tree_hash

from .memory import held_mb, rss_mb

# What a peer raises when its library, model or config is not up to the job (onnxruntime-genai raises
# RuntimeError, transformers ValueError/OSError/TypeError, an older library AttributeError).
PEER_ERRORS = (OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError, ImportError)
NGRAM_SIZE = 3          # onnxruntime-genai's docs suggest 3-4 to start; only used when the draft model can't run
PRECISION = "fp32"      # the target's: the same arithmetic as specedge's fp32 graphs (the draft's: --draft-precision)
# Counters of Generator.get_speculative_stats() that add up over generations (the rest are per-generator state).
GENAI_COUNTERS = ("rounds", "draft_tokens_proposed", "draft_tokens_evaluated", "draft_tokens_accepted",
                  "correction_tokens", "bonus_tokens", "tokens_emitted", "draft_forward_passes",
                  "target_forward_passes", "target_verify_forward_passes", "full_accept_rounds",
                  "partial_accept_rounds", "zero_accept_rounds", "ngram_lookup_hits", "ngram_lookup_misses",
                  "total_draft_ms", "total_target_ms")


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def hf_folder(path: Path) -> Path:
    if not (path / "config.json").is_file():     # else both libraries answer with a puzzling hub error
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    return path


class Peer:
    """What both workers share: the memory floor, cached tokenization, the warm-ups at load."""

    def __init__(self, args) -> None:
        self.args = args
        self.info: dict = {"spec_error": None}
        self.floor = {"peak": rss_mb(), "held": held_mb()}     # once its libraries are imported
        self._ids: dict[str, object] = {}

    def warm_up(self) -> None:
        """One request per variant (first-call allocations, lazy inits); the target alone's memory first."""
        kw = dict(mode="greedy", temperature=0.0, k=1, seed=1, max_new_tokens=self.args.max_new_tokens)
        self.generate("plain", self.args.warmup_prompt, **kw)
        self.floor["plain_held"] = held_mb()        # the target alone, as our target-only process
        try:                                         # a draft that cannot run still leaves the plain figures
            self.load_spec(kw)
        except PEER_ERRORS as e:
            self.info["spec_error"] = self.info["spec_error"] or one_line(e)
            self.drop_spec()

    def memory(self) -> dict:
        f = self.floor
        above = lambda v: None if v is None or f["held"] is None else v - f["held"]
        return {"peak_mb": rss_mb() - (f["held"] if f["held"] is not None else f["peak"]),
                "held_mb": above(held_mb()), "target_only_held_mb": above(f.get("plain_held"))}

    def spec_unavailable(self) -> RuntimeError:
        return RuntimeError(f"{self.args.system}'s speculative mode did not load: {self.info['spec_error']}")


# ---------------------------------------------------------------------------------------------------------
# HF transformers

class HFPeer(Peer):
    def __init__(self, args) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        import transformers as tf
        tf.utils.logging.set_verbosity_error()      # keep stderr for real errors: the benchmark shows its tail
        tf.utils.logging.disable_progress_bar()
        torch.set_num_threads(args.threads)
        super().__init__(args)
        self.torch, self.tf = torch, tf
        self.info["versions"] = {"torch": torch.__version__, "transformers": tf.__version__}
        self.tok = tf.AutoTokenizer.from_pretrained(hf_folder(args.target), local_files_only=True)
        self.target = self._load(args.target)
        self.calls = {"target": 0, "draft": 0}
        self.target.register_forward_hook(lambda *_: self._count("target"))
        pad = self.target.generation_config.pad_token_id
        self.pad = pad if pad is not None else (self.tok.eos_token_id if self.tok.eos_token_id is not None else 0)
        self.draft = None
        self.warm_up()

    def _count(self, model: str) -> None:
        self.calls[model] += 1

    def _load(self, path: Path):
        return self.tf.AutoModelForCausalLM.from_pretrained(path, dtype=self.torch.float32,
                                                            local_files_only=True).eval()

    def load_spec(self, warm: dict) -> None:
        draft = self._load(hf_folder(self.args.draft))
        # AssistedCandidateGenerator reads these from the assistant's own generation_config, not from
        # generate()'s kwargs; threshold 0 turns off the early stop on low draft confidence: K every round.
        dgc = draft.generation_config
        dgc.num_assistant_tokens_schedule, dgc.assistant_confidence_threshold = "constant", 0.0
        draft.register_forward_hook(lambda *_: self._count("draft"))
        self.draft = draft
        self.generate("spec", self.args.warmup_prompt, **warm)

    def drop_spec(self) -> None:
        self.draft = None

    def generate(self, variant: str, prompt: str, *, mode: str, temperature: float, k: int, seed: int,
                 max_new_tokens: int) -> dict:
        if variant == "spec" and self.draft is None:
            raise self.spec_unavailable()
        torch = self.torch
        ids = self._ids.get(prompt)
        if ids is None:
            ids = self._ids[prompt] = self.tok(prompt, return_tensors="pt").input_ids
        # min_new_tokens masks EOS until the budget is reached, so every run makes the same number of tokens
        kw = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=self.pad)
        if mode == "sampled":
            kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if variant == "spec":
            self.draft.generation_config.num_assistant_tokens = k
        torch.manual_seed(seed)
        mask, before = torch.ones_like(ids), dict(self.calls)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(ids, attention_mask=mask, assistant_model=self.draft if variant == "spec"
                                       else None, **kw)
        dt = time.perf_counter() - t0
        new = out[0, ids.shape[1]:].tolist()
        # target calls include the prefill; HF reports no acceptance counters, these are what it can show
        stats = {m: self.calls[m] - before[m] for m in self.calls}
        return {"new_tokens": len(new), "seconds": dt, "tokens": new, "prompt_tokens": int(ids.shape[1]),
                "stats": stats}


# ---------------------------------------------------------------------------------------------------------
# onnxruntime-genai

def content_key(folder: Path, precision: str) -> str:
    """Hash of every file's name and bytes: a retrained or re-exported model gets a fresh build."""
    import onnxruntime_genai as og
    return tree_hash(folder, f"og={og.__version__} p={precision} e=cpu")


def _publish(tmp: Path, out: Path) -> None:
    """Build into tmp, then rename: a half-written folder is never taken for a cached build."""
    try:
        os.replace(tmp, out)
    except OSError:
        if not (out / "genai_config.json").is_file():     # not a concurrent peer that won the race
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def build(src: Path, cache: Path, precision: str = PRECISION) -> tuple[Path, str]:
    key = content_key(src, precision)
    out = cache / f"og-{key}"
    if (out / "genai_config.json").is_file():
        return out, key
    tmp = cache / f".tmp-og-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"building {src} with the onnxruntime-genai model builder -> {out}")
    from specedge.export.genai import run_builder    # one builder invocation for export and peers
    try:
        run_builder(src, tmp, precision=precision)
    except Exception as e:  # ExportError, or the builder's own: reported as this peer's error
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(str(e)) from e
    _publish(tmp, out)
    return out, key


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)          # the composite needs its own folder, not a second copy of the weights
    except OSError:
        shutil.copy2(src, dst)


def composite(tdir: Path, tkey: str, ddir: Path, dkey: str, cache: Path) -> Path:
    """genai_config.json with the target's decoder block as model.decoder and the draft's as model.draft.
    Both models sit in subfolders: genai refuses a '..' in a filename as path traversal."""
    out = cache / f"spec-{tkey}-{dkey}"
    if (out / "genai_config.json").is_file():
        return out
    tmp = cache / f".tmp-spec-{tkey}-{dkey}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for sub, src in (("target", tdir), ("draft", ddir)):
        shutil.copytree(src, tmp / sub, copy_function=_link_or_copy)
    for f in tdir.iterdir():      # tokenizer and processing files: the composite tokenizes like the target
        if f.is_file() and not f.name.startswith("model.onnx") and f.name != "genai_config.json":
            shutil.copy2(f, tmp / f.name)
    cfg = json.loads((tdir / "genai_config.json").read_text())
    draft_block = json.loads((ddir / "genai_config.json").read_text())["model"]["decoder"]
    cfg["model"]["decoder"]["filename"] = f"target/{cfg['model']['decoder']['filename']}"
    draft_block["filename"] = f"draft/{draft_block['filename']}"
    cfg["model"]["draft"] = draft_block
    cfg["model"]["type"] = "speculative"      # as in genai's own speculative tests
    (tmp / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    _publish(tmp, out)
    return out


def load_genai(og, folder: Path, threads: dict[str, int]):
    """Threads per config block ("decoder", "draft") go in through a config overlay, so one cached build
    serves every --threads."""
    config = og.Config(str(folder))
    so = lambda n: {"intra_op_num_threads": n, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {b: {"session_options": so(n)} for b, n in threads.items()}}))
    return og.Model(config)


def sum_stats(runs: list[dict]) -> dict:
    """onnxruntime-genai's speculative counters summed over generations, with the rates they give."""
    out: dict = {"generations": len(runs)}
    for key in GENAI_COUNTERS:
        if any(key in s for s in runs):
            v = sum(float(s.get(key, 0)) for s in runs)
            out[key] = int(v) if v.is_integer() and not key.endswith("_ms") else v
    ev, tp = out.get("draft_tokens_evaluated", 0), out.get("target_forward_passes", 0)
    out["acceptance_rate"] = out.get("draft_tokens_accepted", 0) / ev if ev else None
    out["tokens_per_target_pass"] = out.get("tokens_emitted", 0) / tp if tp else None
    if runs:
        out["effective_k"] = runs[-1].get("effective_k")
    return out


class GenaiPeer(Peer):
    def __init__(self, args) -> None:
        import onnxruntime_genai as og
        super().__init__(args)
        self.og = og
        self.info["versions"] = {"onnxruntime_genai": og.__version__}
        self.cache = Path(args.cache).expanduser()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.tdir, self.tkey = build(hf_folder(args.target), self.cache)
        self.plain_model = load_genai(og, self.tdir, {"decoder": args.threads})
        self.tok = og.Tokenizer(self.plain_model)
        self.spec_model, self.spec_opts = None, None
        self.info["ortgenai_spec_mode"] = None
        self.warm_up()

    def load_spec(self, warm: dict) -> None:
        """The draft-model mode; in auto, n-gram lookup on the plain model when that cannot run (the
        warm-up request is the proof that a mode runs)."""
        def draft_model():
            ddir, dkey = build(hf_folder(self.args.draft), self.cache, self.args.draft_precision)
            return load_genai(self.og, composite(self.tdir, self.tkey, ddir, dkey, self.cache),
                              {"decoder": self.args.threads, "draft": self.args.draft_threads}), {}
        modes = {"draft_model": draft_model, "ngram": lambda: (self.plain_model, {"ngram_size": NGRAM_SIZE})}
        errors = []
        for name, make in modes.items():
            if self.args.ortgenai_spec not in ("auto", name):
                continue
            try:
                self.spec_model, self.spec_opts = make()
                self.generate("spec", self.args.warmup_prompt, **warm)
                self.info["ortgenai_spec_mode"] = name
                return
            except PEER_ERRORS as e:
                self.spec_model = None
                self.info[f"ortgenai_{'draft' if name == 'draft_model' else name}_error"] = one_line(e)
                errors.append(f"{name}: {one_line(e)}")
                log(f"{name} speculative decoding failed: {one_line(e)}")
        raise RuntimeError("; ".join(errors))

    def drop_spec(self) -> None:
        self.spec_model, self.info["ortgenai_spec_mode"] = None, None

    def generate(self, variant: str, prompt: str, *, mode: str, temperature: float, k: int, seed: int,
                 max_new_tokens: int) -> dict:
        import numpy as np
        og = self.og
        if variant == "spec" and self.spec_model is None:
            raise self.spec_unavailable()
        ids = self._ids.get(prompt)
        if ids is None:
            ids = self._ids[prompt] = np.asarray(self.tok.encode(prompt), dtype=np.int32)
        # top_k 0 is "no top-k" in genai (checked: same draws as top_k = vocab); the builder's default is 50
        sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if mode == "sampled"
                    else dict(do_sample=False))
        model = self.spec_model if variant == "spec" else self.plain_model
        n = len(ids) + max_new_tokens
        t0 = time.perf_counter()
        params = og.GeneratorParams(model)
        # min_length == max_length: EOS can't end a run early. random_seed always: genai's default -1 seeds
        # each Generator slowly, greedy or not, which would swamp short runs of a small model
        params.set_search_options(max_length=n, min_length=n, random_seed=seed, **sampling)
        if variant == "spec":
            params.set_speculative_options(**self.spec_opts, max_draft_tokens=k)
        gen = og.Generator(model, params)
        gen.append_tokens(ids[None, :])
        while not gen.is_done():
            gen.generate_next_token()
        new = [int(t) for t in gen.get_sequence(0)[len(ids):]]
        dt = time.perf_counter() - t0
        stats = dict(gen.get_speculative_stats()) if variant == "spec" else {}
        return {"new_tokens": len(new), "seconds": dt, "tokens": new, "prompt_tokens": int(len(ids)),
                "stats": stats}


PEERS = {"hf": HFPeer, "ortgenai": GenaiPeer}


# ---------------------------------------------------------------------------------------------------------
# the worker

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specedge.bench.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=tuple(PEERS), required=True)
    ap.add_argument("--target", type=Path, required=True, help="target HF folder")
    ap.add_argument("--draft", type=Path, required=True, help="draft HF folder (same tokenizer)")
    ap.add_argument("--warmup-prompt", required=True, help="the prompt of the warm-up requests at load")
    ap.add_argument("--max-new-tokens", type=int, required=True, help="the warm-up requests' budget")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (onnxruntime-genai: the target's)")
    ap.add_argument("--draft-threads", type=int, default=1, help="onnxruntime-genai's draft's intra-op threads")
    ap.add_argument("--draft-precision", choices=("fp32", "fp16", "int8", "int4"), default=PRECISION,
                    help="onnxruntime-genai's draft weights (as the bundle's draft)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "specedge" / "peers",
                    help="where onnxruntime-genai builds are kept, keyed by the HF folder's content")
    ap.add_argument("--ortgenai-spec", choices=("auto", "draft_model", "ngram"), default="auto",
                    help="auto: draft model, falling back to n-gram lookup if it cannot run")
    return ap


def answer(peer: Peer, req: dict) -> dict:
    if req.get("op") == "memory":
        return peer.memory()
    if req.get("op") == "generate":
        return peer.generate(req["variant"], req["prompt"], mode=req["mode"], temperature=req.get("temperature", 0.8),
                             k=int(req["k"]), seed=int(req["seed"]), max_new_tokens=int(req["max_new_tokens"]))
    raise ValueError(f"unknown op {req.get('op')!r}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # the protocol owns the real stdout; fd 1 then points at stderr, so nothing a library prints (from
    # Python or native code) can break a line of it
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj, default=str) + "\n")
        proto.flush()

    hello: dict = {"ready": False, "system": args.system, "error": None, "spec_error": None}
    t0 = time.perf_counter()
    try:
        if min(args.max_new_tokens, args.threads, args.draft_threads) < 1:
            raise ValueError("--max-new-tokens, --threads and --draft-threads must be >= 1")
        peer = PEERS[args.system](args)
        hello.update(peer.info, ready=True, setup_s=time.perf_counter() - t0)
    except PEER_ERRORS as e:
        hello["error"] = one_line(e)
    except Exception as e:  # noqa: BLE001 -- last resort: the benchmark must get its answer whatever breaks
        traceback.print_exc()
        hello["error"] = f"unexpected {one_line(e)}"
    if hello["error"] or hello["spec_error"]:
        log(f"{args.system}: {hello['error'] or hello['spec_error']}")
    send(hello)
    if not hello["ready"]:
        return 0
    for line in iter(sys.stdin.readline, ""):
        try:
            send(answer(peer, json.loads(line)))
        except (*PEER_ERRORS, LookupError) as e:
            send({"error": one_line(e)})
        except Exception as e:  # noqa: BLE001 -- one bad request must not end the worker's other answers
            traceback.print_exc()
            send({"error": f"unexpected {one_line(e)}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
