#!/usr/bin/env bash
# run_tests.sh: runs every test suite of the project and adds up their results.
# Each suite prints "N passed, N failed" as its last such line and exits non-zero on
# failure; a suite that dies without that line counts as one failure.
# The last line of this script's output is the total, in the same form.
set -u
cd "$(dirname "$0")/.."

total_pass=0
total_fail=0

run_suite() {
    local name="$1"; shift
    echo "=== $name: $*"
    local out
    out=$(mktemp)
    "$@" 2>&1 | tee "$out"
    local rc=${PIPESTATUS[0]}
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    rm -f "$out"
    if [ -z "$line" ]; then
        echo "=== $name: no result line (exit code $rc): counted as 1 failure"
        total_fail=$((total_fail + 1))
        return
    fi
    local p f
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
}

run_suite "CPU trainer (test_gpt.c)" ./test_gpt ./train_gpt
run_suite "matmul" ./build/test_matmul
run_suite "CLI and files" bash scripts/test_cli.sh ./train_gpt ./test_gpt
run_suite "data parallel (MPI, --zero)" bash scripts/test_zero.sh ./train_gpt ./test_gpt ./build/train_gpt_nompi
run_suite "memory flags, every combination" bash scripts/test_matrix.sh ./train_gpt ./test_gpt
run_suite "GPT-2 BPE data prep" "${PYTHON:-python3}" dev/data/test_gpt2_bpe.py
if [ -f dev/cuda_emu/run_tests.sh ]; then
    run_suite "emulated CUDA device" bash dev/cuda_emu/run_tests.sh
fi

echo
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
