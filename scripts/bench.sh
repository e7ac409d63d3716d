#!/usr/bin/env bash
# bench.sh: CPU training throughput against OpenBLAS's sgemm and the triad bandwidth, in one run on one machine.
# Writes a markdown table to stdout and to dev/bench_cpu.md (override with BENCH_OUT).
#   make bench                       # d12 (B=4, T=64) and the default model d6
#   STEPS=8 bash scripts/bench.sh    # more steps per model (the first is not timed)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-5}
# the widest SIMD the kernels can use here: figures differ by 2-3x between the two
SIMD=$(if grep -qw avx512f /proc/cpuinfo; then echo "AVX-512"; elif grep -qw avx2 /proc/cpuinfo; then echo "AVX2, no AVX-512"; else echo "no AVX2"; fi)
OUT=${BENCH_OUT:-dev/bench_cpu.md}
# the load average before and after: on a shared machine the same step runs 1x to 5x slower, so a
# figure is read with the load it was taken under
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
DATA="-i data/tinyshakespeare/tiny_shakespeare_train.bin -j '' -o '' -s 0 -v 0"

bench_out=$(./build/bench_matmul | tee /dev/stderr)
sgemm=$(echo "$bench_out" | grep '^sgemm_openblas_gflops' | tail -n 1 | awk '{print $2}')
triad=$(echo "$bench_out" | grep '^triad_gb_s' | tail -n 1 | awk '{print $2}')
# Debian's OpenBLAS 0.3.21 picks its AVX2 kernels on some AVX-512 CPUs (Zen 4/5); its AVX-512
# kernels, forced, are a stricter baseline, reported beside it where the CPU has AVX-512
sgemm512="n/a"
if grep -q avx512f /proc/cpuinfo; then
    sgemm512=$(OPENBLAS_CORETYPE=SkylakeX ./build/bench_matmul 2>/dev/null | grep '^sgemm_openblas_gflops' | tail -n 1 | awk '{print $2}')
fi

# runs one model; prints a table row: model, ms/step, tok/s, GFLOP/s, % of sgemm, peak RSS
bench_model() {
    local model="$1" B="$2" T="$3"
    local log
    log=$(mktemp)
    eval ./train_gpt -e "$model" -b "$B" -t "$T" -x "$STEPS" $DATA > "$log"
    # average over the steps after the first (warm caches, pages already touched)
    local stats
    stats=$(grep -E '^step +[0-9]+/' "$log" | tail -n +2 | \
        sed -E 's/.*\| +([0-9.]+) ms \| +([0-9]+) tok\/s \| +([0-9.]+) GFLOP\/s.*/\1 \2 \3/' | \
        awk '{ms+=$1; tok+=$2; gf+=$3; n++} END {printf "%.1f %.0f %.1f", ms/n, tok/n, gf/n}')
    local rss
    rss=$(grep -E '^peak RSS' "$log" | sed -E 's/peak RSS ([0-9.]+) MiB.*/\1/')
    rm -f "$log"
    set -- $stats
    local pct
    pct=$(awk -v g="$3" -v s="$sgemm" 'BEGIN {printf "%.0f", 100*g/s}')
    local pct512="n/a"
    if [ "$sgemm512" != "n/a" ]; then pct512=$(awk -v g="$3" -v s="$sgemm512" 'BEGIN {printf "%.0f%%", 100*g/s}'); fi
    echo "| $model | $B | $T | $1 | $2 | $3 | $pct% | $pct512 | $rss |"
}

{
    echo "# CPU training benchmark"
    echo
    echo "$(date -u +%Y-%m-%d), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($SIMD), OpenMP threads: ${OMP_NUM_THREADS:-all}."
    echo "OpenBLAS sgemm on the largest forward shape of d12 (the classifier) in this run: **$sgemm GFLOP/s**"
    echo "as installed, **$sgemm512 GFLOP/s** with its AVX-512 kernels forced (OPENBLAS_CORETYPE=SkylakeX)."
    echo "Memory: the STREAM triad over every thread, in the same run: **$triad GB/s** (cpu/roofline.h; --profile's roof column"
    echo "gives each kernel its share of this bandwidth or of the GEMM rate, whichever binds)."
    echo "GFLOP/s counts 6 per parameter per token plus attention's 6 L T C (the causal half, as llm.c's MFU);"
    echo "ms/step, tok/s and GFLOP/s average steps 2..$STEPS. Command: \`make bench\` (STEPS=$STEPS)."
    echo "Load average (1, 5, 15 min) before: $LOAD_BEFORE."
    echo
    echo "| model | B | T | ms/step | tok/s | GFLOP/s | of sgemm | of AVX-512 sgemm | peak RSS MiB |"
    echo "|---|---|---|---|---|---|---|---|---|"
    bench_model d12 4 64
    bench_model d6 4 64
    echo
    echo "Load average after: $(cut -d' ' -f1-3 /proc/loadavg)."
} | tee "$OUT"
