# test_lib.sh: the helpers of the end-to-end test scripts (test_cli.sh, test_zero.sh,
# test_matrix.sh), sourced after the caller has set TESTER (test_gpt) and RUN_LIMIT
# (seconds for any one run). begin_suite makes the scratch directory W (removed at exit),
# FIX (test_gpt's fixtures: tiny model, shards, tokenizer), LOG (outside the snapshot, for
# run logs) and OUT, ERR (stdout and stderr of the last run); end_suite prints the time
# and the "N passed, N failed" line and sets the exit status.
#
# An error check (expect_fail) passes when the run exits non-zero by itself (not
# killed by a signal or the time limit), stderr holds the expected phrase and the
# file:line that utils.h's fail() adds, no *.tmp file is left anywhere, and every file
# that existed before the run is byte-identical after it.

npass=0
nfail=0
start_seconds=$(date +%s.%N)
pass() { echo "ok   $1"; npass=$((npass + 1)); }
failed() { echo "FAIL $1: $2"; nfail=$((nfail + 1)); }

# check NAME DETAIL -- CMD...: passes if CMD succeeds, else prints DETAIL
check() {
    local name="$1" detail="$2"; shift 3
    if "$@"; then pass "$name"; else failed "$name" "$detail"; fi
}

# runs CMD... under the time limit, stdout to $OUT, stderr to $ERR; sets rc
rc=0
run() {
    timeout "$RUN_LIMIT" "$@" >"$OUT" 2>"$ERR"
    rc=$?
}

# a checksum line for every file under $W except the run logs. log.jsonl is left out:
# a fresh run starts its log anew (a failed one too), a resumed run appends to it
snapshot() {
    find "$W" -type f ! -path "$LOG/*" ! -name log.jsonl -print0 | sort -z | xargs -0 -r cksum
}

# leftovers of an atomic write that did not finish
tmp_files() { find "$W" -name '*.tmp' ! -path "$LOG/*"; }

# expect_fail NAME PHRASE -- CMD...: CMD must fail cleanly, saying PHRASE (see the top)
expect_fail() {
    local name="$1" phrase="$2"; shift 3
    local before
    before=$(snapshot)
    run "$@"
    local changed leftover
    changed=$(comm -23 <(echo "$before") <(snapshot) | awk '{print $3}')
    leftover=$(tmp_files)
    if [ "$rc" -eq 0 ]; then failed "$name" "exit code 0, expected an error"
    elif [ "$rc" -ge 124 ]; then failed "$name" "exit code $rc: timed out or killed by a signal (crash?)"
    elif ! grep -qF -- "$phrase" "$ERR"; then failed "$name" "stderr lacks '$phrase': $(head -c 300 "$ERR")"
    elif ! grep -qE '\(at [^ ]+:[0-9]+\)' "$ERR"; then failed "$name" "stderr lacks the (at file:line) of fail()"
    elif [ -n "$leftover" ]; then failed "$name" "left temporary files: $leftover"
    elif [ -n "$changed" ]; then failed "$name" "changed or removed existing files: $changed"
    else pass "$name"; fi
}

# expect_ok NAME -- CMD...: CMD must exit 0 and leave no *.tmp; returns 1 otherwise
expect_ok() {
    local name="$1"; shift 2
    run "$@"
    local leftover
    leftover=$(tmp_files)
    if [ "$rc" -ne 0 ]; then failed "$name" "exit code $rc: $(head -c 300 "$ERR")"; return 1; fi
    if [ -n "$leftover" ]; then failed "$name" "left temporary files: $leftover"; return 1; fi
    pass "$name"
}

# lines of stdout that report a training step ("step    3/6 | loss ...")
step_lines() { grep -E '^step +[0-9]+/[0-9]+ ' "$1"; }

# "step, loss, grad_norm, lr" of log.jsonl's training lines for steps FROM..TO
log_losses() {
    grep '"loss"' "$1" | sed -E 's/, "ms".*//' |
        awk -v a="$2" -v b="$3" '{ s = $2; sub(",", "", s); if (s + 0 >= a && s + 0 <= b) print }'
}

# the newest DONE_ marker's step in a directory, or -1
latest_done() {
    local f best=-1 n
    for f in "$1"/DONE_*; do
        [ -e "$f" ] || continue
        n=$((10#${f##*DONE_}))
        [ "$n" -gt "$best" ] && best=$n
    done
    echo "$best"
}

# the memory table after the first step: every row's measured MiB equals the planned
plan_equals_measured() {
    awk -F'|' '/^\| (parameters|gradients|optimizer state|activations|activation grads|scratch|offloaded \(host\)|device total|host total|total) /{
        p=$3; m=$4; gsub(/ /, "", p); gsub(/ /, "", m); if (m ~ /MiB/) { n++; if (p != m) bad=1 } } END{exit !(n >= 10 && !bad)}' "$1"
}

ckpt() { printf "%s/%s_%08d%s" "$1" "$2" "$3" "${4:-}"; }  # ckpt DIR model|state|DONE STEP SUFFIX

# signal_check SIG DIR STEPS CMD...: runs CMD -o DIR (STEPS steps) in the background and
# sends SIG to it after its first step line; the run must finish its step, write a complete
# checkpoint, say so and exit 0, and CMD -o DIR -y 1 must then resume there and run to the end
signal_check() {
    local sig="$1" dir="$2" steps="$3" pid waited=0
    shift 3
    : >"$OUT"  # empty now: the poll below must not see the last run's step lines
    "$@" -o "$dir" >"$OUT" 2>"$ERR" &
    pid=$!
    while ! step_lines "$OUT" >/dev/null && kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 400 ]; do
        sleep 0.05; waited=$((waited + 1))
    done
    kill -s "$sig" "$pid" 2>/dev/null
    waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 400 ]; do sleep 0.05; waited=$((waited + 1)); done
    kill -s KILL "$pid" 2>/dev/null  # only if it hung: the check then fails on its exit code
    wait "$pid"
    rc=$?
    local n
    n=$(latest_done "$dir")
    if [ "$rc" -ne 0 ]; then failed "signal: $sig exits 0" "exit code $rc: $(head -c 300 "$ERR")"; return; fi
    pass "signal: $sig exits 0"
    check "signal: $sig says 'stopped by signal'" "no such line" -- grep -q "stopped by signal after step $n;" "$OUT"
    if [ "$n" -le 0 ] || [ "$n" -ge "$steps" ]; then
        failed "signal: $sig leaves a complete checkpoint mid-run" "latest DONE step $n (want 0 < n < $steps)"; return
    fi
    check "signal: $sig leaves a complete checkpoint mid-run" "step $n lacks model or state file" -- \
        test -f "$(ckpt "$dir" model "$n" .bin)" -a -f "$(ckpt "$dir" state "$n" _00000.bin)" -a -z "$(tmp_files)"
    if expect_ok "signal: $sig then -y 1 runs to the end" -- "$@" -o "$dir" -y 1; then
        check "signal: $sig resume starts at step $n" "no 'resumed from ... at step $n'" -- grep -q "resumed from .* at step $n$" "$OUT"
        check "signal: $sig resume ends with checkpoint $steps" "no DONE marker of step $steps" -- test -f "$(ckpt "$dir" DONE "$steps")"
    fi
}

# begin_suite NAME: the scratch directory and the fixtures (see the top)
begin_suite() {
    W=$(mktemp -d "/tmp/$1_XXXXXX")
    trap 'rm -rf "$W"' EXIT
    FIX="$W/fixtures"
    LOG="$W/logs"
    mkdir -p "$LOG"
    OUT="$LOG/stdout"
    ERR="$LOG/stderr"
    if ! "$TESTER" --write-fixtures "$FIX" >/dev/null; then
        failed "fixtures" "$TESTER --write-fixtures $FIX failed"
        end_suite
    fi
    pass "fixtures: written by test_gpt --write-fixtures"
}

# end_suite: the time taken and the result line; exits 1 if any check failed
end_suite() {
    echo "($(awk -v a="$start_seconds" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
    echo "$npass passed, $nfail failed"
    [ "$nfail" -eq 0 ] && exit 0
    exit 1
}
