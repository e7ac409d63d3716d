#!/usr/bin/env bash
# gpu_runbook.sh: what to run when a GPU is lent. Builds for the local GPU, runs every CUDA test on
# the device (make gpu-check), the CUDA trainer against the CPU trainer (tests/test_cuda.py), then
# a benchmark table of tokens/s, MFU and memory (writes dev/bench_gpu.md, naming the GPU and date).
#
#   bash scripts/gpu_runbook.sh                 # everything, about ten minutes on an H100
#   MODELS="d12" BATCHES="16" bash scripts/gpu_runbook.sh bench   # the benchmark only
#   TRAINER=build/emu/train_gpt MODELS=tiny BATCHES=2 T=64 STEPS=3 bash scripts/gpu_runbook.sh bench
#                                               # the table's machinery, emulated (no GPU needed)
#
# Without a GPU (and without TRAINER) it says so and exits 2.
set -u
cd "$(dirname "$0")/.."

WHAT=${1:-all}
TRAINER=${TRAINER:-./train_gpt_cu}
MODELS=${MODELS:-d12 d24}
BATCHES=${BATCHES:-8 16 32}
T=${T:-1024}
STEPS=${STEPS:-12}                     # the first steps warm up; the table takes the median of the rest
OUT=${OUT:-dev/bench_gpu.md}
DATA=data/tinyshakespeare/tiny_shakespeare_train.bin

if [ "$TRAINER" = ./train_gpt_cu ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU here (nvidia-smi finds none): this runbook is for a machine with one"
    echo "  (TRAINER=build/emu/train_gpt runs the benchmark's machinery on the emulated device)"
    exit 2
fi

if [ "$WHAT" = all ]; then
    make -j"$(nproc)" train_gpt test_gpt train_gpt_cu || exit 1
    make gpu-check || echo "FAIL make gpu-check"
    python3 tests/test_cuda.py ./train_gpt_cu ./train_gpt ./test_gpt || echo "FAIL tests/test_cuda.py"
fi
[ -f "$DATA" ] || make data || exit 1

GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)
[ -n "$GPU" ] || GPU="emulated device ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
RUNS=$(mktemp -d)
trap 'rm -rf "$RUNS"' EXIT
for model in $MODELS; do
    for B in $BATCHES; do
        dir="$RUNS/${model}_b${B}"
        echo "== $model B=$B T=$T ($STEPS steps)"
        "$TRAINER" -e "$model" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -n 0 -k "" -o "$dir" > "$RUNS/${model}_b${B}.out" 2>&1 ||
            { echo "   failed: $(tail -n 3 "$RUNS/${model}_b${B}.out")"; continue; }
        grep -E '^step +[0-9]+/' "$RUNS/${model}_b${B}.out" | tail -n 1
    done
done

python3 - "$RUNS" "$OUT" "$GPU" "$T" <<'PY'
import datetime, glob, json, os, statistics, sys
runs, out, gpu, T = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = []
for d in sorted(glob.glob(os.path.join(runs, "*_b*"))):
    if not os.path.isdir(d):
        continue
    log = [json.loads(l) for l in open(os.path.join(d, "log.jsonl"))]
    steps = [r for r in log if "loss" in r][2:] or [r for r in log if "loss" in r]
    mem = next(r["memory"] for r in log if "memory" in r)
    model, b = os.path.basename(d).rsplit("_b", 1)
    tok = statistics.median(r["tokens_per_s"] for r in steps)
    mfu = statistics.median(r["mfu"] for r in steps) if all("mfu" in r for r in steps) else None
    rows.append((model, int(b), tok, mfu, mem["measured"]["device_total"] / 2**30, mem["measured"]["host_total"] / 2**30))
rows.sort()
with open(out, "w") as f:
    f.write(f"# CUDA trainer benchmark\n\n{gpu}; {datetime.date.today()}; T={T}, bf16, AdamW, TinyShakespeare; "
            "tokens/s and MFU are medians over the steps after the first two; memory is the accounted "
            "high-water mark (the memory table's device and host totals).\n\n")
    f.write("| model | B | tokens/s | MFU | device GiB | host GiB |\n|---|---|---|---|---|---|\n")
    for m, b, tok, mfu, dev, host in rows:
        f.write(f"| {m} | {b} | {tok:,.0f} | {'-' if mfu is None else f'{100 * mfu:.1f}%'} | {dev:.2f} | {host:.2f} |\n")
print(open(out).read())
PY
