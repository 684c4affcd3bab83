"""Graph surgery: a `logits_to_keep` input that limits the LM head to the last positions.

A prefill needs no logits at all (the runtime feeds every prompt token but the last), and a draft
step needs the last row only; yet a graph computes the LM head -- hidden x vocab per position, a
quarter of the demo target's weights and most of a small draft's -- for every new position. The
input slices the hidden states before that MatMul:

    logits = MatMul(Slice(hidden, starts=-logits_to_keep, ends=inf, axes=1), W)

`logits_to_keep` is int64 [1]; a value >= the new tokens' count keeps them all, so one graph still
serves prefill, decode and verification. It is a plain (required) input: an input with a default
(an initializer of the same name) cannot be bound through IOBinding, which the in-place and GPU
caches use. Works on the graphs of both builders (logits come from one MatMul, or MatMulNBits for
int4 weights, possibly followed by a Cast); a graph whose head is neither keeps its full logits.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

KEEP = "logits_to_keep"
_PASS_THROUGH = ("Cast", "Identity")
_HEADS = ("MatMul", "MatMulNBits")     # fp32/fp16, and int4 weights (input 0 is the activations in both)


def add_logits_to_keep(path: Path) -> bool:
    """Rewrite `path` in place (its external weights untouched); False if the head is not a MatMul."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    if any(i.name == KEEP for i in g.input):
        return True
    producer = {o: n for n in g.node for o in n.output}
    chain, node = ["logits"], producer.get("logits")
    while node is not None and node.op_type in _PASS_THROUGH:
        chain.append(node.input[0])
        node = producer.get(node.input[0])
    if node is None or node.op_type not in _HEADS:
        return False
    names = {s: f"/{KEEP}/{s}" for s in ("start", "end", "axis", "hidden")}
    at = list(g.node).index(node)                # before the head: the node list stays topological
    g.node.insert(at, helper.make_node("Neg", [KEEP], [names["start"]], name=f"/{KEEP}/Neg"))
    g.node.insert(at + 1, helper.make_node("Slice", [node.input[0], names["start"], names["end"], names["axis"]],
                                           [names["hidden"]], name=f"/{KEEP}/Slice"))
    node.input[0] = names["hidden"]
    everything = np.array([np.iinfo(np.int64).max], np.int64)
    g.initializer.extend([numpy_helper.from_array(everything, names["end"]),
                          numpy_helper.from_array(np.array([1], np.int64), names["axis"])])
    g.input.append(helper.make_tensor_value_info(KEEP, TensorProto.INT64, [1]))
    # the logits' length is no longer the new tokens' count: drop the shapes recorded downstream
    stale = set(chain)
    kept = [vi for vi in g.value_info if vi.name not in stale]
    del g.value_info[:]
    g.value_info.extend(kept)
    for out in g.output:
        if out.name == "logits":
            out.type.tensor_type.shape.dim[1].dim_param = "logits_length"
    onnx.save(model, str(path))
    return True


HIDDEN = "hidden_states"


def add_hidden_output(path: Path, *, width: int, half: bool = False) -> bool:
    """Also output the final (normed) hidden state of every new position, the LM head's input, as float32
    [batch, new tokens, width]: what a hidden-state draft head reads. `half`: the graph computes in fp16.
    Rewrites `path` in place; False if the head is not a MatMul."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    if any(o.name == HIDDEN for o in g.output):
        return True
    producer = {o: n for n in g.node for o in n.output}
    node = producer.get("logits")
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producer.get(node.input[0])
    if node is None or node.op_type not in _HEADS:
        return False
    source = node.input[0]
    if source.startswith(f"/{KEEP}/"):            # logits_to_keep's Slice: take what it slices
        source = producer[source].input[0]
    if half:
        g.node.append(helper.make_node("Cast", [source], [HIDDEN], name="/hidden_states/Cast", to=TensorProto.FLOAT))
    else:
        g.node.append(helper.make_node("Identity", [source], [HIDDEN], name="/hidden_states/Identity"))
    g.output.append(helper.make_tensor_value_info(HIDDEN, TensorProto.FLOAT, ["batch_size", "sequence_length", width]))
    onnx.save(model, str(path))
    return True


def add_vocab_map(path: Path, vocab_map: np.ndarray, vocab_size: int) -> None:
    """A head over `vocab_map` (ids of a subset of the vocabulary) gets full-width logits: its own at
    those ids, a large finite negative elsewhere, so q is exactly 0 outside its support and the runtime
    treats it like any draft. Rewrites `path` in place."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    sub = "/vocab_map/logits_sub"
    for n in g.node:
        n.output[:] = [sub if o == "logits" else o for o in n.output]
    names = {k: f"/vocab_map/{k}" for k in ("shape", "lead", "full_shape", "fill", "idx", "idx_b", "vocab", "zero",
                                            "two")}
    g.initializer.extend([
        numpy_helper.from_array(np.asarray(vocab_map, np.int64).reshape(1, 1, -1), names["idx"]),
        numpy_helper.from_array(np.array([vocab_size], np.int64), names["vocab"]),
        numpy_helper.from_array(np.array([0], np.int64), names["zero"]),
        numpy_helper.from_array(np.array([2], np.int64), names["two"])])
    g.node.extend([
        helper.make_node("Shape", [sub], [names["shape"]]),
        helper.make_node("Slice", [names["shape"], names["zero"], names["two"]], [names["lead"]]),
        helper.make_node("Concat", [names["lead"], names["vocab"]], [names["full_shape"]], axis=0),
        helper.make_node("ConstantOfShape", [names["full_shape"]], [names["fill"]],
                         value=helper.make_tensor("fill", TensorProto.FLOAT, [1], [-1e30])),
        helper.make_node("Expand", [names["idx"], names["shape"]], [names["idx_b"]]),
        helper.make_node("ScatterElements", [names["fill"], names["idx_b"], sub], ["logits"], axis=2)])
    for out in g.output:
        if out.name == "logits":
            out.type.tensor_type.shape.dim[2].dim_value = int(vocab_size)
    onnx.save(model, str(path))
