"""spec-bench: specedge against target-only decoding and against peer systems (onnxruntime-genai, HF).

Nothing is imported here on purpose: `peers` runs in its own subprocess and must stay the only place that
imports torch / onnxruntime-genai.
"""
