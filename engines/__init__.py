"""specedge.engines: how one exported graph runs (ONNX Runtime now; TensorRT fits the same interface)."""
from .base import Engine, EngineError
from .ort import OrtEngine, import_onnxruntime, resolve_providers

__all__ = ["Engine", "EngineError", "OrtEngine", "import_onnxruntime", "resolve_providers"]
