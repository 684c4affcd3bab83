"""What every CLI does at its edges: Ctrl-C ends it quietly with status 130 on a fresh line, and a reader
that went away (`spec-run ... | head -2`) ends it quietly too."""
from __future__ import annotations

import os
import sys
import warnings


PROVIDERS_HELP = ("comma list: cpu, cuda, tensorrt (default cpu); a provider this onnxruntime build lacks is an "
                  "error, unless cpu is listed too (cuda,cpu: fall back with a warning)")

ENGINE_HELP = ("onnxruntime (default: the bundle's ONNX graphs on --providers) or tensorrt (the TensorRT plans "
               "spec-export engine BUNDLE built on this machine)")


def guarded(main, argv=None, *, prog: str) -> int:
    """Run a CLI's main(argv) with these edges; `prog` names it in the messages."""
    # e.g. "CUDA is not in this onnxruntime build": one line, no source line
    warnings.formatwarning = lambda message, *_, **__: f"{prog}: warning: {message}\n"
    try:
        return main(argv)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except BrokenPipeError:          # stdout closed by the reader: nothing left to say, and no one to say it to
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0
    except OSError as e:             # a full disk, a folder that vanished: the system's words, one line
        where = f" ({e.filename})" if e.filename else ""
        print(f"{prog}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
