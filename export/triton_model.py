"""Triton Inference Server Python-backend model wrapping specedge's runtime (written by `spec-export triton`
as 1/model.py of a model repository; Triton imports it, never specedge itself).

Decoupled (streaming) mode: each request gets the completion's text pieces as separate responses, then a
final empty one flagged complete. One decoder per model instance serves one request at a time (batch 1:
speculation verifies one sequence); give the model more instances (config.pbtxt instance_group) or more
replicas for more concurrent requests.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0].item()


class TritonPythonModel:
    def initialize(self, args):
        from specedge.runtime import SpeculativeDecoder
        config = json.loads(args["model_config"])
        folder = config["parameters"]["bundle"]["string_value"]
        path = os.path.join(args["model_repository"], args["model_version"], folder)
        self.decoder = SpeculativeDecoder.from_bundle(path, threads=int(config["parameters"].get(
            "threads", {"string_value": "0"})["string_value"]))

    def execute(self, requests):
        from specedge.runtime.errors import SpecedgeError
        for request in requests:
            sender = request.get_response_sender()
            try:
                text = _scalar(request, "text_input", b"")
                text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
                settings = {"max_new_tokens": int(_scalar(request, "max_tokens", 128)),
                            "temperature": float(_scalar(request, "temperature", 0.0))}
                for piece in self.decoder.stream(text, **settings):
                    out = pb_utils.Tensor("text_output", np.array([piece.encode("utf-8")], dtype=np.object_))
                    sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except SpecedgeError as e:       # a bad request: its own error, the model stays up
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def finalize(self):
        self.decoder = None
