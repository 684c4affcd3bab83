"""TensorRT plans from a bundle: `spec-export engine BUNDLE`, on the machine (and GPU) that will run them.

Imports tensorrt, onnx's graph files and the runtime's manifest only (a Jetson has no torch). Each model's
ONNX graph is parsed into a strongly typed network (precision comes from the graph's dtypes: an fp16 bundle
gives an fp16 plan), with one optimization profile spanning what the loop sends it: 1 to K+1 new tokens for
steps and verifies, up to a prefill chunk for prompts, and a past of 0 to max context - 1 cached tokens.
The plans, the timing cache and a record of the TensorRT version and GPU they were built for go to the
bundle's `tensorrt/` folder, written whole (temp folder, then rename); a plan is refused elsewhere
(`check_record`): TensorRT plans are specific to the GPU model and TensorRT version that built them.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

# check_record is re-exported: the plans' record is one contract, read by the engine, written here
from specedge.engines.tensorrt import RECORD, TRT_DIR, TRT_EXTRA, check_record, gpu_name  # noqa: F401
from specedge.runtime.errors import BundleError, ExportError
from specedge.runtime.manifest import Manifest, ModelInfo

PREFILL_CHUNK = 256          # GenerationConfig.prefill_chunk's default: the longest call a prompt makes


def profile_shapes(info: ModelInfo, *, max_draft_tokens: int, max_context: int, hidden_size: int | None = None,
                   prefill_chunk: int = PREFILL_CHUNK) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) shape of every dynamic input of a bundle graph: new tokens 1 .. max(K+1, chunk),
    optimized for a K+1 verify; past 0 .. max_context - 1 (optimized for a quarter of it)."""
    new_max = min(max(max_draft_tokens + 1, prefill_chunk), max_context)
    new = (1, max_draft_tokens + 1, new_max)
    past = (0, max_context // 4, max_context - 1)
    shapes = {}
    for name in info.inputs:
        if name in ("input_ids", "position_ids"):
            shapes[name] = tuple((1, n) for n in new)
        elif name == "attention_mask":          # past + new
            shapes[name] = ((1, 1), (1, past[1] + new[1]), (1, max_context))
        elif name.startswith("past_key_values."):
            shapes[name] = tuple((1, info.num_kv_heads, p, info.head_dim) for p in past)
        elif name == "target_hidden_states":    # a hidden-state head reads the target's features
            if not hidden_size:
                raise ExportError("a hidden-state head's plan needs the target's hidden size")
            shapes[name] = tuple((1, n, hidden_size) for n in new)
        elif name == "logits_to_keep":
            shapes[name] = ((1,), (1,), (1,))
        else:
            raise ExportError(f"the {info.file} graph has an input {name!r} that a TensorRT profile cannot size; "
                              f"re-export the bundle with this version's spec-export")
    return shapes


def head_features_width(bundle: Path, m: Manifest) -> int | None:
    """The width of the hidden states a hidden-state draft head reads: the target's hidden size (its
    config.json, copied into the bundle at export); None without such a head."""
    if "draft" not in m.models or m.models["draft"].kind != "eagle":
        return None
    config = bundle / Path(m.models["target"].file).parent / "config.json"
    try:
        return int(json.loads(config.read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BundleError(f"{config} does not give the target's hidden_size ({e}); re-export the bundle") from None


def import_tensorrt():
    try:
        import tensorrt
    except ImportError as e:
        raise ExportError(f"spec-export engine needs TensorRT and an NVIDIA GPU: {TRT_EXTRA}, on the machine that "
                          f"will run the plans ({e})") from None
    return tensorrt


def build_engines(bundle: str | Path, *, overwrite: bool = False, workspace_gb: float = 4.0,
                  quiet: bool = False) -> Path:
    """Build a TensorRT plan per model of `bundle` into bundle/tensorrt/ and return that folder."""
    bundle = Path(bundle)
    m = Manifest.load(bundle)
    out = bundle / TRT_DIR
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists; pass --overwrite to rebuild the plans")
    trt = import_tensorrt()
    gpu = gpu_name()
    if not gpu:
        raise ExportError("spec-export engine found no NVIDIA GPU (nvidia-smi): build the plans on the machine "
                          "that will run them")
    logger = trt.Logger(trt.Logger.WARNING)
    hidden = head_features_width(bundle, m)
    record = {"tensorrt_version": trt.__version__, "gpu": gpu, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
              time.gmtime()), "plans": {}, "profiles": {}}
    tmp = tempfile.mkdtemp(dir=bundle, prefix=".tensorrt-")
    try:
        cache = None
        for role, info in m.models.items():
            shapes = profile_shapes(info, max_draft_tokens=m.max_draft_tokens, max_context=m.max_context,
                                    hidden_size=hidden)
            t0 = time.perf_counter()
            builder = trt.Builder(logger)
            network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
            parser = trt.OnnxParser(network, logger)
            if not parser.parse_from_file(str(bundle / info.file)):
                errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
                raise ExportError(f"TensorRT cannot parse the {role} graph: {errors[:400]}")
            config = builder.create_builder_config()
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
            cache = config.create_timing_cache(cache.serialize() if cache else b"")
            config.set_timing_cache(cache, ignore_mismatch=False)
            profile = builder.create_optimization_profile()
            for name, (lo, opt, hi) in shapes.items():
                profile.set_shape(name, lo, opt, hi)
            config.add_optimization_profile(profile)
            plan = builder.build_serialized_network(network, config)
            if plan is None:
                raise ExportError(f"TensorRT could not build the {role} plan (see its log above)")
            (Path(tmp) / f"{role}.plan").write_bytes(bytes(plan))
            record["plans"][role] = f"{TRT_DIR}/{role}.plan"
            record["profiles"][role] = {k: [list(s) for s in v] for k, v in shapes.items()}
            if not quiet:
                print(f"[{role}] TensorRT plan: {time.perf_counter() - t0:.0f} s", flush=True)
        if cache is not None:
            (Path(tmp) / "timing.cache").write_bytes(bytes(cache.serialize()))
        (Path(tmp) / RECORD).write_text(json.dumps(record, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)          # --overwrite, and only the folder this command writes
        Path(tmp).rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)     # a failed build leaves nothing behind
    return out
