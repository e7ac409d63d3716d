#!/usr/bin/env bash
# test_matrix.sh: every combination of the memory flags on the tiny fixture model, and the
# invariants the flags promise:
#   - each optimizer (adamw, adafactor, adafactor + beta1, came) with each activation policy
#     (--recompute 1, gelu,attn, --offload 1, all three together) trains to the bitwise same
#     model as the same optimizer without it, on 1 rank and on 2 ranks with --zero 0 and 1;
#   - the measured memory table equals the plan in every run.
# (N ranks against 1 rank, replicas and resume of sharded state: scripts/test_zero.sh.)
#
#   bash scripts/test_matrix.sh ./train_gpt ./test_gpt
#
# Prints "ok   name" or "FAIL name: detail" per check and, last, "N passed, N failed".
set -u

if [ $# -ne 2 ]; then echo "usage: $0 ./train_gpt ./test_gpt" >&2; exit 2; fi
TRAIN=$(readlink -f "$1")
TESTER=$(readlink -f "$2")

export OMP_NUM_THREADS=1  # tiny model: one thread per rank (see test_cli.sh)
RUN_LIMIT=60
STEPS=4

. "$(dirname "$0")/test_lib.sh"
begin_suite test_matrix

# 4 steps of 64 tokens: two micro-batches of B*T = 32 on one rank, one on each of two
BASE=(-e "$FIX/model.bin" -i "$FIX/train.bin" -j "" -k "" -b 2 -t 16 -d 64 -x "$STEPS" -u 1 -v 0 -s 0 -n 0)
OPTIMIZERS=("adamw" "adafactor" "adafactor --adafactor-beta1 0.9" "came")
POLICIES=("--recompute 1" "--recompute gelu,attn" "--offload 1" "--recompute 1,gelu,attn --offload 1")
LAUNCHES=("1 rank|")
if command -v mpirun >/dev/null && ldd "$TRAIN" | grep -q libmpi; then
    LAUNCHES+=("2 ranks --zero 0|mpirun --oversubscribe --allow-run-as-root -np 2" "2 ranks --zero 1|mpirun --oversubscribe --allow-run-as-root -np 2")
else
    echo "note: no mpirun, or $TRAIN is built without MPI: the 2-rank part of the matrix is skipped"
fi

# trains into DIR with the launcher and flags; checks the run and its memory table
train() {
    local name="$1" dir="$2" launcher="$3"; shift 3
    # shellcheck disable=SC2086
    expect_ok "$name" -- $launcher "$TRAIN" "${BASE[@]}" "$@" -o "$dir" || return 1
    check "$name: measured memory equals the plan" "table rows differ" -- plan_equals_measured "$OUT"
}

for launch in "${LAUNCHES[@]}"; do
    lname="${launch%%|*}"
    launcher="${launch#*|}"
    zero=()
    case "$lname" in *"--zero 1"*) zero=(--zero 1) ;; *"--zero 0"*) zero=(--zero 0) ;; esac
    for opt in "${OPTIMIZERS[@]}"; do
        ref="$W/ref_${lname// /_}_${opt// /_}"
        # shellcheck disable=SC2086
        train "$lname, $opt" "$ref" "$launcher" --optimizer $opt "${zero[@]}" || continue
        for pol in "${POLICIES[@]}"; do
            d="$W/run_${lname// /_}_${opt// /_}_${pol//[ ,-]/_}"
            # shellcheck disable=SC2086
            train "$lname, $opt, $pol" "$d" "$launcher" --optimizer $opt "${zero[@]}" $pol || continue
            check "$lname, $opt, $pol: model bitwise equal to the run without it" "cmp differs" -- \
                cmp -s "$(ckpt "$ref" model "$STEPS" .bin)" "$(ckpt "$d" model "$STEPS" .bin)"
        done
    done
done

end_suite
