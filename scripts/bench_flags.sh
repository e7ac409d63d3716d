#!/usr/bin/env bash
# bench_flags.sh: what each memory flag costs and saves, on d12 (GPT-2 124M) at B=4, T=64.
# For every flag set: ms/step, tokens/s, the step time against the plain run, and the
# measured high-water marks of the memory table (weights, gradients, optimizer state, device
# activations, the host store, the device total) and the peak RSS; with MPI, 2 ranks at each
# ZeRO stage, --tp 2 and --pp 2 (with 8 micro-batches: compare its tok/s with the --zero 0 row
# of the same tokens a step). Writes a markdown table to stdout
# and to dev/bench_flags.md (override with BENCH_OUT).
#   make bench-flags
#   STEPS=6 MODEL=d6 bash scripts/bench_flags.sh
# Timings are only comparable on a quiet machine: anything else running on the cores
# (a build, a test) slows every row.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-4}
MODEL=${MODEL:-d12}
OUT=${BENCH_OUT:-dev/bench_flags.md}
DATA=(-i data/tinyshakespeare/tiny_shakespeare_train.bin -j "" -o "" -s 0 -v 0)
SHAPE=(-e "$MODEL" -b 4 -t 64 -x "$STEPS")

# "name|flags" per row; the first is the baseline. A row whose flags start with "mpirun"
# runs as 2 MPI ranks of one OpenMP thread each (the same two cores), B=4 per rank.
MPIRUN="mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1"
CONFIGS=(
    "plain (AdamW, keep everything)|"
    "recompute sqrt|--recompute sqrt"
    "recompute 1 (every layer's input)|--recompute 1"
    "recompute gelu,attn (selective)|--recompute gelu,attn"
    "recompute sqrt,gelu,attn|--recompute sqrt,gelu,attn"
    "offload|--offload 1"
    "offload + recompute sqrt|--offload 1 --recompute sqrt"
    "adafactor|--optimizer adafactor"
    "adafactor + beta1 0.9|--optimizer adafactor --adafactor-beta1 0.9"
    "came|--optimizer came"
    "adafactor + sqrt,gelu,attn + offload|--optimizer adafactor --recompute sqrt,gelu,attn --offload 1"
)
if command -v mpirun >/dev/null && ldd ./train_gpt | grep -q libmpi; then
    CONFIGS+=("2 ranks, --zero 0|$MPIRUN --zero 0" "2 ranks, --zero 1|$MPIRUN --zero 1"
              "2 ranks, --zero 1 + adafactor|$MPIRUN --zero 1 --optimizer adafactor"
              "2 ranks, --zero 2 (and the gradients)|$MPIRUN --zero 2"
              "2 ranks, --zero 3 (and the weights)|$MPIRUN --zero 3"
              "2 ranks, --tp 2 (each layer's matrices split; one data-parallel rank)|$MPIRUN --tp 2"
              "2 ranks, --zero 0, 4 micro-steps a rank (-d 2048: the pipeline's tokens a step)|$MPIRUN --zero 0 -d 2048"
              "2 ranks, --pp 2 (2 stages of 6 layers, 8 micro-batches; rank 0: stage 0)|$MPIRUN --pp 2 -d 2048")
fi

# the measured MiB of a memory-table row (the table printed after the first step)
measured() { grep -E "^\| $2 +\|" "$1" | tail -n 1 | awk -F'|' '{ m = $4; gsub(/ |MiB/, "", m); print m }'; }

# the step lines after the first: "ms tok/s" averaged
step_stats() {
    grep -E '^step +[0-9]+/' "$1" | tail -n +2 |
        sed -E 's/.*\| +([0-9.]+) ms \| +([0-9]+) tok\/s.*/\1 \2/' |
        awk '{ms += $1; tok += $2; n++} END {printf "%.1f %.0f", ms / n, tok / n}'
}

# the widest SIMD the kernels can use here: figures differ by 2-3x between the two
SIMD=$(if grep -qw avx512f /proc/cpuinfo; then echo "AVX-512"; elif grep -qw avx2 /proc/cpuinfo; then echo "AVX2, no AVX-512"; else echo "no AVX2"; fi)

base_ms=""
rows=""
for entry in "${CONFIGS[@]}"; do
    name="${entry%%|*}"
    flags="${entry#*|}"
    log=$(mktemp)
    launcher=""
    if [ "${flags#mpirun}" != "$flags" ]; then launcher="$MPIRUN"; flags="${flags#"$MPIRUN" }"; fi
    # shellcheck disable=SC2086
    $launcher ./train_gpt "${SHAPE[@]}" "${DATA[@]}" $flags > "$log"
    read -r ms tok <<< "$(step_stats "$log")"
    [ -z "$base_ms" ] && base_ms=$ms
    ratio=$(awk -v a="$ms" -v b="$base_ms" 'BEGIN {printf "%.2f", a / b}')
    flops=$(grep -m1 -E '^recompute: ' "$log" | sed -E 's/.*\+([0-9.]+)% of the step.*/+\1%/' || true)
    rss=$(grep -E '^peak RSS' "$log" | sed -E 's/peak RSS ([0-9.]+) MiB.*/\1/')
    row="| $name | \`${launcher:+mpirun -np 2 (1 thread each): }${flags:-}\` | $ms | ${ratio}x | $tok | ${flops:--} | $(measured "$log" parameters) |"
    row="$row $(measured "$log" gradients) | $(measured "$log" 'optimizer state') |"
    row="$row $(measured "$log" activations) | $(measured "$log" 'host total') | $(measured "$log" 'device total') | $rss |"
    echo "$row" >&2
    rows="$rows$row"$'\n'
    rm -f "$log"
done

{
    echo "# Memory flags: cost and savings"
    echo
    echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($SIMD)," \
         "OpenMP threads: ${OMP_NUM_THREADS:-all}. Model $MODEL, B=4, T=64, fp32; ms/step and tok/s average"
    echo "steps 2..$STEPS. Memory columns are the measured high-water marks of the memory table (MiB), which"
    echo "equal the plan; \"device\" is everything but the host store; with 2 ranks they are rank 0's and tok/s"
    echo "counts both ranks' tokens (B=4 each). Command: \`make bench-flags\`."
    echo
    echo "| flags | command line | ms/step | vs plain | tok/s | recompute FLOPs | weights | gradients | optimizer | activations | host store | device total | peak RSS |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    printf "%s" "$rows"
} | tee "$OUT"
