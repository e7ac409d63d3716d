#!/usr/bin/env bash
# bench_llmc.sh: this trainer's CPU step against llm.c's CPU trainer (train_gpt2.c of karpathy/llm.c),
# same machine, model, data and hyperparameters, in one run: each one's ms/step and the ratio.
#   bash scripts/bench_llmc.sh ~/llm.c        # a checkout of llm.c (train_gpt2.c and llmc/ in it)
#   bash scripts/bench_llmc.sh                # none given: git clone https://github.com/karpathy/llm.c
#   STEPS=8 ROUNDS=2 bash scripts/bench_llmc.sh ~/llm.c
# Both train d12 (GPT-2 124M's shape) from one random init, a model file in llm.c's format written
# by this trainer (one step at learning rate 0 leaves the initial weights as they were), on
# TinyShakespeare's tokens (make data) in file order, B=4, T=64, AdamW at lr 1e-4, betas 0.9 and
# 0.999, eps 1e-8, no weight decay, no clipping: llm.c's main. llm.c is built with our flags
# (-O3 -march=native -fopenmp, and its -DOMP) rather than its Makefile's -Ofast, so the ratio is
# the code's; LLMC_CFLAGS changes that. llm.c's main is changed in a copy only (nothing of llm.c is
# kept here): STEPS steps instead of 40, no validation or sampling, its training batches unshuffled
# (as this trainer reads them), so that the losses compare step by step.
# ms/step averages the steps after the first (warm caches, pages touched); ROUNDS alternates the two
# programs that many times and keeps each one's best round (a shared machine's busy moments count less).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-1}
LLMC_CFLAGS=${LLMC_CFLAGS:--O3 -march=native -fopenmp -DOMP}
LLMC_URL=https://github.com/karpathy/llm.c
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

src=${1:-}
if [ -z "$src" ]; then
    git clone --depth 1 "$LLMC_URL" "$WORK/llm.c" >&2 || {
        echo "error: could not clone $LLMC_URL (no internet?): give a checkout of llm.c as the argument" >&2; exit 1; }
    src="$WORK/llm.c"
fi
if [ ! -f "$src/train_gpt2.c" ] || [ ! -d "$src/llmc" ]; then
    echo "error: $src holds no train_gpt2.c and llmc/ (a checkout of $LLMC_URL is expected)" >&2; exit 1
fi
if [ "$STEPS" -lt 2 ]; then echo "error: STEPS=$STEPS: at least 2 (the first step is not timed)" >&2; exit 1; fi

make -s train_gpt data >&2

# the shared init: d12 in llm.c's format
./train_gpt -e d12 -x 1 -l 0 -u 0 -v 0 -s 0 -o "$WORK/init" > /dev/null
MODEL="$WORK/init/model_00000001.bin"

# llm.c in a build folder of its own, laid out as its main expects (gpt2_124M.bin, dev/data/, the tokenizer)
B="$WORK/llmc_build"
mkdir -p "$B/dev/data"
cp -r "$src/llmc" "$B/"
sed -e "s/step <= 40;/step < $STEPS;/" \
    -e 's/if (step % 10 == 0) {/if (0) { \/\/ bench_llmc.sh: no validation/' \
    -e 's/if (step > 0 \&\& step % 20 == 0) {/if (0) { \/\/ bench_llmc.sh: no sampling/' \
    -e 's/dataloader_init(&train_loader, train_tokens, B, T, 0, 1, 1);/dataloader_init(\&train_loader, train_tokens, B, T, 0, 1, 0);/' \
    "$src/train_gpt2.c" > "$B/train_gpt2.c"
for pattern in "step < $STEPS;" "no validation" "no sampling" "B, T, 0, 1, 0);"; do
    grep -q "$pattern" "$B/train_gpt2.c" || { echo "error: llm.c's main has changed: could not set '$pattern' in its copy ($src/train_gpt2.c)" >&2; exit 1; }
done
ln -s "$MODEL" "$B/gpt2_124M.bin"
ln -s "$REPO/data/tinyshakespeare" "$B/dev/data/tinyshakespeare"
ln -s "$REPO/data/gpt2_tokenizer.bin" "$B/gpt2_tokenizer.bin"
(cd "$B" && ${CC:-cc} $LLMC_CFLAGS train_gpt2.c -o train_gpt2 -lm)

# each program's "step loss ms" lines
run_llmc() { (cd "$B" && ./train_gpt2) | sed -nE 's/^step ([0-9]+): train loss ([0-9.]+) \(took ([0-9.]+) ms\)/\1 \2 \3/p'; }
run_ours() {
    ./train_gpt -e "$MODEL" -b 4 -t 64 -l 1e-4 -u 0 -q 1 -c 0 --beta2 0.999 --eps 1e-8 --grad-clip 0 \
        -x "$STEPS" -v 0 -s 0 -o "" -i data/tinyshakespeare/tiny_shakespeare_train.bin -j "" |
        sed -nE 's/^step +([0-9]+)\/[0-9]+ \| loss ([0-9.]+) .*\| +([0-9.]+) ms \|.*/\1 \2 \3/p'
}
mean_ms() { tail -n +2 | awk '{s += $3; n++} END {printf "%.1f", s / n}'; }
best() { tr ' ' '\n' | grep . | sort -g | head -n 1; }

echo "$(date -u +%Y-%m-%d), $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
     "($(if grep -qw avx512f /proc/cpuinfo; then echo AVX-512; elif grep -qw avx2 /proc/cpuinfo; then echo 'AVX2, no AVX-512'; else echo 'no AVX2'; fi))," \
     "load before: $(cut -d' ' -f1-3 /proc/loadavg); OpenMP threads: ${OMP_NUM_THREADS:-all}"
echo "d12 (124M) from one init, B=4, T=64, $STEPS steps, ms/step over steps 2..$STEPS, best of $ROUNDS round(s)"
echo "llm.c: $(cd "$src" && git log -1 --format='%h %cs' 2>/dev/null || echo 'not a git checkout'), built with: ${CC:-cc} $LLMC_CFLAGS"
llmc_all="" ours_all=""
for round in $(seq "$ROUNDS"); do
    llmc_out=$(run_llmc)
    ours_out=$(run_ours)
    llmc_all="$llmc_all $(echo "$llmc_out" | mean_ms)"
    ours_all="$ours_all $(echo "$ours_out" | mean_ms)"
done
# the losses of the last round, step by step (llm.c counts steps from 0, this trainer from 1)
paste <(echo "$llmc_out") <(echo "$ours_out") | awk '
    {d = $2 - $5; d = d < 0 ? -d : d; if (d > worst) worst = d; printf "  step %d: loss llm.c %s, ours %s\n", $4, $2, $5}
    END {printf "  largest loss difference: %.6f\n", worst}'
llmc_ms=$(echo "$llmc_all" | best)
ours_ms=$(echo "$ours_all" | best)
echo "llm.c train_gpt2.c: $llmc_ms ms/step   (rounds:$llmc_all)"
echo "this train_gpt:     $ours_ms ms/step   (rounds:$ours_all)"
awk -v a="$llmc_ms" -v b="$ours_ms" 'BEGIN {printf "ratio (llm.c / ours): %.2fx\n", a / b}'
