#!/usr/bin/env bash
# bench_optimizer_state.sh: the quality of --optimizer-state (issue 35, doc/optimizer_state.md): d6 on
# TinyShakespeare trained with the optimizer's moments in fp32, bf16 and 8bit, the same seed, data and
# flags otherwise; the validation loss curves of the three plotted into one PNG (scripts/plot_log.py),
# and a markdown table of the last validation loss of each, its difference from fp32's, and the
# step time. A benchmark, not a test: 2,000 steps take hours on two cores (run it on a quiet machine).
#   bash scripts/bench_optimizer_state.sh                        # 2,000 steps, beta2 0.95 (the default)
#   STEPS=50 VAL_EVERY=10 bash scripts/bench_optimizer_state.sh  # a short run: the script works
#   BETA2=0.999 bash scripts/bench_optimizer_state.sh            # where 8-bit's nearest rounding lags (doc/optimizer_state.md)
# Writes $OUT/{fp32,bf16,8bit}/ (each run's log.jsonl and checkpoint), $OUT/val_loss.png and
# $OUT/results.md (OUT default bench_out/optimizer_state_b<BETA2>).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-2000}
VAL_EVERY=${VAL_EVERY:-100}
VAL_STEPS=${VAL_STEPS:-20}
BETA2=${BETA2:-0.95}
OUT=${OUT:-bench_out/optimizer_state_b${BETA2}}
FORMATS=(fp32 bf16 8bit)
[ -x ./train_gpt ] || make train_gpt
[ -f data/tinyshakespeare/tiny_shakespeare_train.bin ] || make data
mkdir -p "$OUT"

# the last validation loss a run's log.jsonl holds
last_val() { python3 -c 'import json, sys
vals = [r["val_loss"] for r in map(json.loads, open(sys.argv[1])) if "val_loss" in r]
print(f"{vals[-1]:.6f}" if vals else "nan")' "$1/log.jsonl"; }

# the mean ms of the step lines after the first (which pays for warm-up)
step_ms() { grep -E '^step +[0-9]+/' "$1" | tail -n +2 | sed -E 's/.*\| +([0-9.]+) ms \|.*/\1/' |
            awk '{ms += $1; n++} END {printf "%.1f", n ? ms / n : 0}'; }

for f in "${FORMATS[@]}"; do
    echo "== d6, --optimizer-state $f, $STEPS steps, beta2 $BETA2"
    ./train_gpt -e d6 -x "$STEPS" -v "$VAL_EVERY" -m "$VAL_STEPS" -s 0 --beta2 "$BETA2" \
        --optimizer-state "$f" -o "$OUT/$f" --overwrite 1 | tee "$OUT/$f.txt" | grep -E '^(step|val)' | tail -n 2
done
python3 scripts/plot_log.py "${FORMATS[@]/#/$OUT/}" -o "$OUT/val_loss.png" \
    --title "d6 TinyShakespeare, AdamW, optimizer state fp32 / bf16 / 8bit (beta2 $BETA2, $STEPS steps)"

base=$(last_val "$OUT/fp32")
{
    echo "d6 on TinyShakespeare, $STEPS steps, AdamW beta2 $BETA2, validation every $VAL_EVERY steps ($VAL_STEPS batches)"
    echo
    echo "| --optimizer-state | last validation loss | vs fp32 | ms/step |"
    echo "|---|---|---|---|"
    for f in "${FORMATS[@]}"; do
        v=$(last_val "$OUT/$f")
        echo "| $f | $v | $(python3 -c "print(f'{($v - $base) / $base * 100:+.2f}%')") | $(step_ms "$OUT/$f.txt") |"
    done
} | tee "$OUT/results.md"
echo "plot: $OUT/val_loss.png"
