"""The bundle contract: `manifest.json`, written by spec-export, read and checked by the runtime.

A bundle is a folder:
    manifest.json           this contract (FORMAT_VERSION below)
    target/model.onnx       (+ model.onnx.data) the target graph
    draft/model.onnx        the draft graph (absent in a single-model bundle)
    tokenizer.json          the shared tokenizer (Hugging Face `tokenizers` format)
    prompts.jsonl           optional held-out prompts for benchmarks and checks

Every graph follows the same I/O contract (names as in onnxruntime-genai and optimum):
    inputs   input_ids int64 [batch, sequence_length]
             attention_mask int64 [batch, total_sequence_length]
             position_ids int64 [batch, sequence_length]            (optional: absent in genai graphs)
             logits_to_keep int64 [1]       (optional: logits of the last N new positions only)
             past_key_values.{i}.key|value [batch, kv_heads, past_sequence_length, head_dim]
    outputs  logits float32 [batch, min(logits_to_keep, sequence_length), vocab]
             present.{i}.key|value [batch, kv_heads, total_sequence_length, head_dim]
Graphs of onnxruntime-genai's builder (`builder: "genai"`) also run with past and present bound to
one [batch, kv_heads, max_context, head_dim] buffer, updated in place (ModelInfo.kv_in_place).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)     # 2 added the chat template; a version-1 bundle has none
MANIFEST = "manifest.json"
DTYPES = ("float32", "float16")

from .errors import BundleError, ConfigError
from .files import inside


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "attention_mask", "position_ids"]
    outputs = ["logits"]
    for i in range(num_layers):
        inputs += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outputs += [f"present.{i}.key", f"present.{i}.value"]
    return inputs, outputs


QUANTIZED_WEIGHTS = ("int4", "int8")     # weight-only precisions of the genai builder (MatMulNBits)


@dataclass(frozen=True)
class ModelInfo:
    file: str                 # relative to the bundle root
    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int           # width of the graph's logits (may exceed the shared vocab: padding rows)
    dtype: str                # of weights and KV cache; logits are always float32
    max_context: int
    inputs: list[str]
    outputs: list[str]
    parity: dict = field(default_factory=dict)
    export_seconds: float = 0.0
    source: str = ""          # the Hugging Face folder it was exported from (benchmarks' peers use it)
    opset: int = 20           # ONNX opset: 23 (fused ops) needs onnxruntime >= 1.22; 0 = the builder's choice
    builder: str = "torch"    # "torch" (torch.onnx dynamo) or "genai" (onnxruntime-genai's model builder)
    weights: str = "fp32"     # weight precision: fp32, fp16 or int4 (genai builder only)
    kind: str = "causal_lm"   # "eagle": a hidden-state draft head, fed the target's hidden_states
    data: str | None = None   # the graph's external weights file, relative to the bundle root
    quant_block: int | None = None   # block size of int8/int4 (MatMulNBits) weights

    @property
    def quantized(self) -> bool:
        """int8/int4 weights (MatMulNBits): their activations are quantized per call, so the logits depend
        on how positions are batched by more than rounding (spec-check allows near-ties to flip)."""
        return self.weights in QUANTIZED_WEIGHTS

    @property
    def kv_in_place(self) -> bool:
        """genai graphs attend with GroupQueryAttention, which appends to a cache shared by past and
        present in place (the engine's share_buffer): no cache copy per step, none on rollback."""
        return self.builder == "genai"

    def __post_init__(self):
        _check_fields(self, "model")
        if self.dtype not in DTYPES:
            raise BundleError(f"model dtype {self.dtype!r} is not one of {DTYPES}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "vocab_size", "max_context"):
            if int(getattr(self, name)) < 1:
                raise BundleError(f"model field {name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class Manifest:
    models: dict[str, ModelInfo]     # "target" and optionally "draft"
    tokenizer: str
    vocab_size: int                  # shared vocab: logits are sliced to it
    eos_token_ids: list[int]
    max_context: int
    max_draft_tokens: int
    generation: dict = field(default_factory=dict)   # the source model's generation_config defaults
    prompts: str | None = None
    chat_template: str | None = None   # the tokenizer's Jinja chat template (a file in the bundle), if any
    chat_tokens: dict = field(default_factory=dict)   # bos_token / eos_token strings the template uses
    format_version: int = FORMAT_VERSION
    created_by: str = ""

    def __post_init__(self):
        if not isinstance(self.models, dict) or not all(isinstance(m, ModelInfo) for m in self.models.values()):
            raise BundleError("manifest field models must map roles to model entries")
        _check_fields(self, "manifest", skip=("models",))
        if any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in self.eos_token_ids):
            raise BundleError(f"manifest field eos_token_ids must be token ids (integers >= 0), got {self.eos_token_ids!r}")
        if "target" not in self.models:
            raise BundleError("manifest has no 'target' model")
        for role, m in self.models.items():
            if m.vocab_size < self.vocab_size:
                raise BundleError(f"{role} logits have {m.vocab_size} entries, fewer than the shared "
                                  f"vocab of {self.vocab_size}")
        if self.max_draft_tokens < 1:
            raise BundleError(f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")

    def check_onnxruntime(self, version: str) -> None:
        """Refuse, before any graph loads, a bundle this onnxruntime cannot run: an opset newer than it
        reads, or onnxruntime-genai builder graphs (GroupQueryAttention with 12 inputs) before 1.23."""
        ours = _version(version)
        for role, info in self.models.items():
            if info.builder == "genai" and ours < (1, 23):
                raise BundleError(f"the {role} graph was built by onnxruntime-genai's builder, which needs onnxruntime "
                                  f">= 1.23 (this is {version}): upgrade onnxruntime, or re-export with spec-export "
                                  f"--builder torch")
            newest = max((v for k, v in MAX_OPSET.items() if k <= ours), default=19)
            if info.opset and ours < max(MAX_OPSET) and info.opset > newest:
                raise BundleError(f"the {role} graph uses ONNX opset {info.opset}; onnxruntime {version} reads up to "
                                  f"{newest}: upgrade onnxruntime, or re-export with spec-export --opset {newest}")

    @property
    def has_draft(self) -> bool:
        return "draft" in self.models

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        if not isinstance(d, dict):
            raise BundleError(f"the manifest must be a JSON object, got {type(d).__name__}; re-export the bundle")
        version = d.get("format_version")
        if version not in READABLE_VERSIONS:
            raise BundleError(f"bundle format version {version!r} is not supported (this specedge reads "
                              f"versions {', '.join(map(str, READABLE_VERSIONS))}); re-export it with this version's spec-export")
        try:
            if not isinstance(d.get("models"), dict) or not all(isinstance(m, dict) for m in d["models"].values()):
                raise TypeError("models must map roles to model entries")
            models = {role: ModelInfo(**m) for role, m in d["models"].items()}
            return cls(**{**d, "models": models})
        except (KeyError, TypeError, AttributeError) as e:
            raise BundleError(f"manifest is malformed ({e}); re-export the bundle with spec-export") from e

    @classmethod
    def load(cls, folder: str | Path) -> "Manifest":
        """Read and check a bundle: the format version, and that every file it names exists."""
        folder = Path(folder)
        path = folder / MANIFEST
        if folder.is_file():
            raise BundleError(f"{folder} is a file; a bundle is the folder spec-export wrote (with {MANIFEST})")
        if not folder.is_dir():
            raise BundleError(f"bundle folder {folder} does not exist; create one with spec-export")
        if not path.is_file():
            raise BundleError(f"{folder} has no {MANIFEST}: not a specedge bundle (create one with spec-export)")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise BundleError(f"{path} is not valid JSON ({e}); re-export the bundle") from e
        m = cls.from_dict(d)
        files = ([m.tokenizer] + [info.file for info in m.models.values()] + [info.data for info in m.models.values()
                                                                           if info.data]
                 + [f for f in (m.prompts, m.chat_template) if f])
        outside = [f for f in files if not inside(folder, f)]
        if outside:
            raise BundleError(f"the manifest names {outside[0]!r}, which is outside the bundle {folder}; a bundle's "
                              f"files live inside its folder: re-export it with spec-export")
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise BundleError(f"bundle {folder} is missing {', '.join(missing)}; re-export it with spec-export")
        return m


_KINDS = {"str": str, "int": int, "float": (int, float), "dict": dict, "list[str]": list, "list[int]": list,
          "str | None": (str, type(None)), "int | None": (int, type(None)), "dict[str, ModelInfo]": dict}


def _check_fields(obj, what: str, skip: tuple[str, ...] = ()) -> None:
    """Each field of the dataclass `obj` holds its annotated kind (a bool is no int): a malformed
    manifest is one BundleError, not a TypeError deep in the runtime."""
    from dataclasses import fields
    for f in fields(obj):
        value, kind = getattr(obj, f.name), _KINDS.get(str(f.type))
        if f.name in skip or kind is None:
            continue
        bad = not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int, float)))
        if not bad and str(f.type) == "list[str]":
            bad = not all(isinstance(v, str) for v in value)
        if bad:
            raise BundleError(f"{what} field {f.name} must be {f.type}, got {value!r:.80}; re-export the bundle")


# the newest ONNX opset each onnxruntime release reads (its release notes); later releases read at least 23
MAX_OPSET = {(1, 17): 20, (1, 18): 21, (1, 19): 21, (1, 20): 21, (1, 21): 22, (1, 22): 23}


def _version(text: str) -> tuple[int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in text.split(".")[:2]]
    return tuple(parts + [0] * (2 - len(parts)))


def read_prompts(path: str | Path, *, records: bool = False) -> list:
    """The prompts of a JSONL file (one object with a "prompt" a line: a bundle's prompts.jsonl);
    records=True: the whole objects instead (each with its "prompt" and whatever else its line holds,
    e.g. "kind", "file")."""
    path = Path(path)
    prompts = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                prompt = row["prompt"]
                prompts.append(row if records else prompt)
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"{path}:{i}: each line must be a JSON object with a 'prompt' ({e})") from e
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    return prompts
