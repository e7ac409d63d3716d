# run_lib.sh: what dev/cuda_emu/run_tests.sh and gpu_check.sh share (sourced, not run): run a test
# program and count its "N passed, N failed" line, expect a program to stop with a message, and
# mpirun for 2 ranks. Both scripts end with: echo "$passed passed, $failed failed".

passed=0
failed=0
# RUN_TIMEOUT_S: when set, `run` stops a program after that many seconds (it then counts as failed)
RUN_TIMEOUT=()
[ -n "${RUN_TIMEOUT_S:-}" ] && RUN_TIMEOUT=(timeout "$RUN_TIMEOUT_S")

# run one test program: run LABEL ENV... -- COMMAND...; its output is shown, its summary counted
run() {
    local label=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    echo "== $label"
    local out
    out=$(env "${envs[@]}" "${RUN_TIMEOUT[@]}" "$@" 2>&1)
    local status=$?
    echo "$out"
    local summary
    summary=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
    if [ -z "$summary" ]; then
        echo "FAIL $label: stopped (exit $status) without a summary line"
        failed=$((failed + 1))
        return
    fi
    passed=$((passed + $(echo "$summary" | cut -d' ' -f1)))
    failed=$((failed + $(echo "$summary" | cut -d' ' -f3)))
    if [ "$status" -ne 0 ] && [ "$(echo "$summary" | cut -d' ' -f3)" -eq 0 ]; then
        echo "FAIL $label: exit $status with no failed check"
        failed=$((failed + 1))
    fi
}

# a program that must stop with an error whose message contains PATTERN: expect_error LABEL PATTERN COMMAND...
expect_error() {
    local label=$1 pattern=$2; shift 2
    echo "== $label"
    local out
    out=$("$@" 2>&1)
    local status=$?
    if [ "$status" -ne 0 ] && echo "$out" | grep -q "$pattern"; then
        echo "ok   $label"
        passed=$((passed + 1))
    else
        echo "$out"
        echo "FAIL $label: exit $status, message without '$pattern'"
        failed=$((failed + 1))
    fi
}

# mpirun -np 2 (and 3) on this host, as this user may run it (root needs --allow-run-as-root)
MPIRUN_NP2=(mpirun --oversubscribe -np 2)
[ "$(id -u)" -eq 0 ] && MPIRUN_NP2=(mpirun --allow-run-as-root --oversubscribe -np 2)
MPIRUN_NP3=("${MPIRUN_NP2[@]:0:${#MPIRUN_NP2[@]}-1}" 3)  # the same launcher, 3 ranks
