"""spec-bench: specedge against target-only decoding and against peer systems (onnxruntime-genai, HF,
llama.cpp), interleaved with ours prompt by prompt (`interleave`).

Nothing is imported here on purpose: `peers` runs in worker processes of its own and must stay the only
place that imports torch / onnxruntime-genai.
"""
