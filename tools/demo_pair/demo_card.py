"""The demo pair's model card (markdown), rendered from the figures tools/demo_pair/eval_demo_pair.py wrote.

The eval imports this file, not the other way: the settings come with the figures. Nothing is measured
here: `python tools/demo_pair/eval_demo_pair.py --from-json models/eval.json` re-renders it.
"""
from __future__ import annotations

from pathlib import Path

import recipe    # the recipe's constants are the card's to state

ROOT = Path(__file__).resolve().parents[2]


def _rel(path: str) -> str:
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _m(n: int) -> str:
    return f"{n / 1e6:.2f} M"


def overlap_line(fig: dict) -> str:
    ov = fig.get("heldout_overlap")
    if ov is None:
        return "- Overlap of held-out files with the training corpus: not measured."
    if not ov["files"]:
        return (f"- No held-out file has a same-named training file sharing >= {100 * ov['threshold']:.0f} % "
                "of its lines.")
    items = "; ".join(f"`{f['file']}` ({100 * f['lines_shared']:.0f} % of its lines in "
                      f"`{Path(f['training_copy']).name}` under `{Path(f['training_copy']).parent.name}/`)"
                      for f in ov["files"])
    return (f"- **Near-copies in training**: {len(ov['files'])} held-out files share >= "
            f"{100 * ov['threshold']:.0f} % of their lines with a same-named training file: {items}; "
            f"{100 * ov['bytes_fraction']:.1f} % of the held-out bytes.")


def checkpoint(models: dict, role: str) -> dict:
    """The training state eval_demo_pair recorded from a model's checkpoint ({} when none was found)."""
    return models[role]["training"]["checkpoint"] or {}


def ul_lines(models: dict) -> list[str]:
    """The target's fine-tune against greedy loops, when its checkpoint records one."""
    ul = checkpoint(models, "target").get("unlikelihood")
    if not ul:
        return []
    teachers = checkpoint(models, "draft").get("teachers") or []
    after = (f" The draft distilled from the target as it was before this until its step {teachers[1]['from']}, "
             "and from the fine-tuned target after." if len(teachers) > 1 else "")
    return [f"- **Against loops** (target, steps {ul['from']} -> {ul['from'] + ul['steps']}, after its cool-down): "
            "sequence-level unlikelihood (Welleck et al. 2020). Each step greedily continues "
            f"{ul['new']} tokens after the last {ul['prefix']} tokens of 8 function openings from training files "
            f"(EOS ignored) and adds {ul['weight']:g} x -log(1 - p) of every token of a {ul['ngram']}-gram "
            "already seen in that continuation; KL to the target as it was, on the usual batches, keeps its "
            f"distribution on real code. LR {ul['lr']:g}, {ul['warmup']}-step warm-up, linear decay to 0." + after]


def draft_stage_lines(models: dict) -> list[str]:
    """The draft's on-policy rows and lower-LR stages, when its checkpoint records them."""
    ck = checkpoint(models, "draft")
    out = []
    onp = ck.get("on_policy") or {}
    if onp.get("rows"):
        out.append(f"- **On-policy rows** (draft, from step {onp['from']}): in {onp['rows']} of the 8 rows of every "
                   "batch the target continues the row's first half by sampling at temperature "
                   f"0.8, so the draft also learns the contexts the sampled benchmark puts it in (DistillSpec, GKD).")
    stages = [(c, lr) for c, lr in zip(ck.get("cooldowns") or [], ck.get("lrs") or []) if lr]
    if stages:
        out.append("- **Lower-LR stages** (draft): " + "; ".join(
            f"the stage cooled down from step {c[0]} peaks at LR {lr:g}" for c, lr in stages) + ".")
    return out


def onnx_weights(models: dict) -> str:
    return ", ".join(f"{role} {models[role].get('onnx_weights', 'fp32')}" for role in ("target", "draft"))


def loop_cost_lines(lc: dict | None, sc: dict, threads: int) -> list[str]:
    micro = (f"target 1-token step {sc['target_step_ms']:.2f} ms, draft {sc['draft_step_ms']:.2f} ms, "
             f"c = {sc['c']:.3f}; r(4) = target 5-token call / 1-token call = {sc['r']['4']:.2f}")
    if lc is None:             # figures from before the loops' own costs were recorded
        return [f"- Step costs (onnxruntime, {threads} thread, {sc['past']} cached tokens, medians of "
                f"{sc.get('reps', 30)} interleaved calls): {micro}."]
    return [f"- Step costs as the loops made the calls (engine time per call, pooled over the prompts above; "
            f"onnxruntime, {threads} thread): target-only step {lc['target_step_ms']:.3f} ms; in the K=4 greedy "
            f"rounds a draft step {lc['draft_step_ms']:.3f} ms (c = {lc['c']:.3f}, the quality targets' c) and a verify "
            f"{lc['verify_ms']:.3f} ms (r = {lc['r']:.2f}).",
            f"- The same engines in `spec-bench`'s microbenchmark (`step_costs`: {sc['past']} cached tokens, "
            f"medians of {sc.get('reps', 30)} interleaved runs of calls): {micro}. Its draft calls follow four "
            "target steps as well as a verify, a pattern the loop never makes: the target's extra passes evict "
            "more of the draft's weights from the caches, so its c is the higher one."]


def card(fig: dict) -> str:
    """The model card (markdown) from the figures this script wrote; nothing else is measured here."""
    K, TEMPERATURE, THREADS = (fig["settings"][key] for key in ("k", "temperature", "threads"))
    CONTEXT = recipe.CONTEXT
    data, models, ho, gen = fig["data"], fig["models"], fig["heldout"], fig["generation"]
    g, sc = gen["all"], fig["step_costs"]
    lines = ["# specedge demo pair: model card", "",
             "A small Llama target and a smaller Llama draft trained from scratch on Python source code on a "
             "CPU, for speculative code completion (the README's main command and `spec-bench`). "
             "Both are standard Hugging Face folders (`LlamaForCausalLM`, fp16 safetensors, byte-level BPE "
             "tokenizer) that `spec-export` exports like any downloaded model.", ""]

    lines += ["## Data", "",
              f"- **Sources** (this machine's Python, `{data.get('stdlib')}`): the standard library's `.py` "
              "files outside `test/`, `tests/`, `idle_test/`, `site-packages/`; for training only, also the "
              "standard library's tests (`test/`, `idlelib/idle_test/`) and the `.py` sources of the installed "
              f"packages {', '.join(f'`{p}`' for p in recipe.EXTRA_PACKAGES)}.",
              f"- **Held-out split by file**: a stdlib (non-test) file is held out when sha256(its path under "
              f"`Lib/`) mod 100 < {recipe.HELD_OUT_PERCENT}. Held out: {data['files_heldout']} files, "
              f"{data['bytes_heldout']:,} bytes, {data['tokens_heldout']:,} tokens "
              f"({data['bytes_heldout'] / data['tokens_heldout']:.3f} bytes/token). The held-out files are not "
              "in the training data, and the extra (test / package) code is never held out.",
              overlap_line(fig),
              f"- **Training**: {data['files_train']:,} files, {data['bytes_train']:,} bytes, "
              f"{data['tokens_train']:,} tokens; half of every batch comes from the stdlib's own non-held-out "
              "sources, half from the whole training corpus.",
              f"- **Tokenizer**: byte-level BPE (`tokenizers`), vocab {recipe.VOCAB}, trained on the stdlib training "
              f"files; special tokens {', '.join(f'`{s}`' for s in recipe.SPECIALS)} (end-of-text also separates files).",
              "- **Prompts** (`prompts.jsonl`, from held-out files only): "
              + ", ".join(f"{n} {k}" for k, n in fig["prompt_counts"].items())
              + " (function openings: context + a `def` line; edits: context cut at a line inside a function body).",
              "", "<details><summary>Held-out files</summary>", "",
              ", ".join(f"`{f}`" for f in data.get("heldout_files", [])), "", "</details>", ""]

    lines += ["## Models and recipe", "",
              "| | target | draft |", "|---|---|---|"]
    t, d = models["target"], models["draft"]
    rows = [("layers", "num_hidden_layers"), ("hidden", "hidden_size"), ("MLP", "intermediate_size"),
            ("attention heads", "num_attention_heads"), ("KV heads (GQA)", "num_key_value_heads"),
            ("vocab", "vocab_size"), ("max positions", "max_position_embeddings"),
            ("tied embeddings", "tie_word_embeddings"), ("RoPE theta", "rope_theta")]
    for label, key in rows:
        lines.append(f"| {label} | {t['config'][key]} | {d['config'][key]} |")
    lines += [f"| parameters | {_m(t['parameters'])} | {_m(d['parameters'])} |",
              f"| fp32 weights | {_mb(t['fp32_bytes'])} | {_mb(d['fp32_bytes'])} |",
              f"| fp16 safetensors (shipped) | {_mb(t['safetensors_fp16_bytes'])} | "
              f"{_mb(d['safetensors_fp16_bytes'])} |",
              "| ONNX graph (exported), weights | " + " | ".join(
                  f"{_mb(m.get('onnx_bytes', m.get('onnx_fp32_bytes')))}, {m.get('onnx_weights', 'fp32')}"
                  for m in (t, d)) + " |",
              f"| training steps | {t['training']['steps']} | {d['training']['steps']} |",
              f"| training tokens | {_m(t['training']['tokens'] or 0)} | {_m(d['training']['tokens'] or 0)} |"]
    cds = []
    for role in ("target", "draft"):
        ck = models[role]["training"]["checkpoint"]
        if ck and ck.get("cooldown"):
            cds.append(f"{role}: " + ", then re-warmed (200 steps) and trained on; ".join(
                f"from step {start} over {length} steps" for start, length in ck.get("cooldowns", [ck["cooldown"]])))
        elif ck:
            cds.append(f"{role}: none")
        else:
            cds.append(f"{role}: not recorded in the packaged `training_log.json`")
    tvd = checkpoint(models, "draft").get("tvd") or {}
    tvd_from = tvd if tvd.get("weight") else None
    lines += ["", "Steps and tokens are the last entry of each folder's `training_log.json` (the checkpoint's "
              "training state at packaging).", "",
              f"- **Objective**: next-token cross-entropy, context {recipe.CONTEXT}, batch 8 x {recipe.CONTEXT} tokens, "
              f"seed {recipe.SEED}, bf16 autocast with fp32 master weights (the first 3.2 M target tokens of this run were "
              "fp32). The draft is trained after the target, on the same kind of batches, with "
              "0.1 x cross-entropy + 0.9 x KL(target || draft) to the frozen target's distribution (distillation)"
              + (f", plus, from step {tvd_from['from']}, {tvd_from['weight']:g} x the total variation distance of the "
                 f"two at temperature {recipe.TVD_TEMPERATURE} (1 - alpha there); " if tvd_from else "; ") +
              f"its tied embedding starts as the target's projected onto its top {d['config']['hidden_size']} principal "
              "directions (SVD), "
              "its other weights at random.",
              *ul_lines(models), *draft_stage_lines(models),
              "- **Optimizer**: AdamW, betas (0.9, 0.95), weight decay 0.1, gradient clipping 1.0; "
              "peak LR 2e-3 (target) / 3e-3 (draft).",
              "- **Schedule**: warm-up / stable / decay: linear warm-up over 200 steps, then constant LR for an "
              "open-ended, resumable budget; a `cooldown` phase decays the LR linearly to 0. "
              f"Cool-down: {'; '.join(cds)}.", ""]

    lines += ["## Reproduce", "", "```sh",
              ". .venv/bin/activate            # dev venv with torch + transformers (tools/dev.py)",
              "python tools/demo_pair/train_demo_pair.py data"]
    ul = checkpoint(models, "target").get("unlikelihood")
    teachers = checkpoint(models, "draft").get("teachers") or []
    ul_at = teachers[1]["from"] if ul and len(teachers) > 1 else 0    # draft step from which it distils the fine-tune
    ul_cmd = "python tools/demo_pair/train_demo_pair.py unlikelihood   # resumable; the draft's later stages distil from it"
    for role in ("target", "draft"):
        m = models[role]
        ck = m["training"]["checkpoint"]
        steps = m["training"]["steps"]
        if role == "draft" and ul and not ul_at:
            lines.append(ul_cmd)
        if ck and ck.get("cooldown"):
            # loss options the checkpoint keeps from the step they joined: (flag, value, step)
            options = [(f, o[field], o["from"]) for f, o, field in (("--tvd", ck.get("tvd"), "weight"),
                                                                     ("--on-policy", ck.get("on_policy"), "rows"))
                       if o and o[field]]
            lrs, prev = ck.get("lrs") or [], 0
            for i, (start, length) in enumerate(ck.get("cooldowns", [ck["cooldown"]])):
                if role == "draft" and ul_at and prev <= ul_at < start:
                    lines.append(ul_cmd)
                lr = lrs[i] if i < len(lrs) else None
                flags = " --rewarm" * bool(i) + (f" --lr {lr:g}" if lr else "")
                for flag, value, joined in sorted(options, key=lambda o: o[2]):
                    if prev <= joined < start:                       # the option joins in this stage
                        if joined > prev:
                            lines.append(f"python tools/demo_pair/train_demo_pair.py {role}{flags} --minutes M --threads 1 "
                                         f"--until-step {joined}   # resumable: repeat until it stops there")
                            flags = ""
                        flags += f" {flag} {value:g}"
                lines += [f"python tools/demo_pair/train_demo_pair.py {role}{flags} --minutes M --threads 1 "
                          f"--until-step {start}   # resumable: repeat until it stops at step {start}",
                          f"python tools/demo_pair/train_demo_pair.py cooldown --model {role} --steps {length}"]
                prev = start + length
        else:
            lines.append(f"python tools/demo_pair/train_demo_pair.py {role} --minutes M --threads 1   "
                         f"# resumable; the packaged {role} stopped at step {steps}")
    lines += ["python tools/demo_pair/train_demo_pair.py package --out models/",
              fig["command"], "```", "",
              "Run the commands in this order: the draft distils from whatever `target.pt` holds when it runs. Batches "
              "depend on the step alone, so a resumed run sees the data of an uninterrupted one; results agree up to "
              "floating-point reduction order (thread count, CPU). Phases are "
              "time-budgeted (`--minutes`) and resume from checkpoints under `~/.cache/specedge/demo`; on a CUDA "
              "machine the same recipe runs on the GPU.", ""]

    b = fig["targets"]
    mark = lambda ok: "yes" if ok else "**no**"
    lines += ["## Measured figures", "",
              f"Measured by `{fig['command']}` with specedge's own runtime on the ONNX bundle "
              f"`{_rel(fig['bundle']['path'])}` ({onnx_weights(models)} weights), onnxruntime {fig['env']['onnxruntime']}, {THREADS} thread, "
              f"{fig['env']['machine']}, {fig['env']['date']}, commit {fig['env']['git_head']}; "
              f"{fig['seconds_total']:.0f} s in all (1-minute load average {fig['env'].get('loadavg_1min_start')} "
              f"at the start, {fig['env'].get('loadavg_1min_end')} at the end; it trails by about a minute and "
              f"counts this run too).", "",
              "### Quality targets", "", "| figure | measured | aim | met? |", "|---|---|---|---|",
              f"| target held-out top-1 accuracy | {b['target_top1']['value']:.3f} | >= 0.45 | "
              f"{mark(b['target_top1']['met'])} |",
              f"| target greedy continuations, distinct tokens (mean over prompts) | "
              f"{b['target_distinct']['value']:.3f} | >= 0.40 | {mark(b['target_distinct']['met'])} |",
              f"| held-out bits/byte, target vs draft | {b['bpb_target_below_draft']['target']:.3f} vs "
              f"{b['bpb_target_below_draft']['draft']:.3f} | target lower | "
              f"{mark(b['bpb_target_below_draft']['met'])} |",
              f"| alpha, K=4, greedy | {b['alpha_greedy_k4']['value']:.3f} | >= 0.80 | "
              f"{mark(b['alpha_greedy_k4']['met'])} |",
              f"| alpha, K=4, temperature {TEMPERATURE} | {b['alpha_t08_k4']['value']:.3f} | >= 0.75 | "
              f"{mark(b['alpha_t08_k4']['met'])} |",
              f"| c (draft / target 1-token step{', as the loops call them' if 'loop_costs' in g else ''}) | "
              f"{b['c']['value']:.3f} | <= 0.10 | "
              f"{mark(b['c']['met'])} |", ""]

    lines += [f"### Held-out next-token prediction (ONNX; {onnx_weights(models)})", "",
              f"{ho['windows']} fixed non-overlapping windows of {CONTEXT + 1} tokens of the held-out files "
              f"({ho['target']['tokens']:,} predicted tokens); bits/byte = loss / ln 2 / "
              f"{ho['bytes_per_token']:.3f} bytes per token.", "",
              "| | loss (nats/token) | perplexity | top-1 accuracy | bits/byte |", "|---|---|---|---|---|"]
    for role in ("target", "draft"):
        h = ho[role]
        lines.append(f"| {role} | {h['loss']:.3f} | {h['perplexity']:.1f} | {h['top1']:.3f} | "
                     f"{h['bits_per_byte']:.3f} |")
    lines += ["", "### Speculative decoding on the held-out prompts", "",
              f"{g['prompts']} prompts, {fig['settings']['max_new_tokens']} new tokens each (EOS ignored), K={K}; "
              f"alpha = accepted / evaluated and acceptance rate = accepted / drafted, pooled over prompts; "
              f"temperature {TEMPERATURE} runs are seeded (seed = prompt index).", "",
              "| prompts | alpha greedy | alpha T=0.8 | acceptance rate greedy | acceptance rate T=0.8 | "
              "tokens / target call greedy | tokens / target call T=0.8 | distinct (target greedy) |",
              "|---|---|---|---|---|---|---|---|"]
    for name, s in [("all", g)] + sorted(gen["by_kind"].items()):
        gk, tk = s["greedy_k4"], s["t08_k4"]
        lines.append(f"| {name} ({s['prompts']}) | {gk['alpha']:.3f} | {tk['alpha']:.3f} | "
                     f"{gk['acceptance_rate']:.3f} | {tk['acceptance_rate']:.3f} | "
                     f"{gk['tokens_per_target_call']:.2f} | {tk['tokens_per_target_call']:.2f} | "
                     f"{s['distinct']:.3f} |")
    lines += ["", f"- Accepted drafts per round, greedy (0..{K}): {g['greedy_k4']['accepted_hist']}; "
              f"T={TEMPERATURE}: {g['t08_k4']['accepted_hist']}.",
              f"- Speculative greedy output identical to target-only greedy on "
              f"{100 * g['greedy_identical_fraction']:.0f} % of the prompts.",
              *loop_cost_lines(g.get("loop_costs"), sc, THREADS),
              f"- Speculative / target-only tokens/s at K=4 greedy (end to end per request, prefill included, the "
              f"two runs of each prompt back to back in alternating order): median {g['speedup_k4_greedy_e2e_median']:.2f}x "
              f"over prompts (min {g['speedup_k4_greedy_e2e_min']:.2f}x, max {g['speedup_k4_greedy_e2e_max']:.2f}x); "
              f"target-only median {g['plain_tokens_per_second_e2e_median']:.0f} tokens/s. "
              "Wall-clock figures depend on the machine's load; `spec-bench` measures speed with repeats.", ""]
    return "\n".join(lines)
