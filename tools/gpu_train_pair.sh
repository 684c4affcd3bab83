#!/usr/bin/env bash
# Train the demo pair on a lent GPU in one device run (minutes instead of CPU hours).
#
# Here, first:   python tools/train_demo_pair.py pack --out .gpu      (.gpu/ is git-ignored, ~35 MB)
# Device run:    run(command="bash tools/gpu_train_pair.sh", carry=[".gpu"], timeout_s=560)
#                (TARGET_MIN / DRAFT_MIN / BATCH override the budget; the whole run must end in time)
# Here, after:   cat FILES_AT/pair.tar.part* | tar -x -C ~/.cache/specedge/demo-gpu
#                cp ~/.cache/specedge/demo/{tokenizer.json,data.json,heldout.bin} ~/.cache/specedge/demo-gpu/
#                python tools/train_demo_pair.py package --work ~/.cache/specedge/demo-gpu --out models/
# Same recipe and seeds as the CPU run; bf16 autocast on the GPU too. Returns fp16 weights and
# training logs (no optimizer state) in <= 15 MB parts, under the device tool's 16 MiB per file.
#
# DRAFT_ONLY=1 [SHAPE=4x192] [DRAFT_MIN=6] [COOLDOWN=400]: distil a new draft from the SHIPPED target
# (models/target, imported by the `teacher` phase) instead of training both; returns draft.pt only.
# Here, after:   mkdir -p W && cat FILES_AT/pair.tar.part* | tar -x -C W
#                cp ~/.cache/specedge/demo/{tokenizer.json,data.json,heldout.bin} W/
#                python tools/train_demo_pair.py teacher --work W
#                python tools/train_demo_pair.py package --work W --out W/models
#                python tools/eval_demo_pair.py --models W/models --work W --bundle bundles/demo-W \
#                    --json W/eval.json --card W/card.md     # alpha and c of the new draft against the bars
# (tested end to end on CPU with DRAFT_MIN=0.2 COOLDOWN=3 BATCH=4 PYTHON=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
W=/tmp/specedge-demo
OUT=${OUT:-/tmp/specedge-out}
mkdir -p "$W" "$OUT"
for f in .gpu/*.xz; do xz -dc "$f" > "$W/$(basename "$f" .xz)"; done
cp .gpu/tokenizer.json .gpu/data.json "$W/"
PY=${PYTHON:-python3}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/log.txt"
if [ "${DRAFT_ONLY:-0}" = 1 ]; then
  "$PY" tools/train_demo_pair.py teacher --work "$W" --from models/target >> "$OUT/log.txt" 2>&1
  "$PY" tools/train_demo_pair.py draft --work "$W" --shape "${SHAPE:-4x192}" --minutes "${DRAFT_MIN:-6}" \
    --batch "${BATCH:-64}" 2>&1 | tail -n 40 >> "$OUT/log.txt"
  "$PY" tools/train_demo_pair.py cooldown --model draft --work "$W" --steps "${COOLDOWN:-400}" \
    --batch "${BATCH:-64}" 2>&1 | tail -n 10 >> "$OUT/log.txt"
  KINDS="draft.pt"
else
  "$PY" tools/train_demo_pair.py target --work "$W" --minutes "${TARGET_MIN:-5}" --batch "${BATCH:-64}" 2>&1 | tail -n 40 >> "$OUT/log.txt"
  "$PY" tools/train_demo_pair.py draft --work "$W" --minutes "${DRAFT_MIN:-2.5}" --batch "${BATCH:-64}" 2>&1 | tail -n 40 >> "$OUT/log.txt"
  KINDS="target.pt draft.pt"
fi
"$PY" tools/train_demo_pair.py slim --work "$W" --out "$W/slim"
tar -C "$W/slim" -cf - $KINDS | split -b 15M - "$OUT/pair.tar.part"
ls -la "$OUT" >> "$OUT/log.txt"
