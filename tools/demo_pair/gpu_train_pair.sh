#!/usr/bin/env bash
# Train the demo pair on a lent GPU in one device run (minutes instead of CPU hours).
#
# Here, first:   python tools/demo_pair/train_demo_pair.py pack --out .gpu      (.gpu/ is git-ignored, ~23 MB)
# Device run:    run(command="bash tools/demo_pair/gpu_train_pair.sh", carry=[".gpu"], timeout_s=560)
#                (TARGET_MIN / DRAFT_MIN / BATCH override the budget; the whole run must end in time)
# Here, after:   cat FILES_AT/pair.tar.part* | tar -x -C ~/.cache/specedge/demo-gpu
#                cp ~/.cache/specedge/demo/{tokenizer.json,data.json,heldout.bin} ~/.cache/specedge/demo-gpu/
#                python tools/demo_pair/train_demo_pair.py package --work ~/.cache/specedge/demo-gpu --out models/
# Same recipe and seeds as the CPU run; bf16 autocast on the GPU too. Returns fp16 weights and
# training logs (no optimizer state) in <= 15 MB parts, under the device tool's 16 MiB per file.
#
# DRAFT_ONLY=1 [SHAPES="4x128 3x128x768 4x192"] [DRAFT_MIN=6] [COOLDOWN=400] [TVD=1]: distil new drafts
# from the SHIPPED target (models/target, imported by the `teacher` phase) instead of training both,
# every shape (LxH[xMLP], see train_demo_pair.py --shape) at once, in parallel processes on the one GPU
# (a small draft leaves it mostly idle); returns SHAPE/draft.pt for each. SHAPE=... is one shape.
# Here, after:   mkdir -p G && cat FILES_AT/pair.tar.part* | tar -x -C G      # G/SHAPE/draft.pt ...
#                for S in G/*/; do W=${S%/}
#                  cp ~/.cache/specedge/demo/{tokenizer.json,data.json,heldout.bin} $W/
#                  python tools/demo_pair/train_demo_pair.py teacher --work $W
#                  python tools/demo_pair/train_demo_pair.py package --work $W --out $W/models
#                  python tools/demo_pair/eval_demo_pair.py --models $W/models --work $W --bundle bundles/demo-$(basename $W) \
#                      --json $W/eval.json --card $W/card.md     # alpha and c of each draft against the quality targets
#                done
# (tested end to end on CPU, flow back included, with SHAPES="2x64 1x64x128" DRAFT_MIN=0.2 COOLDOWN=3 BATCH=4
#  PYTHON=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
W=/tmp/specedge-demo
OUT=${OUT:-/tmp/specedge-out}
mkdir -p "$W" "$OUT"
for f in .gpu/*.xz; do xz -dc "$f" > "$W/$(basename "$f" .xz)"; done
cp .gpu/tokenizer.json .gpu/data.json "$W/"
PY=${PYTHON:-python3}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/log.txt"
if [ "${DRAFT_ONLY:-0}" = 1 ]; then
  "$PY" tools/demo_pair/train_demo_pair.py teacher --work "$W" --from models/target >> "$OUT/log.txt" 2>&1
  SHAPES=${SHAPES:-${SHAPE:-4x128 3x128x768 4x192}}
  pids=()
  for S in $SHAPES; do
    WS="$W/drafts/$S"
    mkdir -p "$WS"
    for f in tokenizer.json data.json train.bin train_stdlib.bin heldout.bin target.pt; do ln -sf "$W/$f" "$WS/$f"; done
    ( "$PY" tools/demo_pair/train_demo_pair.py draft --work "$WS" --shape "$S" --tvd "${TVD:-1}" --minutes "${DRAFT_MIN:-6}" \
        --batch "${BATCH:-64}" > "$WS/train.log" 2>&1
      "$PY" tools/demo_pair/train_demo_pair.py cooldown --model draft --work "$WS" --steps "${COOLDOWN:-400}" \
        --batch "${BATCH:-64}" >> "$WS/train.log" 2>&1
      "$PY" tools/demo_pair/train_demo_pair.py slim --work "$WS" --out "$W/out/$S" --kinds draft >> "$WS/train.log" 2>&1 ) &
    pids+=("$!")
  done
  i=0
  for S in $SHAPES; do      # every shape's log comes back; a failed one says so
    status=ok; wait "${pids[$i]}" || status=FAILED
    i=$((i + 1))
    { echo "== $S: $status"; tail -n 12 "$W/drafts/$S/train.log"; } >> "$OUT/log.txt"
    mkdir -p "$W/out/$S" && cp "$W/drafts/$S/train.log" "$W/out/$S/"
  done
  tar -C "$W/out" -cf - . | split -b 15M - "$OUT/pair.tar.part"
else
  "$PY" tools/demo_pair/train_demo_pair.py target --work "$W" --minutes "${TARGET_MIN:-5}" --batch "${BATCH:-64}" 2>&1 | tail -n 40 >> "$OUT/log.txt"
  "$PY" tools/demo_pair/train_demo_pair.py draft --work "$W" --minutes "${DRAFT_MIN:-2.5}" --batch "${BATCH:-64}" 2>&1 | tail -n 40 >> "$OUT/log.txt"
  "$PY" tools/demo_pair/train_demo_pair.py slim --work "$W" --out "$W/slim"
  tar -C "$W/slim" -cf - target.pt draft.pt | split -b 15M - "$OUT/pair.tar.part"
fi
ls -la "$OUT" >> "$OUT/log.txt"
