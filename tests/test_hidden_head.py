"""A hidden-state draft head (EAGLE): trained here for a few seconds on a tiny target's own greedy
outputs, exported beside it, and certified exact by spec-check's checks (greedy identity at several k,
the chi-square of the sampled law), with acceptance well above chance so the accept paths run."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specedge.export import export_bundle
from specedge.export.eagle import EagleHead, load_head, save_head
from specedge.export.eagle_train import batch_tensors, chain_alpha, losses, vocab_subset
from specedge.runtime import SpeculativeDecoder
from specedge.runtime.check import CheckConfig, certify

from conftest import byte_tokenizer_json

pytestmark = pytest.mark.slow
PROMPTS = ["def add(a, b):\n    return", "for i in range(10):\n    print(i)\n", "class Point:\n    def __init__"]


def _own_outputs(target, n: int, *, length: int = 48, seed: int = 0) -> list[dict]:
    """The target's greedy continuations of random byte prompts, with its hidden states and top-8 laws."""
    rng = np.random.default_rng(seed)
    seqs = []
    with torch.no_grad():
        for _ in range(n):
            ids = torch.as_tensor(rng.integers(32, 127, size=6))[None]
            out = target.generate(ids, max_new_tokens=length, do_sample=False, pad_token_id=256)
            fwd = target(out, output_hidden_states=True)
            logp = torch.log_softmax(fwd.logits[0].float(), -1)
            top = torch.topk(logp, 8, -1)
            seqs.append({"tokens": out[0].numpy().astype(np.int32), "hidden": fwd.hidden_states[-1][0].numpy(),
                         "topk_ids": top.indices.numpy().astype(np.int32), "topk_logprob": top.values.numpy(),
                         "n_prompt": 6})
    return seqs


@pytest.fixture(scope="module")
def head_bundle(tmp_path_factory, llama_target):
    from transformers import AutoModelForCausalLM
    root = tmp_path_factory.mktemp("eagle")
    target = AutoModelForCausalLM.from_pretrained(llama_target, dtype=torch.float32).eval()
    train, held = _own_outputs(target, 48), _own_outputs(target, 6, seed=1)
    subset, _ = vocab_subset(train, 200, target.config.vocab_size)
    torch.manual_seed(0)
    head = EagleHead.from_target(target, torch.from_numpy(subset))
    index = np.full(target.config.vocab_size, -1, np.int64)
    index[subset] = np.arange(len(subset))
    before = chain_alpha(head.eval(), held, head.vocab_map)["alpha"]
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=5e-3)
    rng = np.random.default_rng(0)
    head.train()
    for _ in range(300):
        batch = [train[i] for i in rng.choice(len(train), 8, replace=False)]
        loss, _ = losses(head, *batch_tensors(batch, index), noise=0.05, unroll=2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = chain_alpha(head.eval(), held, head.vocab_map)["alpha"]
    save_head(head, root / "head", tokenizer_json=byte_tokenizer_json())
    out = root / "bundle"
    export_bundle(target=llama_target, draft=root / "head", out=out, k=4, max_context=256, quiet=True)
    return out, before, after, head


def test_training_raises_chain_acceptance(head_bundle):
    _, before, after, _ = head_bundle
    assert after > max(0.25, 5 * before), (before, after)


def test_the_saved_head_and_its_graph(head_bundle, llama_target):
    bundle, _, _, head = head_bundle
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["models"]["draft"]["kind"] == "eagle" and "hidden_states" in m["models"]["target"]["outputs"]
    assert max(d["max_rel_diff"] for d in m["models"]["draft"]["parity"].values()) < 1e-5
    loaded = load_head(head_bundle[0].parent / "head", target=llama_target)
    assert torch.equal(loaded.vocab_map, head.vocab_map)
    assert torch.equal(loaded.model.embed_tokens.weight, head.model.embed_tokens.weight)      # from the target
    from safetensors import safe_open
    with safe_open(str(head_bundle[0].parent / "head" / "model.safetensors"), "pt") as f:
        assert "model.embed_tokens.weight" not in f.keys()


def test_a_hidden_state_head_is_exact(head_bundle):
    bundle, *_ = head_bundle
    cert = certify(bundle, CheckConfig(prompts=3, new_tokens=24, samples=400, sampling_prompts=1, prompt_tokens=8),
                   threads=1, prompts=PROMPTS, log=lambda _: None)
    assert cert["checks"]["greedy"]["passed"], cert["checks"]["greedy"]
    assert cert["checks"]["sampling"]["passed"], cert["checks"]["sampling"]
    assert cert["passed"]


def test_prefix_reuse_and_alpha_through_the_loop(head_bundle):
    bundle, *_ = head_bundle
    dec = SpeculativeDecoder.from_bundle(bundle, threads=1, speculative=True)
    first = dec.generate(PROMPTS[1], max_new_tokens=40, temperature=0.0, ignore_eos=True)
    follow = PROMPTS[1] + dec.tokenizer.decode(first.token_ids)
    again = dec.generate(follow, max_new_tokens=24, temperature=0.0, ignore_eos=True)
    fresh = dec.generate(follow, max_new_tokens=24, temperature=0.0, ignore_eos=True, prefix_cache=False)
    plain = dec.generate(follow, max_new_tokens=24, temperature=0.0, ignore_eos=True, speculative=False)
    assert again.stats.draft_reused_tokens > 30 and again.stats.reused_tokens > 30
    assert again.token_ids == fresh.token_ids == plain.token_ids
    assert first.stats.alpha > 0.2 and first.stats.accepted > 5


def test_an_int8_head_keeps_the_output_exact(head_bundle, llama_target, tmp_path):
    import onnx
    bundle, *_ = head_bundle
    out = tmp_path / "int8"
    export_bundle(target=llama_target, draft=bundle.parent / "head", out=out, k=4, max_context=256, quiet=True,
                  draft_dtype="int8")
    ops = {n.op_type for n in onnx.load(str(out / "draft" / "model.onnx"), load_external_data=False).graph.node}
    assert "MatMulNBits" in ops
    m = json.loads((out / "manifest.json").read_text())
    assert m["models"]["draft"]["weights"] == "int8"
    dec = SpeculativeDecoder.from_bundle(out, threads=1, speculative=True)
    for prompt in PROMPTS:
        spec = dec.generate(prompt, max_new_tokens=24, temperature=0.0, ignore_eos=True)
        plain = dec.generate(prompt, max_new_tokens=24, temperature=0.0, ignore_eos=True, speculative=False)
        assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0


def test_spec_bench_measures_a_hidden_state_head(head_bundle, tmp_path):
    """spec-bench's step microbenchmark feeds a head the hidden states it reads (random ones of the
    target's width), so c is measured for a hidden-state pair as for a draft model."""
    from specedge.bench.cli import main as bench_main
    bundle, *_ = head_bundle
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "b.json"
    assert bench_main([str(bundle), "--prompts", str(prompts), "--n-prompts", "2", "--max-new-tokens", "12",
                       "--ks", "2", "--repeats", "1", "--json", str(out)]) == 0
    costs = json.loads(out.read_text())["step_costs"]
    assert 0 < costs["c"] < 10 and costs["draft_step_ms"] > 0 and set(costs["r"]) == {"2"}


def test_a_tensorrt_profile_for_a_head_reads_the_targets_width(head_bundle):
    from specedge.export.tensorrt import head_features_width, profile_shapes
    from specedge.runtime.manifest import Manifest
    bundle, *_ = head_bundle
    m = Manifest.load(bundle)
    width = head_features_width(bundle, m)
    assert width == json.loads((bundle / "target" / "config.json").read_text())["hidden_size"]
    shapes = profile_shapes(m.models["draft"], max_draft_tokens=m.max_draft_tokens, max_context=m.max_context,
                            hidden_size=width)
    assert shapes["target_hidden_states"][1] == (1, m.max_draft_tokens + 1, width)
