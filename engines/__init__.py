"""specedge.engines: how one exported graph runs: OrtEngine (ONNX Runtime: CPU, CUDA, TensorRT providers) or
TrtEngine (a TensorRT plan, engines/tensorrt.py, imported only when asked for), behind one interface."""
from .base import Engine, EngineError
from .ort import OrtEngine, import_onnxruntime, resolve_providers

__all__ = ["Engine", "EngineError", "OrtEngine", "import_onnxruntime", "resolve_providers"]
