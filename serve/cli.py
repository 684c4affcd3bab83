"""spec-serve BUNDLE: serve a bundle over HTTP in OpenAI's shape (/v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics)."""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from specedge.runtime.console import ENGINE_HELP, PROVIDERS_HELP


def _positive(kind):
    def check(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
        return v
    return check


def _count(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spec-serve", description=__doc__)
    p.add_argument("bundle", help="a bundle folder written by spec-export")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=_count, default=0, help="the target's threads (0 = all cores)")
    p.add_argument("--draft-threads", type=_count, default=1, help="the draft's threads (default 1)")
    p.add_argument("--providers", default="cpu", help=PROVIDERS_HELP)
    p.add_argument("--engine", default="onnxruntime", choices=["onnxruntime", "tensorrt"], help=ENGINE_HELP)
    p.add_argument("--max-queue", type=_count, default=16,
                   help="requests that may wait behind the running one; more get 429 (default 16)")
    p.add_argument("--timeout", type=_positive(float), default=300.0,
                   help="seconds a request may take from arrival, queue included (default 300)")
    p.add_argument("--api-key", default=os.environ.get("SPECEDGE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $SPECEDGE_API_KEY; unset: no key)")
    p.add_argument("--max-body-bytes", type=_positive(int), default=1 << 20, help="largest request body (1 MiB)")
    p.add_argument("--model-name", default=None, help="the model id clients see (default: the bundle folder's name)")
    p.add_argument("--no-speculation", action="store_true", help="target-only decoding")
    p.add_argument("--force-draft", action="store_true",
                   help="keep the draft where the start-up check finds speculation slower")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        import uvicorn
        from .app import create_app, model_name
    except ImportError as e:
        print(f"spec-serve: {e}; install the server's packages: pip install 'specedge[serve]'", file=sys.stderr)
        return 2
    from specedge.runtime import SpeculativeDecoder
    from specedge.runtime.errors import SpecedgeError
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and not args.api_key:
        print(f"spec-serve: listening on {args.host} without --api-key: anyone who can reach it may use it",
              file=sys.stderr)
    try:
        providers = [p.strip() for p in args.providers.split(",")] if args.providers else None
        dec = SpeculativeDecoder.from_bundle(args.bundle, providers=providers, threads=args.threads,
                                             draft_threads=args.draft_threads, engine=args.engine,
                                             speculative=False if args.no_speculation
                                             else True if args.force_draft else "auto")
    except SpecedgeError as e:
        print(f"spec-serve: {e}", file=sys.stderr)
        return 2
    if dec.draft_note:
        print(f"spec-serve: {dec.draft_note}", file=sys.stderr)
    app = create_app(dec, model_id=args.model_name or model_name(args.bundle), max_queue=args.max_queue,
                     timeout=args.timeout, api_key=args.api_key, max_body_bytes=args.max_body_bytes)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, server_header=False,
                timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
