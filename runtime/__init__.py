"""specedge.runtime: speculative decoding on exported graphs, with numpy and ONNX Runtime only.

Glossary (used in names and shape comments throughout):
    p           target probabilities, [k+1, vocab]: one row per verified position
    q           draft probabilities, [k, vocab]: the distributions the draft tokens were sampled from
    k           most draft tokens proposed per round (K); a round stops early once the product of
                its drafts' confidences (the draft's top probability at each) falls below
                draft_confidence: the draft's own estimate that all of them are accepted
    round       draft k tokens -> ONE target call over k+1 positions -> accept -> commit / roll back
    lookup      prompt-lookup drafts (ngram > 0): when the context ends in an n-gram seen earlier, the
                tokens that followed it, drafted without a draft-model call; their q is one-hot
    accepted    draft tokens kept: draft x_i survives with probability min(1, p_i(x)/q_i(x))
    recovered   the token sampled from norm(max(0, p_i - q_i)) at the first rejection
    bonus       the token sampled from p_{k+1} when all k drafts are accepted
    alpha       accepted / evaluated: the per-token acceptance probability (Leviathan et al. 2023)
    committed   tokens of the output so far; both KV caches hold all of them but the last

Every round returns n_accepted + 1 tokens whose joint law is exactly the target's (greedy: exactly
the target's argmax sequence). Randomness comes only from the np.random.Generator of the request.

    from specedge.runtime import SpeculativeDecoder
    dec = SpeculativeDecoder.from_bundle("bundle")
    res = dec.generate("def fib(n):", max_new_tokens=64, temperature=0.0, k=4)
    print(res.text, res.stats.alpha, res.stats.tokens_per_target_call)
"""
__version__ = "0.1.0"

from .config import ConfigError, GenerationConfig, SamplingParams
from .decoder import Result, SpeculativeDecoder, Stats, Stream
from .manifest import FORMAT_VERSION, BundleError, Manifest, ModelInfo
from .sampling import accept, probs, sample

__all__ = ["BundleError", "ConfigError", "FORMAT_VERSION", "GenerationConfig", "Manifest", "ModelInfo",
           "Result", "SamplingParams", "SpeculativeDecoder", "Stats", "Stream", "accept", "probs", "sample",
           "__version__"]
