"""specedge.export: Hugging Face causal LM -> ONNX bundle (build time only; uses torch).

    from specedge.export import export_bundle
    export_bundle(target="models/target", draft="models/draft", out="bundle")
"""
from .loader import ExportError


def export_bundle(**kwargs):
    from .bundle import export_bundle as _export
    return _export(**kwargs)


__all__ = ["ExportError", "export_bundle"]
