"""spec-export: Hugging Face causal LM folder(s) or GGUF files -> ONNX bundle with a manifest.

  spec-export --target DIR|GGUF --draft DIR|GGUF --out BUNDLE [--dtype fp32|fp16] [--draft-dtype D]
              [--max-draft-tokens K] [--max-context N] [--prompts FILE] [--overwrite] [--allow-pickle]
  spec-export model DIR|GGUF --out OUT [same options]
  spec-export triton BUNDLE OUT [--name specedge] [--instances 1]   (a Triton model repository)
  spec-export engine BUNDLE [--overwrite] [--workspace-gb 4]         (TensorRT plans, on the GPU that runs them)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specedge.runtime.errors import SpecedgeError


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, required=True, help="bundle folder to write")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "int8", "int4"],
                    help="weights (and KV cache) dtype; logits are always fp32; int8/int4 need --builder genai")
    ap.add_argument("--draft-dtype", default=None, choices=["fp32", "fp16", "int8", "int4"],
                    help="the draft's weights, if not --dtype (e.g. int8: a cheaper draft step; the output's "
                         "law never depends on the draft)")
    ap.add_argument("--builder", default="torch", choices=["torch", "genai"],
                    help="torch: torch.onnx dynamo export (default); genai: onnxruntime-genai's model builder "
                         "(fused attention/norm graphs, int4 weights; needs onnxruntime-genai)")
    ap.add_argument("--quant-block", type=int, default=None, metavar="B",
                    help="block size of int8/int4 weights (16, 32, 64, 128, 256; default 32, as llama.cpp's "
                         "Q8_0/Q4_0): larger blocks decode faster and agree less with fp32")
    ap.add_argument("--max-draft-tokens", type=int, default=8, metavar="K",
                    help="largest K the runtime may use; the verify pass covers K+1 positions (default 8)")
    ap.add_argument("--max-context", type=int, default=None, metavar="N",
                    help="context the runtime may use (default: the model's limit, at most 4096)")
    ap.add_argument("--opset", type=int, default=None,
                    help="ONNX opset (default 20: portable; 23 fuses RMSNorm/rotary/attention into single "
                         "ops, faster small drafts on CPU, needs onnxruntime >= 1.22)")
    ap.add_argument("--prompts", type=Path, default=None, help="JSONL prompts to embed (benchmarks, checks)")
    ap.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    ap.add_argument("--allow-pickle", action="store_true",
                    help="allow loading pickled *.bin weights (they can run code; trusted sources only)")
    ap.add_argument("--quiet", action="store_true", help="no progress output")


def main(argv: list[str] | None = None) -> int:
    from specedge.runtime.console import guarded
    return guarded(_main, argv, prog="spec-export")


def _triton(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="spec-export triton",
                                 description="a Triton Inference Server model repository serving a bundle "
                                             "(Python backend, streaming, batch 1)")
    ap.add_argument("bundle", type=Path)
    ap.add_argument("out", type=Path, help="model repository folder to write (new)")
    ap.add_argument("--name", default="specedge", help="model name in the repository")
    ap.add_argument("--instances", type=int, default=1, help="model instances per server (each serves one request "
                                                               "at a time)")
    ap.add_argument("--threads", type=int, default=0, help="each instance's target threads (0 = all cores)")
    args = ap.parse_args(argv)
    from .triton import export_triton
    try:
        out = export_triton(args.bundle, args.out, name=args.name, instances=args.instances, threads=args.threads)
    except SpecedgeError as e:
        print(f"spec-export: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} (tritonserver --model-repository {out})", file=sys.stderr)
    return 0


def _engine(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="spec-export engine",
                                 description="TensorRT plans for a bundle's graphs, built on (and for) this GPU "
                                             "and TensorRT into BUNDLE/tensorrt/ (needs the trt extra; no torch)")
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--overwrite", action="store_true", help="rebuild plans the bundle already has")
    ap.add_argument("--workspace-gb", type=float, default=4.0, help="TensorRT's workspace memory limit")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from .tensorrt import build_engines
    try:
        out = build_engines(args.bundle, overwrite=args.overwrite, workspace_gb=args.workspace_gb, quiet=args.quiet)
    except SpecedgeError as e:
        print(f"spec-export: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["triton"]:
        return _triton(argv[1:])
    if argv[:1] == ["engine"]:
        return _engine(argv[1:])
    single = bool(argv) and argv[0] == "model"
    ap = argparse.ArgumentParser(prog="spec-export model" if single else "spec-export",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if single:
        ap.add_argument("model", type=Path, help="Hugging Face model folder")
        argv = argv[1:]
    else:
        ap.add_argument("--target", type=Path, required=True, help="target model folder (Hugging Face)")
        ap.add_argument("--draft", type=Path, required=True, help="draft model folder (same tokenizer)")
    _common(ap)
    args = ap.parse_args(argv)
    from .bundle import export_bundle
    try:
        export_bundle(target=args.model if single else args.target, draft=None if single else args.draft,
                      out=args.out, dtype=args.dtype, draft_dtype=args.draft_dtype, k=args.max_draft_tokens,
                      max_context=args.max_context,
                      prompts=args.prompts, overwrite=args.overwrite, allow_pickle=args.allow_pickle,
                      opset=args.opset, builder=args.builder, quant_block=args.quant_block, quiet=args.quiet)
    except SpecedgeError as e:
        print(f"spec-export: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"spec-export: error: {e.name or e} is not installed; the export needs "
              f"pip install 'specedge[export]' (torch, transformers, onnx, onnxscript)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
