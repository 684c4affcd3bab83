"""What every CLI does at its edges: Ctrl-C ends it quietly with status 130 on a fresh line, and a reader
that went away (`spec-run ... | head -2`) ends it quietly too."""
from __future__ import annotations

import os
import sys
import warnings


def _one_line(message, category, filename, lineno, file=None, line=None) -> str:
    return f"{os.path.basename(sys.argv[0]) or 'specedge'}: warning: {message}\n"


def guarded(main, argv=None) -> int:
    warnings.formatwarning = _one_line      # e.g. "CUDA is not in this onnxruntime build": one line, no source
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
