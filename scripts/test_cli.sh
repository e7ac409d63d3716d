#!/usr/bin/env bash
# test_cli.sh: end-to-end tests of the train_gpt binary: flags, impossible shapes, bad
# files, the output directory, a non-finite loss, checkpoints and bitwise resume,
# SIGINT/SIGTERM, the progress output and --plan.
#
#   bash scripts/test_cli.sh ./train_gpt ./test_gpt
#
# Every run uses the tiny fixture model that `test_gpt --write-fixtures DIR` writes
# (L=2 C=32 NH=4 maxT=32 V=64, its shards and tokenizer), so each takes well under a
# second. Prints "ok   name" or "FAIL name: detail" per check and, last, "N passed,
# N failed"; exits 1 if any check failed.
#
# The helpers (what an error check demands, for one) are in scripts/test_lib.sh.
set -u

if [ $# -ne 2 ]; then echo "usage: $0 ./train_gpt ./test_gpt" >&2; exit 2; fi
TRAIN=$(readlink -f "$1")
TESTER=$(readlink -f "$2")
FLAGS_H="$(dirname "$0")/../llmc/flags.h"  # the flag table that -h must list

# the fixture model is tiny: one thread is fastest, and on a busy machine two OpenMP
# threads that wait for each other make a step ten times slower
export OMP_NUM_THREADS=1

RUN_LIMIT=30  # seconds for any one run; no check can hang
. "$(dirname "$0")/test_lib.sh"  # pass, failed, check, run, expect_fail, expect_ok, step_lines, log_losses, latest_done, ckpt
begin_suite test_cli

# the base run: 6 steps of B=2 T=16, validation every 3 steps, no samples. Later flags
# override earlier ones, so a check appends the one flag it changes.
BASE=(-e "$FIX/model.bin" -i "$FIX/train.bin" -j "$FIX/val.bin" -k "$FIX/tokenizer.bin"
      -b 2 -t 16 -x 6 -v 3 -m 2 -s 0 -o "$W/out_err")

# ----------------------------------------------------------------------------
# 1. flags: the parser rejects what it cannot read, and -h lists the table

expect_fail "flags: unknown flag"         "unknown flag '--bogus'" -- "$TRAIN" "${BASE[@]}" --bogus 1
expect_fail "flags: flag without a value" "flag -b needs a value"  -- "$TRAIN" "${BASE[@]}" -b
expect_fail "flags: malformed integer"    "'2x' is not an integer" -- "$TRAIN" "${BASE[@]}" -b 2x
expect_fail "flags: malformed float"      "'abc' is not a number"  -- "$TRAIN" "${BASE[@]}" -l abc
expect_fail "flags: float out of range"   "'1e39' is not a number" -- "$TRAIN" "${BASE[@]}" -l 1e39

if expect_ok "flags: -h exits 0" -- "$TRAIN" -h; then
    # every row of the FLAGS table in llmc/flags.h: {"-x", "--steps", ... or {NULL, "--beta1", ...
    missing=""
    rows=0
    while read -r short long; do
        rows=$((rows + 1))
        if [ "$short" != NULL ] && ! grep -qE -- "^ +$short +$long " "$OUT"; then missing="$missing $short"; fi
        if ! grep -qE -- " $long " "$OUT"; then missing="$missing $long"; fi
    done < <(sed -nE 's/^ *\{(NULL|"(-[a-z])"), *"(--[a-z0-9-]+)",.*/\2 \3/p' "$FLAGS_H" | sed -E 's/^ /NULL /')
    if [ "$rows" -lt 10 ]; then failed "flags: -h lists every flag of the table" "read only $rows rows from $FLAGS_H"
    elif [ -n "$missing" ]; then failed "flags: -h lists every flag of the table" "missing:$missing"
    else pass "flags: -h lists every flag of the table ($rows)"; fi
    check "flags: -h trains nothing" "step lines in -h output" -- test -z "$(step_lines "$OUT")"
fi

if expect_ok "flags: --name=value form" -- "$TRAIN" "${BASE[@]}" --steps=2 --out= ; then
    check "flags: --steps=2 runs 2 steps" "last step line: $(step_lines "$OUT" | tail -n 1)" -- \
        grep -qE '^step +2/2 ' "$OUT"
fi

# ----------------------------------------------------------------------------
# 2. impossible shapes: stopped before anything is allocated or trained

expect_fail "shapes: C not divisible by NH" "is not divisible by heads NH=5" -- "$TRAIN" "${BASE[@]}" -e "$FIX/model_badheads.bin"
expect_fail "shapes: -t longer than maxT"   "-t 33 is longer than the model's context maxT=32" -- "$TRAIN" "${BASE[@]}" -t 33
expect_fail "shapes: -d not a multiple of B*T" "must be a positive multiple of B*T = 32" -- "$TRAIN" "${BASE[@]}" -d 48
expect_fail "shapes: -b 0"                  "the batch size must be >= 1" -- "$TRAIN" "${BASE[@]}" -b 0
expect_fail "shapes: -x 0"                  "the number of steps must be >= 1" -- "$TRAIN" "${BASE[@]}" -x 0

# ----------------------------------------------------------------------------
# 3. files: missing, foreign, truncated or inconsistent model, shard and tokenizer files

expect_fail "files: missing model file" "is neither a preset" -- "$TRAIN" "${BASE[@]}" -e "$FIX/no_such_model.bin"
expect_fail "files: preset name typo -e d7" "-e 'd7' is neither a preset" -- "$TRAIN" "${BASE[@]}" -e d7
expect_fail "files: model bad magic"   "is not a model file (magic 12345" -- "$TRAIN" "${BASE[@]}" -e "$FIX/model_badmagic.bin"
expect_fail "files: model bad version" "has version 4" -- "$TRAIN" "${BASE[@]}" -e "$FIX/model_badversion.bin"
expect_fail "files: model truncated"   "truncated or corrupt" -- "$TRAIN" "${BASE[@]}" -e "$FIX/model_truncated.bin"
expect_fail "files: no train shard matches" "no token shards match '$FIX/nothing_*.bin'" -- "$TRAIN" "${BASE[@]}" -i "$FIX/nothing_*.bin"
expect_fail "files: no val shard matches"   "no token shards match '$FIX/nothing_*.bin'" -- "$TRAIN" "${BASE[@]}" -j "$FIX/nothing_*.bin"
expect_fail "files: shard bad magic"   "is not a token shard (magic 1" -- "$TRAIN" "${BASE[@]}" -i "$FIX/shard_badmagic.bin"
expect_fail "files: shard bad version" "has version 7, want 1" -- "$TRAIN" "${BASE[@]}" -i "$FIX/shard_badversion.bin"
expect_fail "files: shard header count != size" "but its header says 4101 tokens" -- "$TRAIN" "${BASE[@]}" -i "$FIX/shard_badcount.bin"
expect_fail "files: shard too small for one batch" "has 10 tokens, fewer than one step needs (33" -- "$TRAIN" "${BASE[@]}" -i "$FIX/shard_small.bin"
# the bad token sits at position 100, in the 4th batch of 32 tokens: found during training
expect_fail "files: token >= V names token and shard" "shard_bigtoken.bin': token 64 at position 100" -- \
    "$TRAIN" "${BASE[@]}" -i "$FIX/shard_bigtoken.bin"
expect_fail "files: tokenizer is not a tokenizer" "is not a tokenizer file" -- "$TRAIN" "${BASE[@]}" -k "$FIX/train.bin"
# a missing tokenizer only turns decoding off (samples print ids)
if expect_ok "files: missing tokenizer is not an error" -- "$TRAIN" "${BASE[@]}" -k "$FIX/no_tokenizer.bin" -s 3 -o ""; then
    check "files: missing tokenizer says so" "no 'note: no tokenizer' line" -- grep -q "note: no tokenizer" "$OUT"
fi

# ----------------------------------------------------------------------------
# 4. the output directory: checked before any training (root ignores chmod, so the
# unwritable path is one whose parent is a regular file)

expect_fail "output: -o under a regular file" "cannot create output directory" -- "$TRAIN" "${BASE[@]}" -o "$FIX/train.bin/out"
check "output: -o under a regular file fails before training" "step lines printed: $(step_lines "$OUT" | head -n 1)" -- test -z "$(step_lines "$OUT")"
expect_fail "output: -o is a regular file" "exists and is not a directory" -- "$TRAIN" "${BASE[@]}" -o "$FIX/val.bin"
check "output: -o a regular file fails before training" "step lines printed: $(step_lines "$OUT" | head -n 1)" -- test -z "$(step_lines "$OUT")"

# ----------------------------------------------------------------------------
# 5. a non-finite loss stops the run; checkpoints already in the directory stay intact.
# A good run writes checkpoints 1 and 2 into NAN; the same flags with -l 1e30 and no
# periodic checkpoints would overwrite checkpoint 2 at its end, but the huge first update
# makes step 2's loss NaN, so the run must stop before that.

NAN="$W/nan"
if expect_ok "nan: first run writes checkpoints 1 and 2" -- "$TRAIN" "${BASE[@]}" -x 2 -n 1 -o "$NAN"; then
    mkdir -p "$W/nan_before"
    cp "$NAN"/* "$W/nan_before/"
    expect_fail "nan: -l 1e30 stops with 'not finite'" "is not finite at step 2" -- \
        "$TRAIN" "${BASE[@]}" -x 2 -n 0 -l 1e30 -o "$NAN"
    same=1
    for f in "$W/nan_before"/*; do
        case "$f" in *log.jsonl) continue ;; esac
        cmp -s "$f" "$NAN/$(basename "$f")" || same=0
    done
    check "nan: earlier checkpoints byte-identical (cmp)" "a checkpoint file changed" -- test "$same" -eq 1
    check "nan: no new checkpoint files" "files now: $(ls "$NAN" | tr '\n' ' ')" -- \
        test "$(ls -I log.jsonl "$NAN")" = "$(ls -I log.jsonl "$W/nan_before")"
fi

# ----------------------------------------------------------------------------
# 6. checkpoint and bitwise resume. Run A: 6 steps, checkpoints at 3 and 6, warmup 2
# so the cosine schedule (which depends on -x) is in play, a sample every 3 steps (the
# sampling RNG is part of the state). Run B: a fresh directory holding only A's
# checkpoint 3, the same flags and -y 1. Steps 4..6 must repeat A's exactly.

RES=("${BASE[@]}" -u 2 -s 3 -n 3)
A="$W/run_a"
B="$W/run_b"
if expect_ok "resume: run A (-x 6 -n 3)" -- "$TRAIN" "${RES[@]}" -o "$A"; then
    cp "$OUT" "$LOG/a.stdout"
    have=1
    for f in "$(ckpt "$A" DONE 3)" "$(ckpt "$A" DONE 6)" "$(ckpt "$A" model 3 .bin)" "$(ckpt "$A" model 6 .bin)" \
             "$(ckpt "$A" state 3 _00000.bin)" "$(ckpt "$A" state 6 _00000.bin)"; do
        [ -f "$f" ] || { have=0; failed "resume: run A wrote checkpoints 3 and 6" "missing $f"; }
    done
    [ "$have" -eq 1 ] && pass "resume: run A wrote checkpoints 3 and 6"

    mkdir -p "$B"
    cp "$(ckpt "$A" model 3 .bin)" "$(ckpt "$A" state 3 _00000.bin)" "$(ckpt "$A" DONE 3)" "$B/"
    if expect_ok "resume: run B (-y 1 from A's step 3)" -- "$TRAIN" "${RES[@]}" -o "$B" -y 1; then
        cp "$OUT" "$LOG/b.stdout"
        check "resume: B says it resumed at step 3" "no 'resumed from ... at step 3'" -- grep -q "resumed from .* at step 3$" "$OUT"
        check "resume: B trains steps 4..6 only" "step lines: $(step_lines "$OUT" | cut -c1-12 | tr '\n' ' ')" -- \
            test "$(step_lines "$OUT" | awk '{print $2}' | tr '\n' ' ')" = "4/6 5/6 6/6 "
        check "resume: model_00000006.bin bitwise equal" "cmp differs" -- \
            cmp -s "$(ckpt "$A" model 6 .bin)" "$(ckpt "$B" model 6 .bin)"
        check "resume: state_00000006_00000.bin bitwise equal" "cmp differs (optimizer state, data position or RNG)" -- \
            cmp -s "$(ckpt "$A" state 6 _00000.bin)" "$(ckpt "$B" state 6 _00000.bin)"
        la=$(log_losses "$A/log.jsonl" 4 6)
        lb=$(log_losses "$B/log.jsonl" 4 6)
        check "resume: loss, norm, lr of steps 4..6 equal in both logs" "A: $la | B: $lb" -- \
            test -n "$la" -a "$(echo "$la" | wc -l)" -eq 3 -a "$la" = "$lb"
        sa=$(grep -A1 -- '---- sample at step 6' "$LOG/a.stdout")
        sb=$(grep -A1 -- '---- sample at step 6' "$LOG/b.stdout")
        check "resume: the sample at step 6 is the same" "A: $sa | B: $sb" -- test -n "$sa" -a "$sa" = "$sb"
    fi
fi

# ----------------------------------------------------------------------------
# 7. resume skips a checkpoint without its DONE marker (a crash while writing it)

C="$W/run_c"
mkdir -p "$C"
cp "$A"/*_0000000[36]* "$C/" 2>/dev/null
rm -f "$(ckpt "$C" DONE 6)"
if expect_ok "resume: checkpoint 6 without DONE marker" -- "$TRAIN" "${RES[@]}" -o "$C" -y 1; then
    check "resume: ... picks the complete checkpoint 3" "no 'resumed from ... at step 3'" -- grep -q "resumed from .* at step 3$" "$OUT"
    check "resume: ... and ends bitwise equal to run A" "model_00000006.bin differs" -- \
        cmp -s "$(ckpt "$A" model 6 .bin)" "$(ckpt "$C" model 6 .bin)"
fi
E="$W/run_e"
mkdir -p "$E"
cp "$A"/model_* "$A"/state_* "$E/"
expect_fail "resume: no DONE marker at all" "no complete checkpoint (DONE_* marker)" -- "$TRAIN" "${RES[@]}" -o "$E" -y 1
expect_fail "resume: -y 1 without -o" "-y 1 needs the output directory" -- "$TRAIN" "${RES[@]}" -o "" -y 1
expect_fail "resume: checkpoint of another model shape" "has another model shape than -e" -- \
    "$TRAIN" "${RES[@]}" -e tiny -o "$A" -y 1
F="$W/run_f"
mkdir -p "$F"
cp "$A"/*_00000006* "$F/"
head -c 5000 "$(ckpt "$A" state 6 _00000.bin)" >"$(ckpt "$F" state 6 _00000.bin)"
expect_fail "resume: truncated state file" "truncated or corrupt" -- "$TRAIN" "${RES[@]}" -o "$F" -y 1

# ----------------------------------------------------------------------------
# 8. SIGINT and SIGTERM: the run finishes its step, writes a checkpoint, says so and
# exits 0; -y 1 with the same flags then runs to the end. Steps are made slow enough
# to catch (32 micro-batches each, about 10 ms); 100 steps take about a second.

SIGRUN=("${BASE[@]}" -d 1024 -x 100 -n 0 -v 0)

signal_check INT "$W/sig_INT" 100 "$TRAIN" "${SIGRUN[@]}"
signal_check TERM "$W/sig_TERM" 100 "$TRAIN" "${SIGRUN[@]}"
# determinism: wherever the two runs stopped, their ends must be the same bits
check "signal: INT and TERM runs end bitwise equal" "model_00000100.bin differs" -- \
    cmp -s "$(ckpt "$W/sig_INT" model 100 .bin)" "$(ckpt "$W/sig_TERM" model 100 .bin)"

# ----------------------------------------------------------------------------
# 9. progress output: step lines on stdout, one JSON object per line in OUT/log.jsonl

STEP_RE='^step +[0-9]+/[0-9]+ \| loss [0-9.]+ \| norm +[0-9.]+ \| lr [0-9.]+e[-+][0-9]+ \| +[0-9.]+ ms \| +[0-9]+ tok/s'
nlines=$(step_lines "$LOG/a.stdout" 2>/dev/null | wc -l)
ngood=$(grep -cE "$STEP_RE" "$LOG/a.stdout" 2>/dev/null)
check "progress: 6 step lines with loss, norm, lr, ms, tok/s" "$ngood of $nlines lines match; first: $(step_lines "$LOG/a.stdout" | head -n 1)" -- \
    test "$nlines" -eq 6 -a "${ngood:-0}" -eq 6
if command -v python3 >/dev/null; then
    check "progress: log.jsonl is one JSON object a line, steps 1..6 with step, loss, grad_norm, lr" \
        "$(python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$A/log.jsonl" 2>&1 | tail -n 1)" -- \
        python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if "loss" in r]
assert all(isinstance(r, dict) for r in rows)
assert all({"step", "loss", "grad_norm", "lr"} <= r.keys() for r in train)
assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
assert all("val_loss" in r or "memory" in r for r in rows if "loss" not in r)
' "$A/log.jsonl"
else
    check "progress: log.jsonl lines carry step, loss, grad_norm, lr (no python3: grep)" "$(head -n 2 "$A/log.jsonl")" -- \
        test "$(grep -cE '^\{"step": [0-9]+, "loss": [0-9.]+, "grad_norm": [0-9.]+, "lr": [0-9.e+-]+.*\}$' "$A/log.jsonl")" -eq 6
fi

# ----------------------------------------------------------------------------
# 10. --plan: the memory table, at once, for any model, without data files or training

if expect_ok "plan: --plan -e d48 exits 0 without data" -- "$TRAIN" --plan -e d48 -b 8 -t 1024 -i /nonexistent -j /nonexistent -o "$W/plan_out"; then
    check "plan: prints the memory table" "$(head -n 3 "$OUT")" -- grep -qE '^\| total +\| +[0-9.]+ MiB' "$OUT"
    check "plan: trains nothing, writes nothing" "step lines or $W/plan_out created" -- \
        test -z "$(step_lines "$OUT")" -a ! -e "$W/plan_out"
fi
expect_fail "plan: still checks the shapes" "-t 33 is longer than the model's context" -- "$TRAIN" --plan "${BASE[@]}" -t 33

# ----------------------------------------------------------------------------
# 11. optimizers: Adafactor (with and without its first moment) and CAME train, checkpoint
# their own state and resume bitwise; the memory table after the first step agrees with
# the plan; an unknown name is refused. (Their numbers are checked against the PyTorch
# packages in test_gpt.c; the fixture data is random, so no loss is expected to fall here.)

for opt in "adafactor" "adafactor --adafactor-beta1 0.9" "came"; do
    name="optimizer ${opt%% *}$( [ "$opt" != "${opt%% *}" ] && echo ' + beta1')"
    OA="$W/opt_a_${opt// /_}"
    OB="$W/opt_b_${opt// /_}"
    # shellcheck disable=SC2086
    if expect_ok "$name: 6 steps with checkpoints at 3 and 6" -- "$TRAIN" "${RES[@]}" --optimizer $opt -o "$OA"; then
        cp "$OUT" "$W/opt.stdout"  # check() runs its command through run(), which rewrites $OUT
        check "$name: measured memory equals the plan" "table rows differ" -- plan_equals_measured "$W/opt.stdout"
        mkdir -p "$OB"
        cp "$(ckpt "$OA" model 3 .bin)" "$(ckpt "$OA" state 3 _00000.bin)" "$(ckpt "$OA" DONE 3)" "$OB/"
        # shellcheck disable=SC2086
        if expect_ok "$name: resume from step 3" -- "$TRAIN" "${RES[@]}" --optimizer $opt -o "$OB" -y 1; then
            check "$name: resumed model and state at step 6 bitwise equal" "cmp differs" -- \
                cmp -s "$(ckpt "$OA" model 6 .bin)" "$(ckpt "$OB" model 6 .bin)"
            check "$name: resumed optimizer state bitwise equal" "cmp differs" -- \
                cmp -s "$(ckpt "$OA" state 6 _00000.bin)" "$(ckpt "$OB" state 6 _00000.bin)"
        fi
    fi
done
expect_fail "optimizer: unknown name" "unknown; choose adamw, adafactor or came" -- "$TRAIN" "${BASE[@]}" --optimizer sgd -o ""
expect_fail "optimizer: resume with another optimizer" "optimizer floats" -- \
    "$TRAIN" "${RES[@]}" --optimizer came -o "$W/opt_a_adafactor" -y 1

# ----------------------------------------------------------------------------
# 12. recompute and offload: every policy trains to the bitwise same model as the plain
# run (the fixture has L=2: segments of k=1 are its checkpointing), the measured memory
# equals the plan, and impossible requests are refused

PLAIN="$W/act_plain"
if expect_ok "activations: plain 6-step run" -- "$TRAIN" "${RES[@]}" -o "$PLAIN"; then
    for pol in "--recompute 1" "--recompute 2" "--recompute gelu" "--recompute attn,gelu" "--offload 1" \
               "--recompute 1 --offload 1" "--recompute 1,gelu,attn --offload 1" "--recompute gelu --offload 1 --optimizer came"; do
        D="$W/act_${pol//[ ,-]/_}"
        # shellcheck disable=SC2086
        if expect_ok "activations $pol: 6 steps" -- "$TRAIN" "${RES[@]}" $pol -o "$D"; then
            cp "$OUT" "$W/act.stdout"
            check "activations $pol: measured memory equals the plan" "table rows differ" -- plan_equals_measured "$W/act.stdout"
            if [ "${pol#*came}" = "$pol" ]; then
                check "activations $pol: model at step 6 bitwise equal to the plain run" "cmp differs" -- \
                    cmp -s "$(ckpt "$PLAIN" model 6 .bin)" "$(ckpt "$D" model 6 .bin)"
                check "activations $pol: same losses in the log" "log.jsonl differs" -- \
                    test "$(log_losses "$PLAIN/log.jsonl" 1 6)" = "$(log_losses "$D/log.jsonl" 1 6)"
            fi
        fi
    done
    check "activations: offload puts bytes in the host row" "host total is 0" -- \
        grep -qE '^\| host total +\| +0\.[0-9]*[1-9][0-9]* MiB' "$W/act.stdout"
fi
expect_fail "recompute: unknown part" "unknown part 'all'" -- "$TRAIN" "${BASE[@]}" --recompute all
expect_fail "recompute: segment size 0" "the segment size must be 1..2" -- "$TRAIN" "${BASE[@]}" --recompute 0
expect_fail "recompute: segment size above L" "the segment size must be 1..2" -- "$TRAIN" "${BASE[@]}" --recompute 3
expect_fail "recompute: two segment sizes" "give one segment size" -- "$TRAIN" "${BASE[@]}" --recompute sqrt,1
expect_fail "recompute: none with others" "'none' cannot be combined" -- "$TRAIN" "${BASE[@]}" --recompute none,gelu
expect_fail "offload: value other than 0 or 1" "--offload 2: offload is 0 or 1" -- "$TRAIN" "${BASE[@]}" --offload 2
expect_fail "offload: one segment leaves nothing to offload" "nothing would move to the host" -- \
    "$TRAIN" "${BASE[@]}" --recompute 2 --offload 1
expect_fail "offload: host store larger than the host memory" "host memory" -- \
    "$TRAIN" "${BASE[@]}" -e d48 -b 64 -t 1024 --offload 1
if expect_ok "plan: --plan prints recompute FLOPs" -- "$TRAIN" --plan -e d12 -b 4 -t 64 --recompute sqrt,attn --offload 1; then
    check "plan: recompute line and host row" "missing" -- \
        grep -q '^recompute: +[0-9.]* GFLOP' "$OUT"
fi

end_suite
