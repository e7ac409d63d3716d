#!/usr/bin/env bash
# gpu_runbook.sh: what to run when a GPU is lent. Builds for the local GPU, runs every CUDA test on
# the device (make gpu-check), the CUDA trainer against the CPU trainer (tests/test_cuda.py and
# tests/test_cuda_matrix.py), then a benchmark table of tokens/s, MFU and device and host memory
# for runs of "model B flags" (writes dev/bench_gpu.md, naming the GPU and date): d12 and d24 at
# B = 8..32 (d12 also at 64, as ../shared/GPU.md's figures), flash attention (the default) against
# --attention matmul on d12 and d48, the memory flags on d12 and d48, and the models that only
# optimizer offload fits (d72, d84: fp32 master weights and Adafactor state in host memory), and
# the kernel tests' timings from make gpu-check (flash against matmul attention among them).
#
#   bash scripts/gpu_runbook.sh                 # everything, about half an hour on an H100
#   RUNS="d12 16 --offload optimizer" bash scripts/gpu_runbook.sh bench   # the benchmark only, one run
#   TRAINER=build/emu/train_gpt RUNS="tiny 2 --recompute 1" T=64 STEPS=3 bash scripts/gpu_runbook.sh bench
#                                               # the table's machinery, emulated (no GPU needed)
#
# Without a GPU (and without TRAINER) it says so and exits 2.
set -u
cd "$(dirname "$0")/.."

WHAT=${1:-all}
TRAINER=${TRAINER:-./train_gpt_cu}
# one run a line: model, micro-batch B, flags. The big models accumulate 8 micro-steps a step, so
# that the step's transfers and the CPU's update spread over more compute
DEFAULT_RUNS="d12 8
d12 16
d12 32
d24 8
d24 16
d24 32
d12 16 --attention matmul
d12 64
d12 16 --recompute 1,gelu,attn
d12 16 --offload activations
d12 16 --offload optimizer
d12 16 --offload optimizer,gradients
d48 8
d48 8 --attention matmul
d48 8 --recompute 1 --offload optimizer
d72 1 --optimizer adafactor --recompute 1,gelu,attn --offload optimizer -d 8192
d84 1 --optimizer adafactor --recompute 1,gelu,attn --offload optimizer -d 8192
d84 1 --optimizer adafactor --recompute 1,gelu,attn --offload optimizer,gradients -d 8192"
RUNS=${RUNS:-$DEFAULT_RUNS}
T=${T:-1024}
STEPS=${STEPS:-12}                     # the first steps warm up; the table takes the median of the rest
OUT=${OUT:-dev/bench_gpu.md}
DATA=data/tinyshakespeare/tiny_shakespeare_train.bin

if [ "$TRAINER" = ./train_gpt_cu ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU here (nvidia-smi finds none): this runbook is for a machine with one"
    echo "  (TRAINER=build/emu/train_gpt runs the benchmark's machinery on the emulated device)"
    exit 2
fi

KERNELS=$(mktemp)  # make gpu-check's output: its "bench" lines time each kernel on the GPU
if [ "$WHAT" = all ]; then
    make -j"$(nproc)" train_gpt test_gpt train_gpt_cu || exit 1
    make gpu-check 2>&1 | tee "$KERNELS"
    [ "${PIPESTATUS[0]}" -eq 0 ] || echo "FAIL make gpu-check"
    python3 tests/test_cuda.py ./train_gpt_cu ./train_gpt ./test_gpt || echo "FAIL tests/test_cuda.py"
    python3 tests/test_cuda_matrix.py ./train_gpt_cu ./train_gpt ./test_gpt || echo "FAIL tests/test_cuda_matrix.py"
fi
[ -f "$DATA" ] || make data || exit 1

GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)
[ -n "$GPU" ] || GPU="emulated device ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
DIRS=$(mktemp -d)
trap 'rm -rf "$DIRS" "$KERNELS"' EXIT
n=0
while read -r model B flags; do
    [ -n "$model" ] || continue
    n=$((n + 1))
    dir="$DIRS/run$(printf %02d $n)"
    mkdir -p "$dir"
    printf '%s\n%s\n%s\n' "$model" "$B" "$flags" > "$dir/spec"
    echo "== $model B=$B T=$T $flags ($STEPS steps)"
    # shellcheck disable=SC2086  # the flags are words
    "$TRAINER" -e "$model" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -n 0 -k "" $flags -o "$dir/out" > "$dir/stdout" 2>&1 ||
        { echo "   failed: $(tail -n 3 "$dir/stdout")"; continue; }
    grep -E '^step +[0-9]+/' "$dir/stdout" | tail -n 1
done <<< "$RUNS"

python3 - "$DIRS" "$OUT" "$GPU" "$T" "$KERNELS" <<'PY'
import datetime, glob, json, os, statistics, sys
dirs, out, gpu, T, kernels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
rows = []
for d in sorted(glob.glob(os.path.join(dirs, "run*"))):
    model, b, flags = open(os.path.join(d, "spec")).read().split("\n")[:3]
    log_path = os.path.join(d, "out", "log.jsonl")
    if not os.path.exists(log_path):
        rows.append((model, b, flags, None))
        continue
    log = [json.loads(l) for l in open(log_path)]
    steps = [r for r in log if "loss" in r][2:] or [r for r in log if "loss" in r]
    mem = next(r["memory"] for r in log if "memory" in r)
    tok = statistics.median(r["tokens_per_s"] for r in steps)
    mfu = statistics.median(r["mfu"] for r in steps) if all("mfu" in r for r in steps) else None
    rows.append((model, b, flags, (tok, mfu, mem["measured"]["device_total"] / 2**30, mem["measured"]["host_total"] / 2**30)))
with open(out, "w") as f:
    f.write(f"# CUDA trainer benchmark\n\n{gpu}; {datetime.date.today()}; T={T}, bf16, AdamW unless the flags say, "
            "TinyShakespeare; tokens/s and MFU are medians over the steps after the first two; memory is the "
            "accounted high-water mark (the memory table's device and host totals).\n\n")
    f.write("| model | B | flags | tokens/s | MFU | device GiB | host GiB |\n|---|---|---|---|---|---|---|\n")
    for m, b, flags, r in rows:
        if r is None:
            f.write(f"| {m} | {b} | {flags or '-'} | failed (see the runbook's output) | | | |\n")
            continue
        tok, mfu, dev, host = r
        f.write(f"| {m} | {b} | {flags or '-'} | {tok:,.0f} | {'-' if mfu is None else f'{100 * mfu:.1f}%'} | {dev:.2f} | {host:.2f} |\n")
    bench = [l.rstrip() for l in open(kernels, errors="replace") if l.startswith("bench ")]
    if bench:  # the kernel tests' timings (dev/cuda/test_*.cu: d12's shapes, e.g. flash against matmul attention)
        f.write("\n## Kernels (`make gpu-check`: the dev/cuda tests' timings, d12's shapes)\n\n```\n" + "\n".join(bench) + "\n```\n")
print(open(out).read())
PY
