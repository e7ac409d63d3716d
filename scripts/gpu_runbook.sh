#!/usr/bin/env bash
# gpu_runbook.sh: what to run when a GPU is lent (about 30 minutes at a time), in steps ordered by
# what a broken build would waste: a one-minute smoke test first, then the checks that need a GPU
# and nothing else can do, then the long ones. Each step says its expected time on an H100 (16
# cores) when it starts; all of them: about 20 minutes (estimates: no step has run on a GPU yet).
#
#   bash scripts/gpu_runbook.sh smoke           # < 1 min: the build and one training step work
#   bash scripts/gpu_runbook.sh                 # every step below, in order (about 20 minutes)
#   bash scripts/gpu_runbook.sh profile bench   # some steps, in the order given
#   bash scripts/gpu_runbook.sh --dry-run       # the steps, their times and commands; runs nothing
#   RUNS="d12 16 --offload optimizer" bash scripts/gpu_runbook.sh bench   # the benchmark, one run
#   TRAINER=build/emu/train_gpt RUNS="tiny 2 --recompute 1" T=64 STEPS=3 bash scripts/gpu_runbook.sh bench
#   TRAINER=build/emu/train_gpt PROFILE_MODEL="-e tiny -b 2 -t 32" bash scripts/gpu_runbook.sh profile
#                                               # the machinery of the tables, emulated (no GPU needed)
#
# The steps (name: expected minutes on an H100, what it does):
#   smoke        1   make train_gpt_cu, then 1 step of the tiny fixture model in bf16 (test_gpt's fixtures)
#   determinism  1   two identical d6 runs (5 steps, bf16): bitwise-identical model and state files
#   sass         1   cuobjdump -sass of the flash attention kernels: are the wmma tile loads
#                    shared-memory loads (LDS/LDSM) or generic LD?
#   profile      1   --profile of d12 B=16 T=1024 (step 4 of 4) into dev/bench_gpu.md
#   sanitizer    5   compute-sanitizer memcheck, racecheck, synccheck, initcheck over a d6 run (2 steps,
#                    T=100: not a multiple of 64) in bf16 and fp32, and over the dev/cuda kernel tests
#   gpu-check    3   make gpu-check: every CUDA test built for this GPU and run on it
#   trainer      3   tests/test_cuda.py and tests/test_cuda_matrix.py: the CUDA trainer against the CPU's
#   bench        5   tokens/s, MFU and memory of RUNS (below) into dev/bench_gpu.md, with the kernel
#                    tests' timings of gpu-check when it ran
# dev/bench_gpu.md is started afresh (GPU and date) by the first step that writes to it in a run.
#
# Without a GPU (and without TRAINER) it says so and exits 2; --dry-run needs no GPU.
set -u
cd "$(dirname "$0")/.."

ALL_STEPS="smoke determinism sass profile sanitizer gpu-check trainer bench"
declare -A MINUTES=([smoke]=1 [determinism]=1 [sass]=1 [profile]=1 [sanitizer]=5 [gpu-check]=3 [trainer]=3 [bench]=5)
DRY=0
STEPS_ASKED=()
for a in "$@"; do
    case "$a" in
        --dry-run) DRY=1 ;;
        all) STEPS_ASKED+=($ALL_STEPS) ;;
        *) [ -n "${MINUTES[$a]+x}" ] || { echo "unknown step '$a'; the steps: $ALL_STEPS (or all, --dry-run)"; exit 2; }
           STEPS_ASKED+=("$a") ;;
    esac
done
[ ${#STEPS_ASKED[@]} -gt 0 ] || STEPS_ASKED=($ALL_STEPS)

TRAINER=${TRAINER:-./train_gpt_cu}
CUDA_BIN=${CUDA_HOME:-/usr/local/cuda}/bin
SANITIZER=$(command -v compute-sanitizer || echo "$CUDA_BIN/compute-sanitizer")
CUOBJDUMP=$(command -v cuobjdump || echo "$CUDA_BIN/cuobjdump")
# one run a line: model, micro-batch B, flags. The big models accumulate 8 micro-steps a step, so
# that the step's transfers and the CPU's update spread over more compute
DEFAULT_RUNS="d12 8
d12 16
d12 32
d24 16
d12 16 --attention matmul
d12 64
d12 16 --recompute 1,gelu,attn
d12 16 --offload activations
d12 16 --offload optimizer
d12 16 --offload optimizer,gradients
d48 8
d48 8 --recompute 1 --offload optimizer
d84 1 --optimizer adafactor --recompute 1,gelu,attn --offload optimizer -d 8192"
RUNS=${RUNS:-$DEFAULT_RUNS}
T=${T:-1024}
STEPS=${STEPS:-8}                      # the first steps warm up; the table takes the median of the rest
OUT=${OUT:-dev/bench_gpu.md}
PROFILE_MODEL=${PROFILE_MODEL:--e d12 -b 16 -t 1024}   # the profile step's model and batch
DATA=data/tinyshakespeare/tiny_shakespeare_train.bin
WORK=$(mktemp -d)
KERNELS="$WORK/gpu_check.txt"          # make gpu-check's output: its "bench" lines time each kernel on the GPU
trap 'rm -rf "$WORK"' EXIT
FAILED=0
OUT_STARTED=0

# x CMD...: runs CMD (or, with --dry-run, prints it); a failure is counted and named, the runbook goes on.
# The command line goes to fd 3 (the terminal), past a redirect of CMD's output
exec 3>&1
x() {
    echo "   \$ $(printf '%q ' "$@")" >&3
    [ "$DRY" = 1 ] && return 0
    "$@" || { echo "FAIL ($?): $*"; FAILED=$((FAILED + 1)); return 1; }
}

gpu_name() {
    local g
    g=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)
    [ -n "$g" ] || g="emulated device ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
    echo "$g"
}

# the first write of this run starts dev/bench_gpu.md afresh, naming the GPU and the date
start_out() {
    [ "$DRY" = 1 ] && return 0
    [ "$OUT_STARTED" = 1 ] && return 0
    printf '# CUDA trainer on a GPU\n\n%s; %s (scripts/gpu_runbook.sh)\n' "$(gpu_name)" "$(date -u +%Y-%m-%d)" > "$OUT"
    OUT_STARTED=1
}

fixtures() { [ -f "$WORK/fix/model.bin" ] || x ./test_gpt --write-fixtures "$WORK/fix" > /dev/null; }
data() { [ -f "$DATA" ] || x make data; }

step_smoke() {
    x make -j"$(nproc)" train_gpt_cu test_gpt || return 1
    fixtures
    x "$TRAINER" -e "$WORK/fix/model.bin" -i "$WORK/fix/train.bin" -j "" -k "" -b 2 -t 16 -x 1 -v 0 -s 0 -o "" || return 1
    [ "$DRY" = 1 ] || echo "smoke: the build and one step work"
}

step_determinism() {
    data
    local flags=(-e d6 -b 4 -t 256 -x 5 -v 0 -s 0 -k "" --seed 7)
    x "$TRAINER" "${flags[@]}" -o "$WORK/det_a" > "$WORK/det_a.txt" || return 1
    x "$TRAINER" "${flags[@]}" -o "$WORK/det_b" > "$WORK/det_b.txt" || return 1
    [ "$DRY" = 1 ] && return 0
    local f same=1
    for f in "$WORK"/det_a/model_*.bin "$WORK"/det_a/state_*.bin; do
        cmp -s "$f" "$WORK/det_b/$(basename "$f")" || { echo "FAIL determinism: $(basename "$f") differs between two identical runs"; same=0; }
    done
    if [ "$same" = 1 ]; then echo "determinism: two identical d6 runs wrote bitwise the same model and state"; else FAILED=$((FAILED + 1)); fi
}

# per flash kernel: its shared-memory loads (LDSM, LDS), global (LDG) and generic (LD) loads
step_sass() {
    x make -j"$(nproc)" train_gpt_cu || return 1
    echo "   \$ $CUOBJDUMP -sass train_gpt_cu | (per flash kernel: LDSM, LDS, LDG, generic LD)"
    [ "$DRY" = 1 ] && return 0
    "$CUOBJDUMP" -sass train_gpt_cu > "$WORK/sass.txt" || { echo "FAIL cuobjdump"; FAILED=$((FAILED + 1)); return 1; }
    awk '
        /Function :/ { name = $3; flash = name ~ /flash/ }
        flash && /LDSM/ { ldsm[name]++ }
        flash && /[^A-Z]LDS[. ]/ { lds[name]++ }
        flash && /LDG/ { ldg[name]++ }
        flash && /[^A-Z]LD\./ { ld[name]++ }
        flash { seen[name] = 1 }
        END {
            for (n in seen) {
                verdict = ld[n] + 0 > 0 ? "generic LD present: tile loads may not be shared-memory loads" : "tile loads are LDS/LDSM"
                printf "sass %-70s LDSM %4d  LDS %4d  LDG %4d  LD %4d  (%s)\n", n, ldsm[n], lds[n], ldg[n], ld[n], verdict
            }
        }' "$WORK/sass.txt" | sort | tee "$WORK/sass_summary.txt"
    [ -s "$WORK/sass_summary.txt" ] || echo "sass: no flash kernel found in train_gpt_cu"
}

step_profile() {
    data
    # shellcheck disable=SC2086  # the model's flags are words
    x "$TRAINER" $PROFILE_MODEL -x 4 -v 0 -s 0 -k "" --profile 4 -o "$WORK/profile" > "$WORK/profile.txt" || {
        tail -n 5 "$WORK/profile.txt"; return 1; }
    [ "$DRY" = 1 ] && return 0
    start_out
    { printf '\n## Where a step goes (%s, bf16: `--profile 4`)\n\n```\n' "$PROFILE_MODEL"
      sed -n '/^profile of step/,/^  (written/p' "$WORK/profile.txt"
      printf '```\n'; } >> "$OUT"
    sed -n '/^profile of step/,/^by kind/p' "$WORK/profile.txt"
}

step_sanitizer() {
    [ -x "$SANITIZER" ] || [ "$DRY" = 1 ] || { echo "FAIL sanitizer: no compute-sanitizer at $SANITIZER (set CUDA_HOME)"; FAILED=$((FAILED + 1)); return 1; }
    data
    local tool p t
    for p in bf16 fp32; do
        for tool in memcheck racecheck synccheck initcheck; do
            x "$SANITIZER" --tool "$tool" --error-exitcode 1 "$TRAINER" -e d6 -b 2 -t 100 -x 2 -v 0 -s 0 -k "" \
                --precision "$p" -o "" > "$WORK/san_${tool}_$p.txt" 2>&1 || tail -n 20 "$WORK/san_${tool}_$p.txt"
        done
    done
    x make -s -j"$(nproc)" emu-nvcc-check GPU_ARCH="${GPU_ARCH:-sm_90}" > /dev/null || return 1
    for t in build/nvcc/"${GPU_ARCH:-sm_90}"/dev/cuda/test_*; do
        [ -x "$t" ] || [ "$DRY" = 1 ] || continue
        for tool in memcheck racecheck synccheck initcheck; do  # the checks only: no timing at d12's shapes
            x env KERNEL_TEST_NO_BENCH=1 "$SANITIZER" --tool "$tool" --error-exitcode 1 "$t" > "$WORK/san_$(basename "$t")_$tool.txt" 2>&1 ||
                tail -n 20 "$WORK/san_$(basename "$t")_$tool.txt"
        done
    done
}

step_gpu_check() {
    echo "   \$ make gpu-check | tee (the kernel timings)"
    [ "$DRY" = 1 ] && return 0
    make gpu-check 2>&1 | tee "$KERNELS"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL make gpu-check"; FAILED=$((FAILED + 1)); }
}

step_trainer() {
    x make -j"$(nproc)" train_gpt test_gpt train_gpt_cu || return 1
    x python3 tests/test_cuda.py ./train_gpt_cu ./train_gpt ./test_gpt
    x python3 tests/test_cuda_matrix.py ./train_gpt_cu ./train_gpt ./test_gpt
}

step_bench() {
    data
    local n=0 model B flags dir
    while read -r model B flags; do
        [ -n "$model" ] || continue
        n=$((n + 1))
        dir="$WORK/run$(printf %02d $n)"
        mkdir -p "$dir"
        printf '%s\n%s\n%s\n' "$model" "$B" "$flags" > "$dir/spec"
        # shellcheck disable=SC2086  # the flags are words
        x "$TRAINER" -e "$model" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -n 0 -k "" $flags -o "$dir/out" > "$dir/stdout" 2>&1 ||
            { tail -n 3 "$dir/stdout"; continue; }
        grep -E '^step +[0-9]+/' "$dir/stdout" | tail -n 1
    done <<< "$RUNS"
    [ "$DRY" = 1 ] && return 0
    start_out
    touch "$KERNELS"
    python3 - "$WORK" "$OUT" "$T" "$KERNELS" <<'PY'
import glob, json, os, statistics, sys
work, out, T, kernels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = []
for d in sorted(glob.glob(os.path.join(work, "run*"))):
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
with open(out, "a") as f:
    f.write(f"\n## Benchmark\n\nT={T}, bf16, AdamW unless the flags say, TinyShakespeare; tokens/s and MFU are medians "
            "over the steps after the first two; memory is the accounted high-water mark (the memory table's device "
            "and host totals).\n\n")
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
}

if [ "$DRY" = 0 ] && [ "$TRAINER" = ./train_gpt_cu ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU here (nvidia-smi finds none): this runbook is for a machine with one"
    echo "  (--dry-run lists the steps; TRAINER=build/emu/train_gpt runs the benchmark's machinery emulated)"
    exit 2
fi
total=0
for s in "${STEPS_ASKED[@]}"; do total=$((total + MINUTES[$s])); done
echo "gpu_runbook: ${STEPS_ASKED[*]}: about $total minutes on an H100$([ "$DRY" = 1 ] && echo ' (dry run: nothing runs)')"
start=$SECONDS
for s in "${STEPS_ASKED[@]}"; do
    echo "== step $s: expected about ${MINUTES[$s]} min (started at $(( (SECONDS - start) / 60 )) min)"
    "step_${s//-/_}"
done
echo "gpu_runbook: done in $(( (SECONDS - start) / 60 )) min; $FAILED failure(s)"
[ "$FAILED" = 0 ]
