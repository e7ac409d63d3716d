"""test_cli.py: end-to-end tests of the train_gpt binary: flags and switches, hyperparameter ranges,
impossible shapes and sizes beyond 32 bits, bad files (model, shards, tokenizer), the output directory
(an earlier run's folder, --overwrite, the lock, stale temporary files), a non-finite loss and what
its message says, checkpoints and bitwise resume (the state header checked against the run, the run
identity, a rewritten checkpoint's DONE marker, log.jsonl after a resume, --keep-checkpoints),
SIGINT/SIGTERM (a step or a validation cut short, a second signal), the progress output and
log.jsonl, --plan, the optimizers, --recompute/--offload, the Makefile's MPI setting, and
--sample (greedy against the model's probabilities, seeds, top-k, the sliding window, nothing
written, its bad input), and (section 15) what must never happen: a resume that runs past -x, an
input removed by --overwrite, a loop of hints after kill -9, a damaged newest checkpoint that stops a
resume, a failed write that leaves files behind, a flag the optimizer ignores, a sample that is not
UTF-8.

    python3 tests/test_cli.py ./train_gpt ./test_gpt

Every run uses the tiny fixture model that `test_gpt --write-fixtures DIR` writes (L=2 C=32 NH=2
maxT=32 V=64, its shards and tokenizer), so each takes well under a second. Prints "ok   name" or
"FAIL name: detail" per check and, last, "N passed, N failed"; exits 1 if any check failed.
Numbers (losses, memory) are read from the runs' log.jsonl; what a user sees (step lines, a
"resumed from" line, a sample) from stdout.

Tolerances: none. Resume, every activation policy and a stop by signal must reproduce the
straight run bit for bit (cmp of the checkpoint files, equal log lines), because they run the same
arithmetic in the same order. The helpers (what an error check demands, for one) are in
tests/e2e.py.
"""

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import e2e
from e2e import ckpt, read_log, same_bytes, train_rows

TRAIN, TESTER = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt"])
s = e2e.Suite("test_cli", tester=TESTER, run_limit=30)
FIX, W = s.fix, s.root

# the base run: 6 steps of B=2 T=16, validation every 3 steps, no samples. Later flags override
# earlier ones, so a check appends the one flag it changes.
BASE = [TRAIN, "-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", f"{FIX}/val.bin",
        "-k", f"{FIX}/tokenizer.bin", "-b", "2", "-t", "16", "-x", "6", "-v", "3", "-m", "2", "-s", "0",
        "-o", f"{W}/out_err"]

# ----------------------------------------------------------------------------
# 1. flags: the parser rejects what it cannot read. (That -h lists every row of the flag table
# is checked in test_gpt.c, against the table itself.)

s.expect_fail("flags: unknown flag", "unknown flag '--bogus'", BASE + ["--bogus", "1"])
s.expect_fail("flags: flag without a value", "flag -b needs a value", BASE + ["-b"])
s.expect_fail("flags: malformed integer", "'2x' is not an integer", BASE + ["-b", "2x"])
s.expect_fail("flags: malformed float", "'abc' is not a number", BASE + ["-l", "abc"])
s.expect_fail("flags: float out of range", "'1e39' is beyond a float's range", BASE + ["-l", "1e39"])
s.expect_fail("flags: a float too close to 0 says so (not 'not a number')", "'1e-45' is too close to 0 for a float's range",
              BASE + ["-l", "1e-45"])
s.expect_fail("flags: --recompute beyond a long is named as given", "--recompute 99999999999999999999: the segment size must be 1..2",
              BASE + ["--recompute", "99999999999999999999"])
s.expect_fail("flags: unknown --precision", "--precision 'fp16': unknown; choose fp32 or bf16", BASE + ["--precision", "fp16"])
s.expect_fail("flags: the CPU trains in fp32 only", "--precision bf16: the CPU backend trains in fp32 only", BASE + ["--precision", "bf16"])

r = s.expect_ok("flags: -h exits 0", [TRAIN, "-h"])
if r:
    s.check("flags: -h trains nothing", not r.step_lines(), "step lines in -h output")

# a switch (--plan, -y, --offload, ...) is on alone and takes an optional 0 or 1; -h says which are
r = s.expect_ok("flags: -h again", [TRAIN, "-h"])
if r:
    s.check("flags: -h marks the switches", re.search(r"^  -y  --resume .*\(a switch, default off\)$", r.out, re.M)
            and re.search(r"^      --plan .*\(a switch, default off\)$", r.out, re.M)
            and re.search(r"^      --zero .*\(default 0\)$", r.out, re.M), r.out[:300])
for form in (["--plan"], ["--plan", "1"], ["--plan=1"]):
    r = s.expect_ok(f"flags: {' '.join(form)} plans", BASE + form + ["-o", ""])
    if r:
        s.check(f"flags: {' '.join(form)} prints the plan and trains nothing", "memory plan for" in r.out and not r.step_lines(),
                r.out[:200])
r = s.expect_ok("flags: --plan 0 trains", BASE + ["--plan", "0", "-x", "1", "-o", ""])
if r:
    s.check("flags: --plan 0 trains one step", len(r.step_lines()) == 1, r.out[-200:])
s.expect_fail("flags: a switch takes 0 or 1 only", "-y 2: resume is 0 or 1 (a switch: -y alone means 1)", BASE + ["-y", "2"])

r = s.expect_ok("flags: --name=value form", BASE + ["--steps=2", "--out="])
if r:
    lines = r.step_lines()
    s.check("flags: --steps=2 runs 2 steps", len(lines) == 2 and lines[-1].split()[1] == "2/2",
            f"last step line: {lines[-1:] }")
    names = [line.split("|")[1].strip() for line in r.out.splitlines() if re.match(r"^\| [a-z]", line) and line.count("|") == 2]
    twice = sorted({n for n in names if names.count(n) > 1})
    s.check("flags: the configuration table names each row once", len(names) > 30 and not twice, f"rows named twice: {twice}")

# every hyperparameter finite and in its range: --eps 0 trained to NaN weights and exited 0
s.expect_fail("hyperparameters: --eps 0", "--eps 0: must be a finite number in (0, inf)", BASE + ["--eps", "0"])
s.expect_fail("hyperparameters: --eps -1", "--eps -1: must be a finite number in (0, inf)", BASE + ["--eps", "-1"])
s.expect_fail("hyperparameters: -q -5", "-q (--final-lr-frac) -5: must be a finite number in [0, 1]", BASE + ["-q", "-5"])
s.expect_fail("hyperparameters: -l inf", "-l (--lr) inf: must be a finite number in [0, inf)", BASE + ["-l", "inf"])
s.expect_fail("hyperparameters: --beta2 1", "--beta2 1: must be a finite number in [0, 1)", BASE + ["--beta2", "1"])
s.expect_fail("hyperparameters: --grad-clip -inf", "--grad-clip -inf: must be a finite number in [0, inf)",
              BASE + ["--grad-clip", "-inf"])
s.expect_fail("hyperparameters: -u -1", "-u (--warmup) -1: must be >= 0", BASE + ["-u", "-1"])

# ----------------------------------------------------------------------------
# 2. impossible shapes: stopped before anything is allocated or trained

s.expect_fail("shapes: C not divisible by NH", "is not divisible by heads NH=5",
              BASE + ["-e", f"{FIX}/model_badheads.bin"])
s.expect_fail("shapes: -t longer than maxT", "-t 33 is longer than the model's context maxT=32", BASE + ["-t", "33"])
s.expect_fail("shapes: -d not a multiple of B*T", "must be a positive multiple of B*T = 32", BASE + ["-d", "48"])
s.expect_fail("shapes: -b 0", "the batch size must be >= 1", BASE + ["-b", "0"])
s.expect_fail("shapes: -x 0", "the number of steps must be >= 1", BASE + ["-x", "0"])
# sizes in 64 bits: B*T of 2^32 tokens was 0 in an int (a division by zero), 2^31-1 sequences
# of 16 tokens a negative count, and 2^31-1 planned ranks a negative size
s.expect_fail("sizes: -b 67108864 -t 64 -d 256", "a micro-batch of B*T = 4294967296 tokens is more than 2147483647",
              BASE + ["-e", "tiny", "-b", "67108864", "-t", "64", "-d", "256"])
s.expect_fail("sizes: -b 4194304 -t 1024 -d 1024", "a micro-batch of B*T = 4294967296 tokens is more than 2147483647",
              BASE + ["-e", "tiny", "-b", "4194304", "-t", "1024", "-d", "1024"])
s.expect_fail("sizes: -b 2147483647", "B*T = 34359738352 tokens is more than 2147483647", BASE + ["-b", "2147483647"])
s.expect_fail("sizes: --plan --plan-ranks 2147483647", "B*T times the ranks = 32 x 2147483647 = 68719476704 tokens",
              BASE + ["--plan", "--plan-ranks", "2147483647"])
# a 1,244-byte model file whose header's parameter count wraps around 2^64 to 55 floats
with open(f"{W}/model_wraps.bin", "wb") as f:
    f.write(struct.pack("<8i", 20240326, 3, 984263313, 1, 178956966, 1, 2147483647, 984263312) + bytes(248 * 4 + 220))
s.expect_fail("sizes: model header beyond the bounds (its size would wrap)", "L (layers) = 178956966 is outside 1..1024",
              BASE + ["-e", f"{W}/model_wraps.bin"])

# ----------------------------------------------------------------------------
# 3. files: missing, foreign, truncated or inconsistent model, shard and tokenizer files

s.expect_fail("files: missing model file", "is neither a preset", BASE + ["-e", f"{FIX}/no_such_model.bin"])
s.expect_fail("files: preset name typo -e d7", "-e 'd7' is neither a preset", BASE + ["-e", "d7"])
s.expect_fail("files: model bad magic", "is not a model file (magic 12345", BASE + ["-e", f"{FIX}/model_badmagic.bin"])
s.expect_fail("files: model bad version", "has version 4", BASE + ["-e", f"{FIX}/model_badversion.bin"])
s.expect_fail("files: model truncated", "truncated or corrupt", BASE + ["-e", f"{FIX}/model_truncated.bin"])
s.expect_fail("files: no train shard matches", f"no token shards match '{FIX}/nothing_*.bin'",
              BASE + ["-i", f"{FIX}/nothing_*.bin"])
s.expect_fail("files: no val shard matches", f"no token shards match '{FIX}/nothing_*.bin'",
              BASE + ["-j", f"{FIX}/nothing_*.bin"])
s.expect_fail("files: shard bad magic", "is not a token shard (magic 1", BASE + ["-i", f"{FIX}/shard_badmagic.bin"])
s.expect_fail("files: shard bad version", "has version 7, want 1", BASE + ["-i", f"{FIX}/shard_badversion.bin"])
s.expect_fail("files: shard header count != size", "but its header says 4101 tokens",
              BASE + ["-i", f"{FIX}/shard_badcount.bin"])
s.expect_fail("files: shard too small for one batch", "has 10 tokens, fewer than one step needs (33",
              BASE + ["-i", f"{FIX}/shard_small.bin"])
# the bad token sits at position 100, in the 4th batch of 32 tokens: found when the shard is
# opened, before any training
r = s.expect_fail("files: token >= V names token, shard and offset",
                  "shard_bigtoken.bin': token 64 at position 100 (byte offset 1224)", BASE + ["-i", f"{FIX}/shard_bigtoken.bin"])
s.check("files: token >= V found before training", not r.step_lines(), f"step lines printed: {r.step_lines()[:1]}")
r = s.expect_fail("files: token >= V in a validation shard", "shard_bigtoken.bin': token 64 at position 100",
                  BASE + ["-j", f"{FIX}/shard_bigtoken.bin"])
s.check("files: token >= V in a validation shard found before training", not r.step_lines(),
        f"step lines printed: {r.step_lines()[:1]}")
# the tokenizer: a short read names the file; the EOT id must be in the vocabulary
with open(f"{FIX}/tokenizer.bin", "rb") as f:
    tok_bytes = f.read()
with open(f"{W}/tokenizer_short.bin", "wb") as f:
    f.write(tok_bytes[:-3])
s.expect_fail("files: truncated tokenizer names the file", "tokenizer_short.bin' is truncated: token 63 of 64",
              BASE + ["-k", f"{W}/tokenizer_short.bin"])
with open(f"{W}/tokenizer_eot.bin", "wb") as f:
    f.write(tok_bytes[:12] + struct.pack("<i", 64) + tok_bytes[16:])
s.expect_fail("files: tokenizer EOT id outside its vocabulary", "tokenizer_eot.bin': the end-of-text id 64 is outside",
              BASE + ["-k", f"{W}/tokenizer_eot.bin"])
# a NaN in qkvw of layer 1 (the fixture: wte 128x32, wpe 32x32, ln1w, ln1b 2x32, then qkvw 2x96x32)
with open(f"{FIX}/model.bin", "rb") as f:
    model_bytes = bytearray(f.read())
struct.pack_into("<f", model_bytes, 1024 + 4 * (128 * 32 + 32 * 32 + 2 * 2 * 32 + 96 * 32 + 5), float("nan"))
with open(f"{W}/model_nan.bin", "wb") as f:
    f.write(model_bytes)
s.expect_fail("files: model with a NaN weight names the tensor", "qkvw of layer 1, element 5 of 3072, is nan",
              BASE + ["-e", f"{W}/model_nan.bin"])
s.expect_fail("files: tokenizer is not a tokenizer", "is not a tokenizer file", BASE + ["-k", f"{FIX}/train.bin"])
# a missing tokenizer only turns decoding off (samples print ids)
r = s.expect_ok("files: missing tokenizer is not an error",
                BASE + ["-k", f"{FIX}/no_tokenizer.bin", "-s", "3", "-o", ""])
if r:
    s.check("files: missing tokenizer says so", "note: no tokenizer" in r.out, "no 'note: no tokenizer' line")

# ----------------------------------------------------------------------------
# 4. the output directory: checked before any training (root ignores chmod, so the unwritable
# path is one whose parent is a regular file)

r = s.expect_fail("output: -o under a regular file", "cannot create output directory",
                  BASE + ["-o", f"{FIX}/train.bin/out"])
s.check("output: -o under a regular file fails before training", not r.step_lines(),
        f"step lines printed: {r.step_lines()[:1]}")
r = s.expect_fail("output: -o is a regular file", "exists and is not a directory", BASE + ["-o", f"{FIX}/val.bin"])
s.check("output: -o a regular file fails before training", not r.step_lines(),
        f"step lines printed: {r.step_lines()[:1]}")

# an earlier run's folder: a fresh run is refused (it overwrote checkpoints of the same step and
# truncated the log); --overwrite 1 starts over there, removing them; -y 1 continues
OLD = f"{W}/out_old"
if s.expect_ok("output: a first run into a folder", BASE + ["-x", "2", "-n", "1", "-o", OLD]):
    s.expect_fail("output: a fresh run into a folder with an earlier run is refused",
                  "holds an earlier run (6 checkpoint file(s), the newest of step 2, and log.jsonl)", BASE + ["-o", OLD])
    s.expect_fail("output: ... and says how to go on", "resume it with -y 1, choose another -o, or start over there with --overwrite 1",
                  BASE + ["-o", OLD])
    for f in os.listdir(OLD):
        if f != "log.jsonl":
            os.remove(f"{OLD}/{f}")
    s.expect_fail("output: a folder with only a log.jsonl is refused too", "holds the log.jsonl of a run stopped before its first checkpoint", BASE + ["-o", OLD])
    r = s.expect_ok("output: --overwrite 1 starts over there", BASE + ["-x", "3", "-o", OLD, "--overwrite", "1"])
    if r:
        s.check("output: --overwrite 1 says what it removed", "--overwrite 1: removed 1 file(s) of an earlier run" in r.out,
                "no such line")
        steps = [row[0] for row in train_rows(OLD)]
        s.check("output: --overwrite 1 leaves only the new run's log and checkpoint",
                steps == [1, 2, 3] and sorted(os.listdir(OLD)) == ["DONE_00000003", "log.jsonl", "model_00000003.bin",
                                                                    "state_00000003_00000.bin"],
                f"steps {steps}, files {sorted(os.listdir(OLD))}")
s.expect_fail("output: -y 1 and --overwrite 1 together", "choose one", BASE + ["-y", "1", "--overwrite", "1"])
s.expect_fail("output: --overwrite 1 without -o", "but -o is \"\" (none)", BASE + ["-o", "", "--overwrite", "1"])

# a lock on the output folder while a run uses it: a second run into it (here one that would
# start over there) is refused while the first trains
LOCKED = f"{W}/locked"
first = subprocess.Popen(BASE + ["-x", "1000000", "-v", "0", "-o", LOCKED], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
try:
    line = first.stdout.readline()
    while line and not e2e.STEP_LINE_RE.match(line):
        line = first.stdout.readline()
    r = s.expect_fail("output: a second run into a folder in use is refused", f"output directory '{LOCKED}' is in use by another run",
                      BASE + ["-x", "1", "-o", LOCKED, "--overwrite", "1"])
    s.check("output: ... before touching it", first.poll() is None and os.path.isfile(f"{LOCKED}/log.jsonl"),
            "the first run ended or lost its log")
finally:
    e2e.kill_group(first)

# ----------------------------------------------------------------------------
# 5. a non-finite loss stops the run; checkpoints already in the directory stay intact. A good
# run writes checkpoints 1 and 2 into NAN; resumed there with -l 1e30 and -x 4, no periodic
# checkpoints, it would write checkpoint 4 at its end, but step 3's huge update makes step 4's
# loss NaN, so the run must stop before that.

NAN, BEFORE = f"{W}/nan", f"{W}/nan_before"
if s.expect_ok("nan: first run writes checkpoints 1 and 2", BASE + ["-x", "2", "-n", "1", "-o", NAN]):
    shutil.copytree(NAN, BEFORE)
    r = s.expect_fail("nan: -l 1e30 stops with 'not finite'", "is not finite at step 4",
                      BASE + ["-x", "4", "-n", "0", "-l", "1e30", "-o", NAN, "-y", "1"])
    s.check("nan: ... and says the checkpoint it resumed from is good",
            f"the newest checkpoint in '{NAN}', of step 2, was written before any jump" in r.err, r.err[:600])
    kept = sorted(f for f in os.listdir(BEFORE) if f != "log.jsonl")
    changed = [f for f in kept if not same_bytes(f"{BEFORE}/{f}", f"{NAN}/{f}")]
    s.check("nan: earlier checkpoints byte-identical (cmp)", not changed, f"changed: {changed}")
    now = sorted(f for f in os.listdir(NAN) if f != "log.jsonl")
    s.check("nan: no new checkpoint files", now == kept, f"files now: {now}")

# what the stop message says is true: with -l 1e10 step 1's update makes the weights diverge (max
# |w| about 1e9) and checkpoint 1 holds them (it was called "intact"); with -l 3 the loss first
# jumps at step 2 and turns infinite at step 7, after checkpoint 4; weights scaled by 1e30 in a
# model file give a non-finite loss at once, and the file is named as the cause
r = s.expect_fail("nan: -l 1e10 -n 1", "is not finite at step 2", BASE + ["-x", "4", "-n", "1", "-l", "1e10", "-o", f"{W}/nan_1e10"])
s.check("nan: -l 1e10: the checkpoint of step 1 holds the diverged weights",
        f"the newest checkpoint in '{W}/nan_1e10', of step 1, holds the weights that give this" in r.err
        and "do not resume from it" in r.err, r.err[:600])
s.check("nan: -l 1e10: step 1's update is named", "step 1's update made the weights diverge" in r.err, r.err[:600])
r = s.expect_fail("nan: -l 3 -n 4", "is not finite at step 7",
                  BASE + ["-x", "40", "-n", "4", "-c", "0", "-l", "3", "-o", f"{W}/nan_3"])
s.check("nan: -l 3: where the loss first jumped", "the loss or norm first jumped at step 2 (loss 5.8894" in r.err, r.err[:600])
s.check("nan: -l 3: checkpoint 4 came after the jump", "of step 4, was written after the jump at step 2" in r.err, r.err[:600])
with open(f"{FIX}/model.bin", "rb") as f:
    model_bytes = f.read()
weights = struct.unpack(f"<{(len(model_bytes) - 1024) // 4}f", model_bytes[1024:])
with open(f"{W}/model_huge.bin", "wb") as f:
    f.write(model_bytes[:1024] + struct.pack(f"<{len(weights)}f", *[w * 1e30 for w in weights]))
e2e.restamp_model(f"{W}/model_huge.bin")  # weights that are whole, as written: their meaning is what is checked
r = s.expect_fail("nan: a model file of huge weights", "is not finite at step 1", BASE + ["-e", f"{W}/model_huge.bin", "-o", ""])
s.check("nan: ... names the file as the cause", f"the weights loaded from the model file '{W}/model_huge.bin' give it at the "
        "first step, before any update: the file is the cause" in r.err and 'no checkpoint was written (-o "")' in r.err, r.err[:600])

# ----------------------------------------------------------------------------
# 6. checkpoint and bitwise resume. Run A: 6 steps, checkpoints at 3 and 6, warmup 2 so the
# cosine schedule (which depends on -x) is in play, a sample every 3 steps (the sampling RNG is
# part of the state). Run B: a fresh directory holding only A's checkpoint 3, the same flags and
# -y 1. Steps 4..6 must repeat A's exactly.

RES = BASE + ["-u", "2", "-s", "3", "-n", "3"]
A, B = f"{W}/run_a", f"{W}/run_b"


def sample_at(out, step):
    """the line after '---- sample at step STEP' on stdout (what the user reads)"""
    lines = out.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith(f"---- sample at step {step} "):
            return lines[i + 1]
    return None


def copy_checkpoint(src, step, dst, ranks=1):
    os.makedirs(dst, exist_ok=True)
    for f in [ckpt(src, "model", step, ".bin"), ckpt(src, "DONE", step)] + \
             [ckpt(src, "state", step, f"_{r:05d}.bin") for r in range(ranks)]:
        shutil.copy(f, dst)


ra = s.expect_ok("resume: run A (-x 6 -n 3)", RES + ["-o", A])
if ra:
    want = [ckpt(A, "DONE", 3), ckpt(A, "DONE", 6), ckpt(A, "model", 3, ".bin"), ckpt(A, "model", 6, ".bin"),
            ckpt(A, "state", 3, "_00000.bin"), ckpt(A, "state", 6, "_00000.bin")]
    missing = [f for f in want if not os.path.isfile(f)]
    s.check("resume: run A wrote checkpoints 3 and 6", not missing, f"missing {missing}")

    copy_checkpoint(A, 3, B)
    rb = s.expect_ok("resume: run B (-y 1 from A's step 3)", RES + ["-o", B, "-y", "1"])
    if rb:
        s.check("resume: B says it resumed at step 3", re.search(r"^resumed from .* at step 3$", rb.out, re.M),
                "no 'resumed from ... at step 3'")
        shown = [line.split()[1] for line in rb.step_lines()]
        s.check("resume: B trains steps 4..6 only", shown == ["4/6", "5/6", "6/6"], f"step lines: {shown}")
        logged = [row[0] for row in train_rows(B)]
        s.check("resume: B's log.jsonl holds steps 4..6", logged == [4, 5, 6], f"steps: {logged}")
        s.check("resume: model_00000006.bin bitwise equal",
                same_bytes(ckpt(A, "model", 6, ".bin"), ckpt(B, "model", 6, ".bin")), "cmp differs")
        s.check("resume: state_00000006_00000.bin bitwise equal",
                same_bytes(ckpt(A, "state", 6, "_00000.bin"), ckpt(B, "state", 6, "_00000.bin")),
                "cmp differs (optimizer state, data position or RNG)")
        la, lb = train_rows(A, 4, 6), train_rows(B, 4, 6)
        s.check("resume: loss, norm, lr of steps 4..6 equal in both logs", len(la) == 3 and la == lb,
                f"A: {la} | B: {lb}")
        sa, sb = sample_at(ra.out, 6), sample_at(rb.out, 6)
        s.check("resume: the sample at step 6 is the same", sa is not None and sa == sb, f"A: {sa} | B: {sb}")

# ----------------------------------------------------------------------------
# 7. resume skips a checkpoint without its DONE marker (a crash while writing it)

C = f"{W}/run_c"
os.makedirs(C)
for f in os.listdir(A) if os.path.isdir(A) else []:
    if re.search(r"_0000000[36]", f):
        shutil.copy(f"{A}/{f}", C)
if os.path.exists(ckpt(C, "DONE", 6)):
    os.remove(ckpt(C, "DONE", 6))
    open(ckpt(C, "WRITING", 6), "w").close()  # what a crash while writing checkpoint 6 leaves (llmc/checkpoint.h)
r = s.expect_ok("resume: checkpoint 6 without DONE marker (and -y alone)", RES + ["-o", C, "-y"])
if r:
    s.check("resume: ... picks the complete checkpoint 3", re.search(r"^resumed from .* at step 3$", r.out, re.M),
            "no 'resumed from ... at step 3'")
    s.check("resume: ... and ends bitwise equal to run A",
            same_bytes(ckpt(A, "model", 6, ".bin"), ckpt(C, "model", 6, ".bin")), "model_00000006.bin differs")
E = f"{W}/run_e"
os.makedirs(E)
for f in os.listdir(A) if os.path.isdir(A) else []:
    if f.startswith(("model_", "state_")):
        shutil.copy(f"{A}/{f}", E)
s.expect_fail("resume: no DONE marker at all", "no complete checkpoint (DONE_* marker)", RES + ["-o", E, "-y", "1"])
s.expect_fail("resume: -y 1 without -o", "-y 1 needs the output directory", RES + ["-o", "", "-y", "1"])
s.expect_fail("resume: checkpoint of another model shape", "has another model shape than -e",
              RES + ["-e", "tiny", "-o", A, "-y", "1"])
F = f"{W}/run_f"
os.makedirs(F)
for f in os.listdir(A) if os.path.isdir(A) else []:
    if "_00000006" in f:
        shutil.copy(f"{A}/{f}", F)
if os.path.isfile(ckpt(A, "state", 6, "_00000.bin")):
    with open(ckpt(A, "state", 6, "_00000.bin"), "rb") as src, open(ckpt(F, "state", 6, "_00000.bin"), "wb") as dst:
        dst.write(src.read(5000))
s.expect_fail("resume: truncated state file", "truncated or corrupt", RES + ["-o", F, "-y", "1"])
# the checks of a state file as it is read: a resume that trains on (-x 7; at -x 6 the run is complete)
RES7 = RES + ["-x", "7"]
G = f"{W}/run_g"
os.makedirs(G)
if os.path.isfile(ckpt(A, "state", 6, "_00000.bin")):
    for f in os.listdir(A):
        if "_00000006" in f:
            shutil.copy(f"{A}/{f}", G)
    with open(ckpt(G, "state", 6, "_00000.bin"), "r+b") as f:  # AdamW: m of wte first, then v
        f.seek(1024 + 4 * 10)
        f.write(struct.pack("<f", float("inf")))
    e2e.restamp_state(ckpt(G, "state", 6, "_00000.bin"))  # written so by a run that diverged: whole, not damaged
s.expect_fail("resume: state with an infinity names the slice", "the optimizer state of wte, float 10 of its 4096, is inf",
              RES7 + ["-o", G, "-y", "1"])


def patched_state(name, fmt, slot, value):
    """a copy of run A's checkpoint 6 in W/NAME whose state file has VALUE (struct FMT) at header SLOT"""
    d = f"{W}/{name}"
    os.makedirs(d)
    if os.path.isfile(ckpt(A, "state", 6, "_00000.bin")):
        copy_checkpoint(A, 6, d)
        with open(ckpt(d, "state", 6, "_00000.bin"), "r+b") as f:
            f.seek(4 * slot)
            f.write(struct.pack(fmt, value))
        e2e.restamp_state(ckpt(d, "state", 6, "_00000.bin"))
    return d


# the state header against the model and the run (STATE_SLOT_*: rank 3, step 4, data position
# 8-9, RNG 10-11, parameter count 14-15); each was read and ignored (or not compared) before
s.expect_fail("resume: state of another rank", "holds rank 1's state of step 6, but is read as rank 0's",
              RES7 + ["-o", patched_state("st_rank", "<i", 3, 1), "-y", "1"])
s.expect_fail("resume: state of another step", "holds rank 0's state of step 5, but is read as rank 0's of step 6",
              RES7 + ["-o", patched_state("st_step", "<i", 4, 5), "-y", "1"])
s.expect_fail("resume: state of another parameter count", "was written for a model of 12345 parameters",
              RES7 + ["-o", patched_state("st_params", "<Q", 14, 12345), "-y", "1"])
s.expect_fail("resume: state with a misaligned data position", "data position 7 in shard 0",
              RES7 + ["-o", patched_state("st_pos", "<Q", 8, 7), "-y", "1"])
s.expect_fail("resume: state with a data position past its shard", "data position 40992 in shard 0",
              RES7 + ["-o", patched_state("st_pos_far", "<Q", 8, 32 * 1281), "-y", "1"])
s.expect_fail("resume: state with the RNG at 0", "sampling RNG 0x0000000000000000",
              RES7 + ["-o", patched_state("st_rng", "<Q", 10, 0), "-y", "1"])
s.expect_fail("resume: data position in a shard -i lacks", "data position in shard 3, but only 1 shard(s) match -i",
              RES7 + ["-o", patched_state("st_shard", "<i", 5, 3), "-y", "1"])

# the temporary files of atomic writes that a crash (kill -9 while writing) left are removed when
# a run starts in the folder; a file of another name that ends in .tmp is not touched
STALE = f"{W}/run_stale"
if os.path.isdir(A):
    copy_checkpoint(A, 3, STALE)
    ours = [ckpt(STALE, "model", 6, ".bin.tmp"), ckpt(STALE, "state", 6, "_00000.bin.tmp"), ckpt(STALE, "DONE", 6, ".tmp"),
            f"{STALE}/log.jsonl.tmp"]
    for f in ours + [f"{STALE}/notes.tmp"]:
        with open(f, "wb") as out:
            out.write(b"partial")
    r = s.run(RES + ["-o", STALE, "-y", "1"])
    left = [f for f in ours if os.path.exists(f)]
    s.check("resume: stale temporary files of a crash are removed", r.rc == 0 and not left, f"exit code {r.rc}, left {left}")
    s.check("resume: ... saying so, and another .tmp file is kept",
            f"removed '{ours[0]}', a temporary file that a crashed run left" in r.out and os.path.isfile(f"{STALE}/notes.tmp"),
            "no message, or notes.tmp removed")
    for f in ours + [f"{STALE}/notes.tmp"]:  # so that a failure here fails no later check
        if os.path.exists(f):
            os.remove(f)

# log.jsonl after a resume: a run that logged steps past its last checkpoint (here: checkpoint 6
# lost its DONE marker, as in a crash while writing it) is resumed from checkpoint 3; its log keeps
# every step and validation once, the resumed steps' lines equal to the first run's
LOGR = f"{W}/run_log"
if os.path.isdir(A):
    shutil.copytree(A, LOGR)
    os.remove(ckpt(LOGR, "DONE", 6))
    open(ckpt(LOGR, "WRITING", 6), "w").close()
    r = s.expect_ok("log: resume from 3 after steps 4..6 were logged", RES + ["-o", LOGR, "-y", "1"])
    if r:
        rows = read_log(LOGR)
        train_steps = [x["step"] for x in rows if "loss" in x]
        val_steps = [x["step"] for x in rows if "val_loss" in x]
        s.check("log: every training step once", train_steps == [1, 2, 3, 4, 5, 6], f"steps {train_steps}")
        s.check("log: every validation once", val_steps == [0, 3, 6], f"validations at {val_steps}")
        s.check("log: the resumed steps' lines equal the first run's", train_rows(LOGR) == train_rows(A), "differ")
        s.check("log: says what it dropped", "dropped 4 line(s) after step 3" in r.out, "no such line")

# the run identity: a model file of one run with the state file of another run of the same step is
# refused (the weights do not hash to what the state recorded); a version 2 state file (before the
# identity) is still read, with a note
SEED2, MIXED, V2 = f"{W}/run_seed2", f"{W}/run_mixed", f"{W}/run_v2"
if s.expect_ok("resume: run A's flags with another seed", RES + ["--seed", "2", "-e", "tiny", "-o", SEED2]):
    if s.expect_ok("resume: ... and run A's again", RES + ["-e", "tiny", "-x", "3", "-o", f"{SEED2}_a"]):
        os.makedirs(MIXED)
        shutil.copy(ckpt(f"{SEED2}_a", "model", 3, ".bin"), MIXED)
        shutil.copy(ckpt(f"{SEED2}_a", "DONE", 3), MIXED)
        shutil.copy(ckpt(SEED2, "state", 3, "_00000.bin"), MIXED)
        s.expect_fail("resume: a model and a state of two runs are not combined", "is not of the checkpoint of state file",
                      RES + ["-e", "tiny", "-o", MIXED, "-y", "1"])
    copy_checkpoint(SEED2, 3, V2)
    with open(ckpt(V2, "state", 3, "_00000.bin"), "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<i", 2))
    r = s.expect_ok("resume: a version 2 state file is read", RES + ["--seed", "2", "-e", "tiny", "-o", V2, "-y", "1"])
    if r:
        s.check("resume: ... with a note that it was not checked", "is a version 2 state file, without a run identity" in r.out,
                "no note")
        s.check("resume: ... to the same end", same_bytes(ckpt(SEED2, "model", 6, ".bin"), ckpt(V2, "model", 6, ".bin")),
                "model_00000006.bin differs")

# a checkpoint being rewritten loses its DONE marker first: run A's folder copy resumed at its
# last step writes checkpoint 6 again; its state file cannot be written (a directory stands
# at its temporary name), so the run fails with a new model file and an old state: step 6
# must no longer look complete
REW = f"{W}/run_rewrite"
if os.path.isdir(A):
    shutil.copytree(A, REW)
    with open(ckpt(REW, "state", 6, "_00000.bin"), "r+b") as f:  # damaged: -y resumes from 3 and rewrites 6
        f.truncate(5000)
    blocker = ckpt(REW, "state", 6, "_00000.bin.tmp")
    os.makedirs(f"{blocker}/x")
    r = s.run(RES + ["-o", REW, "-y", "1"])
    shutil.rmtree(blocker)
    s.check("resume: a failed rewrite of checkpoint 6 fails cleanly", r.rc == 1 and "cannot write" in r.err,
            f"exit code {r.rc}: {r.err[:300]}")
    s.check("resume: ... and leaves step 6 without its DONE marker", not os.path.exists(ckpt(REW, "DONE", 6))
            and os.path.exists(ckpt(REW, "DONE", 3)), f"files: {sorted(os.listdir(REW))}")

# --keep-checkpoints K: after each checkpoint only the newest K complete ones stay
KEEP = f"{W}/run_keep"
r = s.expect_ok("checkpoints: -n 1 --keep-checkpoints 2", RES + ["-n", "1", "--keep-checkpoints", "2", "-o", KEEP])
if r:
    files = sorted(f for f in os.listdir(KEEP) if f != "log.jsonl")
    s.check("checkpoints: only the newest 2 remain", files == ["DONE_00000005", "DONE_00000006", "model_00000005.bin",
            "model_00000006.bin", "state_00000005_00000.bin", "state_00000006_00000.bin"], f"files: {files}")
    s.check("checkpoints: ... saying so", r.out.count("removed 1 older checkpoint(s) (--keep-checkpoints 2)") == 4,
            "not 4 such lines")
    s.check("checkpoints: ... and the same model as without", same_bytes(ckpt(A, "model", 6, ".bin"), ckpt(KEEP, "model", 6, ".bin")),
            "model_00000006.bin differs from run A's")
# ... and never the model this run started from: -e names a checkpoint in -o that the pruning would
# otherwise remove, and repeating the command must still find it
if r:
    start = ckpt(KEEP, "model", 5, ".bin")
    with open(start, "rb") as f:
        start_bytes = f.read()
    again = RES + ["-e", start, "-n", "1", "--keep-checkpoints", "2", "-o", KEEP, "-y", "1", "-x", "9"]
    r2 = s.expect_ok("checkpoints: --keep-checkpoints with -e in -o", again)
    if r2:
        s.check("checkpoints: ... keeps the -e checkpoint, byte for byte", os.path.exists(start) and open(start, "rb").read() == start_bytes
                and os.path.exists(ckpt(KEEP, "DONE", 5)), f"files: {sorted(os.listdir(KEEP))}")
        s.check("checkpoints: ... says so once", r2.out.count("kept step 5 beyond --keep-checkpoints 2") == 1, r2.out[-600:])
        s.check("checkpoints: ... and still prunes the others", not os.path.exists(ckpt(KEEP, "model", 7, ".bin"))
                and os.path.exists(ckpt(KEEP, "model", 9, ".bin")), f"files: {sorted(os.listdir(KEEP))}")
        s.expect_ok("checkpoints: ... so the same command runs again", again[:-2] + ["-x", "10"])
s.expect_fail("checkpoints: --keep-checkpoints -1", "--keep-checkpoints -1: must be >= 0", BASE + ["--keep-checkpoints", "-1"])

# ----------------------------------------------------------------------------
# 8. SIGINT and SIGTERM: the run finishes its step, writes a checkpoint, says so and exits 0;
# -y 1 with the same flags then runs to the end. Steps are made slow enough to catch (32
# micro-batches each, about 10 ms); 100 steps take about a second.

SIGRUN = BASE + ["-d", "1024", "-x", "100", "-n", "0", "-v", "0"]
s.signal_check("INT", f"{W}/sig_INT", 100, SIGRUN)
s.signal_check("TERM", f"{W}/sig_TERM", 100, SIGRUN)
# determinism: wherever the two runs stopped, their ends must be the same bits
s.check("signal: INT and TERM runs end bitwise equal",
        same_bytes(ckpt(f"{W}/sig_INT", "model", 100, ".bin"), ckpt(f"{W}/sig_TERM", "model", 100, ".bin")),
        "model_00000100.bin differs")

# the next safe point: a step of 1000 micro-batches (about a second) is cut short after the
# micro-batch under way, dropped, and the run checkpoints the step before it; resumed, it ends
# bitwise equal to a run that never stopped. A validation of 200000 batches (a minute) is cut
# short. A second signal exits at once (SIGSTOP holds the run while SIGINT and SIGTERM are both
# sent, so that both arrive before the run goes on). With -o "" nothing is saved, and it says so.


def signalled(name, cmd, signals):
    """runs CMD, sends SIGNALS (names) once its memory plan is printed (the stop signals are
    installed then); returns its Result"""
    out_path, err_path = os.path.join(s.logs, f"{name}.stdout"), os.path.join(s.logs, f"{name}.stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
    timed_out = False
    try:
        for _ in range(400):
            with open(out_path, errors="replace") as f:
                if "memory plan (bytes by category" in f.read() or p.poll() is not None:
                    break
            time.sleep(0.05)
        for sig in signals:
            if p.poll() is None:
                p.send_signal(getattr(signal, f"SIG{sig}"))
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            timed_out = True
            e2e.kill_group(p)
            rc = p.wait()
    finally:
        e2e.kill_group(p)
    with open(out_path, errors="replace") as f:
        out = f.read()
    with open(err_path, errors="replace") as f:
        err = f.read()
    return e2e.Result(rc, out, err, timed_out)


def state_without_run_id(path):
    """a state file's bytes with its run identity (header slots 18-19) zeroed"""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[72:80] = bytes(8)
    data[e2e.STATE_CHECKSUM] = bytes(4)  # (which covers the identity)
    return bytes(data)


LONG = BASE + ["-v", "0", "-d", "32000", "-x", "2"]
UNSTOPPED, CUT = f"{W}/sig_unstopped", f"{W}/sig_cut"
if s.expect_ok("signal: a 2-step run of 1000 micro-batches a step", LONG + ["-o", UNSTOPPED]):
    r = signalled("cut", LONG + ["-o", CUT], ["INT"])
    s.check("signal: a step under way is cut short", r.rc == 0 and f"stopped by signal after step 0; step 1 was cut short and dropped; "
            f"wrote checkpoint 0 to {CUT}/: resume with the same flags and -y 1" in r.out, f"exit code {r.rc}: {r.out[-300:]} {r.err[:300]}")
    if s.expect_ok("signal: ... and resumed", LONG + ["-o", CUT, "-y", "1"]):
        s.check("signal: ... ends bitwise equal to the run that never stopped (model, and state but its run identity)",
                same_bytes(ckpt(UNSTOPPED, "model", 2, ".bin"), ckpt(CUT, "model", 2, ".bin"))
                and state_without_run_id(ckpt(UNSTOPPED, "state", 2, "_00000.bin")) == state_without_run_id(ckpt(CUT, "state", 2, "_00000.bin")),
                "model_00000002.bin or state_00000002_00000.bin differs")
r = signalled("val", BASE + ["-v", "1", "-m", "200000", "-o", f"{W}/sig_val"], ["INT"])
s.check("signal: a validation under way is cut short", r.rc == 0 and "step     0 | validation cut short by the stop signal" in r.out
        and os.path.isfile(ckpt(f"{W}/sig_val", "DONE", 0)), f"exit code {r.rc}: {r.out[-300:]}")
r = signalled("twice", LONG + ["-o", f"{W}/sig_twice"], ["STOP", "INT", "TERM", "CONT"])
s.check("signal: a second signal exits at once", r.rc in (130, 143) and "error: a second stop signal: exiting at once, without a "
        f"checkpoint; this run has no complete checkpoint in '{W}/sig_twice' yet" in r.err, f"exit code {r.rc}: {r.err[:300]}")
r = signalled("no_out", LONG + ["-o", ""], ["INT"])
s.check("signal: with -o \"\" it says nothing was saved", r.rc == 0 and 'step 1 was cut short and dropped; nothing was saved (-o "")'
        in r.out and "-y 1" not in r.out, f"exit code {r.rc}: {r.out[-300:]}")

# ----------------------------------------------------------------------------
# 9. progress output: step lines on stdout, one JSON object per line in OUT/log.jsonl

STEP_RE = re.compile(r"^step +[0-9]+/[0-9]+ \| loss [0-9.]+ \| norm +[0-9.]+ \| lr [0-9.]+e[-+][0-9]+ "
                     r"\| +[0-9.]+ ms \| +[0-9]+ tok/s")
lines = ra.step_lines() if ra else []
good = [line for line in lines if STEP_RE.match(line)]
s.check("progress: 6 step lines with loss, norm, lr, ms, tok/s", len(lines) == 6 and len(good) == 6,
        f"{len(good)} of {len(lines)} lines match; first: {lines[:1]}")
try:
    rows = read_log(A)
    train = [r for r in rows if "loss" in r]
    if not all(isinstance(r, dict) for r in rows):
        detail = "a line is not an object"
    elif not all({"step", "loss", "grad_norm", "lr"} <= r.keys() for r in train):
        detail = "a training line lacks step, loss, grad_norm or lr"
    elif [r["step"] for r in train] != [1, 2, 3, 4, 5, 6]:
        detail = f"training steps {[r['step'] for r in train]}"
    elif not all("val_loss" in r or "memory" in r for r in rows if "loss" not in r):
        detail = "a line is neither training, validation nor memory"
    else:
        detail = ""
except (OSError, ValueError) as e:
    detail = repr(e)
s.check("progress: log.jsonl is one JSON object a line, steps 1..6 with step, loss, grad_norm, lr", not detail, detail)
s.check_memory("progress: log.jsonl's memory record: measured equals planned", A)

# ----------------------------------------------------------------------------
# 10. --plan: the memory table, at once, for any model, without data files or training

r = s.expect_ok("plan: --plan -e d48 exits 0 without data",
                [TRAIN, "--plan", "-e", "d48", "-b", "8", "-t", "1024", "-i", "/nonexistent", "-j", "/nonexistent",
                 "-o", f"{W}/plan_out"])
if r:
    s.check("plan: prints the memory table", re.search(r"^\| total +\| +[0-9.]+ MiB", r.out, re.M), r.out[:300])
    s.check("plan: trains nothing, writes nothing", not r.step_lines() and not os.path.exists(f"{W}/plan_out"),
            f"step lines or {W}/plan_out created")
s.expect_fail("plan: still checks the shapes", "-t 33 is longer than the model's context",
              [TRAIN, "--plan"] + BASE[1:] + ["-t", "33"])

# ----------------------------------------------------------------------------
# 11. optimizers: Adafactor (with and without its first moment) and CAME train, checkpoint their
# own state and resume bitwise; the memory measured after the first step equals the plan; an
# unknown name is refused. (Their numbers are checked against the PyTorch packages in
# test_gpt.c; the fixture data is random, so no loss is expected to fall here.)

for opt in (["adafactor"], ["adafactor", "--adafactor-beta1", "0.9"], ["came"]):
    name = f"optimizer {opt[0]}" + (" + beta1" if len(opt) > 1 else "")
    OA, OB = f"{W}/opt_a_{'_'.join(opt)}", f"{W}/opt_b_{'_'.join(opt)}"
    if s.expect_ok(f"{name}: 6 steps with checkpoints at 3 and 6", RES + ["--optimizer", *opt, "-o", OA]):
        s.check_memory(f"{name}: measured memory equals the plan", OA)
        copy_checkpoint(OA, 3, OB)
        if s.expect_ok(f"{name}: resume from step 3", RES + ["--optimizer", *opt, "-o", OB, "-y", "1"]):
            s.check(f"{name}: resumed model and state at step 6 bitwise equal",
                    same_bytes(ckpt(OA, "model", 6, ".bin"), ckpt(OB, "model", 6, ".bin")), "cmp differs")
            s.check(f"{name}: resumed optimizer state bitwise equal",
                    same_bytes(ckpt(OA, "state", 6, "_00000.bin"), ckpt(OB, "state", 6, "_00000.bin")), "cmp differs")
s.expect_fail("optimizer: unknown name", "unknown; choose adamw, adafactor or came",
              BASE + ["--optimizer", "sgd", "-o", ""])
s.expect_fail("optimizer: resume with another optimizer", "optimizer floats",
              RES7 + ["--optimizer", "came", "-o", f"{W}/opt_a_adafactor", "-y", "1"])

# ----------------------------------------------------------------------------
# 12. recompute and offload: every policy trains to the bitwise same model as the plain run (the
# fixture has L=2: segments of k=1 are its checkpointing), the measured memory equals the plan,
# and impossible requests are refused

PLAIN = f"{W}/act_plain"
if s.expect_ok("activations: plain 6-step run", RES + ["-o", PLAIN]):
    host = {}  # policy -> measured bytes in the host store
    for pol in ("--recompute 1", "--recompute 2", "--recompute gelu", "--recompute attn,gelu", "--offload 1",
                "--recompute 1 --offload 1", "--recompute 1,gelu,attn --offload 1",
                "--recompute gelu --offload 1 --optimizer came"):
        D = f"{W}/act_{re.sub(r'[ ,-]', '_', pol)}"
        if not s.expect_ok(f"activations {pol}: 6 steps", RES + pol.split() + ["-o", D]):
            continue
        if s.check_memory(f"activations {pol}: measured memory equals the plan", D):
            host[pol] = e2e.memory_record(D)["measured"]["host_total"]
        if "came" not in pol:
            s.check(f"activations {pol}: model at step 6 bitwise equal to the plain run",
                    same_bytes(ckpt(PLAIN, "model", 6, ".bin"), ckpt(D, "model", 6, ".bin")), "cmp differs")
            s.check(f"activations {pol}: same losses in the log", train_rows(PLAIN) == train_rows(D),
                    "log.jsonl differs")
    # L=2: plain offload keeps both blocks in its three slots (act_policy.h: the last three layers never
    # move), so only offload with checkpointing (the segment inputs) puts bytes in the host row
    wrong = {pol: b for pol, b in host.items() if (b > 0) != ("--offload 1" in pol and "--recompute 1" in pol)}
    s.check("activations: offload of segment inputs puts bytes in the host row (and only it, at L=2)", host and not wrong,
            f"host bytes: {wrong or host}")
    # --loss-chunk 5 (B*T = 32: six chunks of 5, then 2), with validation every 3 steps (a chunked
    # forward without gradients): the plan holds, the losses within 1e-6 of the whole head's
    D = f"{W}/act_loss_chunk"
    if s.expect_ok("activations --loss-chunk 5: 6 steps", RES + ["--loss-chunk", "5", "-o", D]):
        s.check_memory("activations --loss-chunk 5: measured memory equals the plan", D)
        rows, plain_rows = train_rows(D), train_rows(PLAIN)
        close = len(rows) == len(plain_rows) and all(abs(a[1] - b[1]) <= 1e-6 * abs(b[1]) for a, b in zip(rows, plain_rows))
        s.check("activations --loss-chunk 5: losses within 1e-6 of the plain run's", close, f"{rows} vs {plain_rows}")
        vals = [r for r in e2e.read_log(D) if "val_loss" in r]
        pvals = [r for r in e2e.read_log(PLAIN) if "val_loss" in r]
        s.check("activations --loss-chunk 5: validation losses within 1e-6 of the plain run's",
                len(vals) == len(pvals) > 0 and all(abs(a["val_loss"] - b["val_loss"]) <= 1e-6 * abs(b["val_loss"]) for a, b in zip(vals, pvals)),
                f"{vals} vs {pvals}")
s.expect_fail("loss chunk: negative", "--loss-chunk -1: a chunk is a number of tokens", BASE + ["--loss-chunk", "-1"])
s.expect_fail("recompute: unknown part", "unknown part 'all'", BASE + ["--recompute", "all"])
s.expect_fail("recompute: segment size 0", "the segment size must be 1..2", BASE + ["--recompute", "0"])
s.expect_fail("recompute: segment size above L", "the segment size must be 1..2", BASE + ["--recompute", "3"])
s.expect_fail("recompute: two segment sizes", "give one segment size", BASE + ["--recompute", "sqrt,1"])
s.expect_fail("recompute: none with others", "'none' cannot be combined", BASE + ["--recompute", "none,gelu"])
s.expect_fail("offload: a value that names nothing to move", "--offload 2: '2' is not something that moves to host memory", BASE + ["--offload", "2"])
s.expect_fail("offload: one segment leaves nothing to offload", "nothing would move to the host",
              BASE + ["--recompute", "2", "--offload", "1"])
s.expect_fail("offload: host store larger than the host memory", "host memory",
              BASE + ["-e", "d48", "-b", "64", "-t", "1024", "--offload", "1"])
r = s.expect_ok("plan: --plan prints recompute FLOPs",
                [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--recompute", "sqrt,attn", "--offload", "1"])
if r:
    s.check("plan: recompute line", re.search(r"^recompute: \+[0-9.]+ GFLOP", r.out, re.M), "missing")

# ----------------------------------------------------------------------------
# 13. the build: a train_gpt built without MPI is rebuilt once the MPI setting changes (mpicc
# installed since, or MPI=0 given); make -q answers whether it is up to date, in a copy of the
# Makefile over empty sources

MK = f"{W}/make"
if shutil.which("make"):
    os.makedirs(MK)
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Makefile"), MK)
    open(f"{MK}/train_gpt.c", "w").close()

    def up_to_date(mpi):
        return subprocess.run(["make", "-s", "-C", MK, "-q", "train_gpt", f"MPI={mpi}"], capture_output=True).returncode == 0

    up_to_date(0)  # writes the setting
    time.sleep(0.05)
    open(f"{MK}/train_gpt", "w").close()  # "built" without MPI
    s.check("make: train_gpt built with MPI=0 is up to date for MPI=0", up_to_date(0), "make -q says it is not")
    s.check("make: ... and is rebuilt for MPI=1", not up_to_date(1), "make -q says it is up to date")
else:
    s.skip("make: the MPI setting rebuilds train_gpt", "make not found")

# ----------------------------------------------------------------------------
# 14. --sample: a model file continues a prompt, and nothing is trained or written. The prompts
# use only characters whose GPT-2 tokens are below the fixture's V=64 ("A1B2" is 32 16 33 17), and
# -k "" prints ids. The greedy checks use e2e.copy_model, which continues a prompt by copying the
# token 4 back, so that what it picks depends on what its window holds. Each greedy token is held
# to test_gpt --probs: the argmax of the probabilities after exactly the last -t tokens before it
# (a forward, but not the sampling code)

WINDOW = e2e.COPY_PERIOD  # -t of the greedy checks: the token to copy is the window's first


def probs_after(model, windows):
    """test_gpt --probs: the next-token probabilities after each window of ids"""
    text = "".join(" ".join(map(str, w)) + "\n" for w in windows)
    p = subprocess.run([TESTER, "--probs", model], input=text, capture_output=True, text=True, timeout=30)
    return [[float(x) for x in line.split()] for line in p.stdout.splitlines()]


def ranked(probs):
    """ids from the most likely down, the lower id first among equal probabilities"""
    return sorted(range(len(probs)), key=lambda i: (-probs[i], i))


def windows_before(ids, first, T):
    """for each position from FIRST on: the last T ids before it"""
    return [ids[max(0, t - T):t] for t in range(first, len(ids))]


BPE, why = e2e.bpe_dir()
if BPE is None:
    s.skip("--sample", why)
    s.finish()
TRAINED = e2e.copy_model(s, TRAIN)
SAMPLE = [TRAIN, "-e", TRAINED, "-k", "", "--bpe", BPE, "--sample"]
FIXTURE_SAMPLE = [TRAIN, "-e", f"{FIX}/model.bin", "-k", "", "-t", "8", "--bpe", BPE, "--sample"]
sample_ids = e2e.sample_ids

# greedy: each token the argmax after the last -t tokens; the prompt (6 tokens) is longer than the
# window and the 20 tokens after it slide the window 22 times
prompt = "A1B2C3"
GREEDY = SAMPLE + [prompt, "-t", str(WINDOW), "-g", "20", "--temperature", "0"]
r = s.expect_ok("sample: greedy, a prompt longer than -t, 20 tokens", GREEDY) if TRAINED else None
if r:
    ids, want_prompt = sample_ids(r), e2e.gpt2_bpe.load_encoder(BPE).encode(prompt)
    s.check("sample: the prompt's ids are GPT-2's BPE (gpt2_bpe.py)", ids[:len(want_prompt)] == want_prompt, f"{ids[:8]} vs {want_prompt}")
    s.check("sample: a note says the model sees the prompt's last -t tokens",
            f"the prompt is {len(want_prompt)} tokens, more than the window -t {WINDOW}" in r.out, r.out[:400])
    s.check("sample: -g 20 tokens after the prompt", len(ids) == len(want_prompt) + 20, f"{len(ids)} ids: {ids}")
    probs = probs_after(TRAINED, windows_before(ids, len(want_prompt), WINDOW))
    picks = [ranked(p)[0] for p in probs]
    s.check("sample: each greedy token is the argmax after the last -t tokens (test_gpt --probs)",
            picks == ids[len(want_prompt):], f"sampled {ids[len(want_prompt):]}, argmax {picks}")
    # the check above sees a window one token too short (one too long cannot run: the model is
    # allocated for -t tokens, and its forward refuses more)
    short = [ranked(p)[0] for p in probs_after(TRAINED, windows_before(ids, len(want_prompt), WINDOW - 1))]
    s.check(f"sample: ... and a window of {WINDOW - 1} would pick otherwise (the check can see it)",
            short != ids[len(want_prompt):], f"the same tokens: {short}")
    again = s.expect_ok("sample: greedy again", GREEDY)
    s.check("sample: greedy is deterministic", again is not None and sample_ids(again) == ids, "differs")
    one = s.expect_ok("sample: --top-k 1 at temperature 1.5", SAMPLE + [prompt, "-t", str(WINDOW), "-g", "20", "--top-k", "1",
                                                                      "--temperature", "1.5", "--seed", "3"])
    s.check("sample: --top-k 1 is greedy", one is not None and sample_ids(one) == ids, f"{sample_ids(one) if one else None} vs {ids}")
    decoded = s.expect_ok("sample: decoded by -k", GREEDY + ["-k", f"{FIX}/tokenizer.bin"])
    s.check("sample: with a tokenizer it prints the tokens' text", decoded is not None and
            "".join(f"<t{i}>" for i in ids) in decoded.out, decoded.out[-300:] if decoded else "")

# a draw: the seed decides it; --top-k 3 keeps every token among the 3 most likely of its window
# (the random fixture model: nearly uniform, so two seeds draw two texts)
DRAW = FIXTURE_SAMPLE + ["A1B2", "-g", "30"]
a, b, c = (s.expect_ok(f"sample: temperature 1, seed {seed}{again}", DRAW + ["--seed", str(seed)]) for seed, again in ((7, ""), (7, " again"), (8, "")))
if a and b and c:
    s.check("sample: the same seed draws the same text", sample_ids(a) == sample_ids(b), f"{sample_ids(a)} vs {sample_ids(b)}")
    s.check("sample: another seed draws another text", sample_ids(a) != sample_ids(c), f"both {sample_ids(a)}")
r = s.expect_ok("sample: --top-k 3 at temperature 2", DRAW + ["--top-k", "3", "--temperature", "2"])
if r:
    ids = sample_ids(r)
    ranks = [ranked(p).index(t) for p, t in zip(probs_after(f"{FIX}/model.bin", windows_before(ids, 4, 8)), ids[4:])]
    s.check("sample: --top-k 3 draws only among the 3 most likely tokens", len(ranks) == 30 and max(ranks) < 3, f"ranks {ranks}")
    s.check("sample: ... and not only the most likely (it draws)", len(set(ranks)) > 1, f"ranks {ranks}")

# --loss-chunk: sampling runs the head in chunks (of 3 of the 8-token window: the last chunk holds the
# position sampled), and draws the same text (the probabilities of a position are its row's)
r = s.expect_ok("sample: --loss-chunk 3", DRAW + ["--seed", "7", "--loss-chunk", "3"])
if r and a:
    s.check("sample: --loss-chunk 3 draws the text of the whole head", sample_ids(r) == sample_ids(a), f"{sample_ids(r)} vs {sample_ids(a)}")

# nothing is written: in an empty folder, with the default -o (out), the folder stays empty
empty = f"{W}/sample_cwd"
os.makedirs(empty)
before = s.snapshot()
if s.expect_ok("sample: a run in an empty folder", DRAW, cwd=empty):
    s.check("sample: writes nothing (no out/, no log, no checkpoint)", os.listdir(empty) == [], f"wrote {os.listdir(empty)}")
    s.check("sample: changes no file", s.snapshot() == before, "files changed")
r = s.expect_ok("sample: a long text: -t 32 (maxT), 100 tokens", DRAW + ["-t", "32", "-g", "100"])
if r:
    s.check("sample: 100 tokens past the model's maxT", len(sample_ids(r)) == 104, f"{len(sample_ids(r))} ids")

# bad input: each refused with the flag and a fix, before anything runs
s.expect_fail("sample: no model file (-e is a preset)", "-e 'd6' is a preset (random weights)", [TRAIN, "--bpe", BPE, "--sample", "A1"])
s.expect_fail("sample: a missing model file", "nor a readable model file", [TRAIN, "-e", f"{W}/none.bin", "--sample", "A1"])
s.expect_fail("sample: an empty prompt", "--sample \"\": the prompt is empty", FIXTURE_SAMPLE + [""])
s.expect_fail("sample: --temperature -1", "--temperature -1: must be a finite number in [0, inf)", DRAW + ["--temperature", "-1"])
s.expect_fail("sample: --temperature inf", "--temperature inf: must be a finite number in [0, inf)", DRAW + ["--temperature", "inf"])
s.expect_fail("sample: --top-k -1", "--top-k -1: must be >= 0", DRAW + ["--top-k", "-1"])
s.expect_fail("sample: -t beyond maxT", "-t 33: with --sample, the window of tokens the model sees, 1..32", DRAW + ["-t", "33"])
s.expect_fail("sample: -g 0", "-g 0: --sample generates 1..", DRAW + ["-g", "0"])
s.expect_fail("sample: a token outside the model's vocabulary", "the prompt's token 0 is id 15496, outside the model's vocabulary of V=64",
              FIXTURE_SAMPLE + ["Hello"])
s.expect_fail("sample: a prompt that is not UTF-8", "the prompt is not UTF-8 text (byte 0xff at offset 1)", FIXTURE_SAMPLE + [b"A\xff"])
s.expect_fail("sample: --bpe without the files", f"--bpe '{W}': no encoder.json there", DRAW + ["--bpe", W])
for name, flag in (("-x (--steps)", ["-x", "5"]), ("-y (--resume)", ["-y"]), ("-o (--out)", ["-o", f"{W}/out_sample"]),
                   ("--zero", ["--zero", "1"]), ("--recompute", ["--recompute", "sqrt"])):
    s.expect_fail(f"sample: {flag[0]} is refused", f"{name} is a training flag, and --sample trains nothing", DRAW + flag)
s.expect_fail("sample: the message lists what --sample reads", "--sample reads -e, -k, -t, -g, --seed, --precision, --attention, --loss-chunk, --temperature, --top-k, --bpe",
              DRAW + ["-b", "2"])
s.expect_fail("sample: --temperature without --sample", "--temperature goes with --sample", BASE + ["--temperature", "0.5"])
s.expect_fail("sample: --top-k without --sample", "--top-k goes with --sample", BASE + ["--top-k", "5"])
launcher, why = e2e.mpi_launcher(TRAIN)
if launcher:
    s.expect_fail("sample: under mpirun -np 2", "--sample runs in one process, but this run has 2 ranks", launcher + ["2"] + DRAW)
else:
    s.skip("sample: under mpirun -np 2", why)


# ----------------------------------------------------------------------------
# 15. nothing runs away, nothing of the user's is deleted, every byte of a sample printed (issue 21)

# a resume at or past -x: said, and nothing trained (before: it trained on forever, "step 300/2").
# Each run is bounded by the suite's time limit and its step lines are counted
RUN21 = f"{W}/i21_runaway"
if s.expect_ok("runaway: a run of 4 steps", BASE + ["-x", "4", "-o", RUN21]):
    before = sorted(os.listdir(RUN21))
    r = s.expect_fail("runaway: -y with -x 2 below the checkpoint's step 4 stops", "is of step 4, past the 2 steps to train (-x 2)",
                      BASE + ["-x", "2", "-y", "-o", RUN21])
    s.check("runaway: ... without a step", not r.step_lines() and not r.timed_out, f"{len(r.step_lines())} step lines")
    r = s.expect_ok("runaway: -y at -x 4, the checkpoint's step", BASE + ["-x", "4", "-y", "-o", RUN21])
    if r:
        s.check("runaway: ... says the run is complete and trains nothing",
                "is complete: its checkpoint is of step 4, the last of -x 4; nothing to train" in r.out and not r.step_lines(),
                r.out[-300:])
        s.check("runaway: ... and writes nothing", sorted(os.listdir(RUN21)) == before, f"{sorted(os.listdir(RUN21))}")
    r = s.expect_ok("runaway: -y with -x 6 trains exactly to step 6", BASE + ["-x", "6", "-y", "-o", RUN21])
    if r:
        s.check("runaway: ... steps 5 and 6, then stops", [l.split("|")[0].split()[1] for l in r.step_lines()] == ["5/6", "6/6"],
                f"{r.step_lines()}")

# --overwrite never removes a file the run reads: -e, -k, -i, -j inside -o (the bytes are checked)
OW = f"{W}/i21_overwrite"
if s.expect_ok("overwrite: a run of 3 steps", BASE + ["-x", "3", "-o", OW]):
    start = ckpt(OW, "model", 3, ".bin")
    with open(start, "rb") as f:
        start_bytes = f.read()
    s.expect_fail("overwrite: -e a model file in -o is refused before anything is removed",
                  f"--overwrite 1 would remove '{start}', which this run reads (-e ", BASE + ["-e", start, "-o", OW, "--overwrite"])
    s.check("overwrite: ... the model file's bytes are intact", os.path.isfile(start) and open(start, "rb").read() == start_bytes,
            "changed or removed")
    s.check("overwrite: ... and the folder is as it was", sorted(os.listdir(OW)) ==
            ["DONE_00000003", "log.jsonl", "model_00000003.bin", "state_00000003_00000.bin"], f"{sorted(os.listdir(OW))}")
if os.path.isfile(f"{OW}/log.jsonl") and os.path.isfile(ckpt(OW, "model", 3, ".bin")):
    start = ckpt(OW, "model", 3, ".bin")
    link = f"{W}/i21_link.bin"
    os.symlink(start, link)  # another spelling of the same file
    s.expect_fail("overwrite: -e a link to a model file in -o is refused too", "which this run reads (-e ", BASE + ["-e", link, "-o", OW, "--overwrite"])
    shutil.copy(f"{FIX}/tokenizer.bin", f"{OW}/log.jsonl.k")
    os.replace(f"{OW}/log.jsonl", f"{OW}/log.jsonl.bak")
    os.link(f"{FIX}/tokenizer.bin", f"{OW}/log.jsonl")  # a hard link: the tokenizer itself
    s.expect_fail("overwrite: -k hard-linked as -o's log.jsonl is refused", "which this run reads (-k", BASE + ["-o", OW, "--overwrite"])
    s.check("overwrite: ... the tokenizer's bytes are intact", same_bytes(f"{FIX}/tokenizer.bin", f"{OW}/log.jsonl.k"), "changed")
    os.replace(f"{OW}/log.jsonl.bak", f"{OW}/log.jsonl")
    os.remove(f"{OW}/log.jsonl.k")

# an incomplete checkpoint (no DONE marker: killed while writing it) is no run to resume, and a
# run killed before its first checkpoint (a log.jsonl only) gets one way on, not a loop of hints
INC = f"{W}/i21_incomplete"
if os.path.isdir(A):
    os.makedirs(INC)
    shutil.copy(ckpt(A, "model", 3, ".bin"), INC)
    open(ckpt(INC, "WRITING", 3), "w").close()  # the record a writer killed mid-checkpoint leaves (llmc/checkpoint.h)
    r = s.expect_fail("incomplete: -y with only a checkpoint without DONE marker", "no complete checkpoint (DONE_* marker)",
                      BASE + ["-o", INC, "-y"])
    s.check("incomplete: ... does not send back to -y", "resume it with -y" not in r.err.split("hint:")[-1], r.err)
    r = s.expect_ok("incomplete: a fresh run there starts, removing the incomplete checkpoint", BASE + ["-x", "2", "-o", INC])
    if r:
        s.check("incomplete: ... saying which file it removed",
                f"removed '{ckpt(INC, 'model', 3, '.bin')}': a file of an incomplete checkpoint" in r.out, r.out[:300])
    s.check("incomplete: ... and its WRITING record last", not os.path.exists(ckpt(INC, "WRITING", 3)), os.listdir(INC))
    shutil.rmtree(INC)
    os.makedirs(INC)
    shutil.copy(ckpt(A, "model", 3, ".bin"), INC)
    open(ckpt(INC, "WRITING", 3), "w").close()
    with open(f"{INC}/log.jsonl", "w") as f:
        f.write('{"step": 1, "loss": 4.0}\n')
    r1 = s.expect_fail("incomplete: a log but no checkpoint, -y: one way on", "start over there with --overwrite 1", BASE + ["-o", INC, "-y"])
    r2 = s.expect_fail("incomplete: a log but no checkpoint, no -y: the same way on", "start over there with --overwrite 1", BASE + ["-o", INC])
    hints = r1.err.split("hint:")[-1] + r2.err.split("hint:")[-1]
    s.check("incomplete: ... neither sends to the other", "resume it with -y" not in hints and "without -y" not in hints, hints)
    s.expect_ok("incomplete: ... and --overwrite 1 then starts", BASE + ["-x", "2", "-o", INC, "--overwrite"])
# a real kill -9 while the first checkpoint is written: the same way on
KILL = f"{W}/i21_kill"
p = subprocess.Popen(BASE + ["-x", "100000", "-v", "0", "-n", "50000", "-o", KILL], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
for _ in range(200):  # up to 10 s for its log
    if os.path.isfile(f"{KILL}/log.jsonl") and os.path.getsize(f"{KILL}/log.jsonl") > 0:
        break
    time.sleep(0.05)
e2e.kill_group(p)
s.expect_fail("incomplete: after kill -9 before any checkpoint, -y says --overwrite", "start over there with --overwrite 1", BASE + ["-o", KILL, "-y"])
s.expect_ok("incomplete: ... which starts", BASE + ["-x", "1", "-o", KILL, "--overwrite"])

# the newest checkpoint damaged: -y resumes from the newest whole one, saying which it skipped and why
DMG = f"{W}/i21_damaged"
if os.path.isdir(A):
    shutil.copytree(A, DMG)
    os.remove(ckpt(DMG, "state", 6, "_00000.bin"))
    r = s.expect_ok("damaged: the newest checkpoint's state file deleted: -y resumes", RES7 + ["-o", DMG, "-y"])
    if r:
        s.check("damaged: ... from checkpoint 3, saying it skipped 6 and why",
                f"skipped the checkpoint of step 6 in {DMG}/: rank 0's state file '{ckpt(DMG, 'state', 6, '_00000.bin')}': No such file" in r.out
                and re.search(r"^resumed from .* at step 3$", r.out, re.M), r.out[:400])
    shutil.rmtree(DMG)
    shutil.copytree(A, DMG)
    for step in (3, 6):
        with open(ckpt(DMG, "model", step, ".bin"), "r+b") as f:
            f.truncate(2000)
    s.expect_fail("damaged: every checkpoint truncated: stops naming the newest and why",
                  f"the newest, of step 6: '{ckpt(DMG, 'model', 6, '.bin')}' is 2000 bytes", RES7 + ["-o", DMG, "-y"])

# a full disk (here the file-size limit, the same failed write): the message names the file, and
# no file of the failed checkpoint is left (before: a model file without its state and DONE)
FULL = f"{W}/i21_full"
model_bytes = os.path.getsize(f"{FIX}/model.bin")
def file_limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (model_bytes + 4096, model_bytes + 4096))  # the model file fits, its state not
pf = subprocess.run(BASE + ["-x", "2", "-o", FULL], capture_output=True, text=True, preexec_fn=file_limit, timeout=30)
state2 = ckpt(FULL, "state", 2, "_00000.bin")
s.check("disk full: the failed write names its file", pf.returncode == 1 and f"cannot write '{state2}'" in pf.stderr, pf.stderr[:300])
s.check("disk full: ... and leaves no file of the checkpoint", sorted(os.listdir(FULL)) == ["log.jsonl"] if os.path.isdir(FULL) else False,
        f"{sorted(os.listdir(FULL)) if os.path.isdir(FULL) else 'no folder'}")
shutil.rmtree(FULL, ignore_errors=True)  # what an old binary left must fail no later check

# flags that the chosen optimizer does not read are refused, not shown as set
for flags, phrase in ((["--relative-step"], "--relative-step is read by --optimizer adafactor only"),
                      (["--adafactor-beta1", "0.9"], "--adafactor-beta1 is read by --optimizer adafactor only"),
                      (["--optimizer", "came", "--beta1", "0.8"], "--beta1 is read by --optimizer adamw only"),
                      (["--optimizer", "came", "--beta2", "0.9"], "--beta2 is read by --optimizer adamw only"),
                      (["--optimizer", "adafactor", "--eps", "1e-6"], "--eps is read by --optimizer adamw only"),
                      (["--eps1", "1e-20"], "--eps1 is read by --optimizer adafactor or came only"),
                      (["--optimizer", "adafactor", "--relative-step", "-l", "0.01"], "-l (--lr): --relative-step steps by")):
    s.expect_fail(f"optimizer flags: {' '.join(flags)} refused", phrase, BASE + flags + ["-o", ""])

# a directory where a file is expected names the flag and the file; an unreadable one says
# "permission denied" (as root, the run drops to an unprivileged user to see one)
for flag in ("-e", "-i", "-j", "-k"):
    r = s.expect_fail(f"files: {flag} a directory names the flag", f"{flag} (--", BASE + [flag, W, "-o", f"{W}/i21_dir"])
    s.check(f"files: {flag} a directory ... and says so", f"'{W}' is a directory, where a" in r.err, r.err[:200])
s.check("files: ... and no -o folder was made", not os.path.exists(f"{W}/i21_dir"), "made")
if os.path.isdir(A):
    SDIR = f"{W}/i21_state_dir"
    copy_checkpoint(A, 3, SDIR)
    os.remove(ckpt(SDIR, "state", 3, "_00000.bin"))
    os.makedirs(ckpt(SDIR, "state", 3, "_00000.bin"))
    s.expect_fail("files: a state file that is a directory is named", f"'{ckpt(SDIR, 'state', 3, '_00000.bin')}': not a file",
                  RES + ["-o", SDIR, "-y"])
PERM = tempfile.mkdtemp(prefix="i21_perm_")
os.chmod(PERM, 0o755)
for f in ("model.bin", "train.bin", "val.bin", "tokenizer.bin"):
    shutil.copy(f"{FIX}/{f}", PERM)
    os.chmod(f"{PERM}/{f}", 0o644)
as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
PB = [TRAIN, "-e", f"{PERM}/model.bin", "-i", f"{PERM}/train.bin", "-j", f"{PERM}/val.bin", "-k", f"{PERM}/tokenizer.bin",
      "-b", "2", "-t", "16", "-x", "1", "-o", ""]
if as_user and shutil.which("setpriv") is None:
    s.skip("files: an unreadable file says permission denied", "running as root without setpriv")
else:
    for flag, f in (("-k", "tokenizer.bin"), ("-e", "model.bin"), ("-i", "train.bin")):
        os.chmod(f"{PERM}/{f}", 0)
        r = s.run(as_user + PB)
        s.check(f"files: an unreadable {flag} says permission denied", r.rc == 1 and
                f"{flag} (--" in r.err and f"'{PERM}/{f}': permission denied" in r.err, r.err[:300])
        os.chmod(f"{PERM}/{f}", 0o644)
shutil.rmtree(PERM, ignore_errors=True)

# a -y that fails leaves no -o folder behind
s.expect_fail("output: -y into a folder that does not exist", "so there is no run to resume", BASE + ["-y", "-o", f"{W}/i21_none"])
s.check("output: ... and does not make it", not os.path.exists(f"{W}/i21_none"), "made")

# the training samples: exactly -g tokens, also above T (the window slides) and at -t 1
for T, g in (("16", "5"), ("16", "40"), ("1", "3")):
    r = s.expect_ok(f"samples: -t {T} -g {g}", BASE + ["-t", T, "-g", g, "-x", "1", "-s", "1", "-k", "", "-o", ""])
    if r:
        ids = (sample_at(r.out, 1) or "").split()
        s.check(f"samples: -t {T} -g {g} prints {g} tokens", len(ids) == int(g), f"{len(ids)} ids: {ids}")

# every byte of a sample printed as UTF-8: a tokenizer whose tokens are pieces of multi-byte
# characters (CJK, emoji, a combining mark) and lone invalid bytes; whatever the model draws,
# the output is valid UTF-8 and holds every character whole or U+FFFD (checked byte for byte
# in test_gpt.c: test_utf8_printer)
PIECES = [b"\xe6", b"\x97\xa5", b"\xe6\x9c", b"\xac", b"\xf0\x9f", b"\x99\x82", b"e\xcc", b"\x81", b"\xff", b"\x80",
          b"\xc3", b"\x9c", "日本語".encode(), "🙂".encode(), b"a", b" "]
UTOK = f"{W}/i21_utf8_tokenizer.bin"
with open(UTOK, "wb") as f:
    f.write(struct.pack("<256i", *([20240328, 2, 64, 63] + [0] * 252)))
    for i in range(64):
        piece = PIECES[i % len(PIECES)]
        f.write(bytes([len(piece)]) + piece)
p = subprocess.run(BASE + ["-k", UTOK, "-x", "1", "-s", "1", "-g", "300", "-t", "32", "-o", ""], capture_output=True, timeout=30)
try:
    text = p.stdout.decode("utf-8")
    valid = True
except UnicodeDecodeError as e:
    text, valid = "", f"{e}"
s.check("utf-8: a sample of split characters and invalid bytes prints as valid UTF-8", p.returncode == 0 and valid is True,
        f"exit code {p.returncode}: {valid}")
s.check("utf-8: ... holding whole characters and U+FFFD", ("日" in text or "本" in text or "🙂" in text) and "\ufffd" in text,
        text[-300:])

# ----------------------------------------------------------------------------
# 16. issue 38: no file of the user's is removed, damage is named, a closed stdout or an out-of-range
# number is no crash

# a file of the user's named like a checkpoint file, with no DONE or WRITING record of this trainer's
# beside it, is never removed as "an incomplete checkpoint": the run stops, naming it
MINE = f"{W}/i38_mine"
os.makedirs(MINE)
shutil.copy(f"{FIX}/model.bin", f"{MINE}/model_00000500.bin")
for extra, what in (([], "a fresh run"), (["--overwrite"], "--overwrite 1"), (["-y"], "-y 1")):
    phrase = "no complete checkpoint" if extra == ["-y"] else "this trainer has no record of writing it"
    s.expect_fail(f"user's file: {what} in a folder holding only the user's model_00000500.bin stops", phrase,
                  BASE + ["-x", "2", "-o", MINE] + extra)
    s.check(f"user's file: ... after {what}, the file is still there, unchanged",
            same_bytes(f"{FIX}/model.bin", f"{MINE}/model_00000500.bin"), os.listdir(MINE))
# beside a complete checkpoint of this trainer's too (-y resumes it, but the user's file still stops it)
if os.path.isdir(A):
    copy_checkpoint(A, 3, MINE)
    s.expect_fail("user's file: ... beside a complete checkpoint, -y stops too, naming it", "model_00000500.bin' is named like a file",
                  RES + ["-o", MINE, "-y"])
    s.check("user's file: ... still there", same_bytes(f"{FIX}/model.bin", f"{MINE}/model_00000500.bin"), os.listdir(MINE))


def damaged(name, file, offset):
    """a copy of run A (checkpoints 3 and 6) in W/NAME with 16 bytes of FILE's checkpoint 6 set to 0x7f at OFFSET"""
    d = f"{W}/{name}"
    shutil.copytree(A, d)
    with open(ckpt(d, *file), "r+b") as f:
        f.seek(offset)
        f.write(b"\x7f" * 16)
    return d


# 16 bytes of a checkpoint file set to 0x7f: the resume names the file as damaged (its checksum) and goes
# back to the newest intact checkpoint, which trains on bit for bit as the straight run
if os.path.isfile(ckpt(A, "state", 6, "_00000.bin")):
    for name, file, offset in (("state file, in its optimizer state", ("state", 6, "_00000.bin"), 4096),
                               ("state file, in its header's data position and RNG", ("state", 6, "_00000.bin"), 4 * 8),
                               ("model file, in its weights", ("model", 6, ".bin"), 4096)):
        d = damaged("i38_" + name.split(",")[0].replace(" ", "_") + str(offset), file, offset)
        r = s.expect_ok(f"damage: 16 bytes of checkpoint 6's {name}: -y resumes", RES + ["-o", d, "-y"])
        if r:
            s.check(f"damage: ... naming the file as damaged and skipping checkpoint 6",
                    f"skipped the checkpoint of step 6 in {d}/" in r.out and f"{ckpt(d, *file)}' is damaged" in r.out, r.out[:600])
            s.check(f"damage: ... from checkpoint 3", f"resumed from {d}/ at step 3" in r.out, r.out[:600])
            s.check(f"damage: ... and trains checkpoint 6 again as the straight run did",
                    same_bytes(ckpt(A, "model", 6, ".bin"), ckpt(d, "model", 6, ".bin")), "model 6 differs")
    # a damaged model file given to -e is named, not trained from
    d = damaged("i38_model_e", ("model", 6, ".bin"), 8192)
    s.expect_fail("damage: -e of a damaged model file stops, naming it", f"model file '{ckpt(d, 'model', 6, '.bin')}' is damaged",
                  BASE + ["-e", ckpt(d, "model", 6, ".bin"), "-o", ""])
    # llm.c's files record no checksum (slots 16-19 are 0): read as before
    plain = f"{W}/i38_llmc_model.bin"
    shutil.copy(ckpt(A, "model", 6, ".bin"), plain)
    with open(plain, "r+b") as f:
        f.seek(4 * 16)
        f.write(bytes(16))
    s.expect_ok("damage: a model file without a checksum (llm.c's) is read as before", BASE + ["-e", plain, "-x", "1", "-o", ""])

# a closed stdout (| head -1) does not stop the run: it trains on, writes its checkpoints and log, exits 0
PIPE = f"{W}/i38_pipe"
p = subprocess.Popen(BASE + ["-x", "30", "-n", "10", "-o", PIPE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
first = p.stdout.readline()
p.stdout.close()  # as head -1 does
err = p.stderr.read()
rc = p.wait(timeout=60)
s.check("closed stdout: the run goes on to its end (exit 0)", rc == 0 and first != "", f"exit code {rc}: {err[-300:]}")
s.check("closed stdout: ... with every step in log.jsonl and its last checkpoint",
        os.path.isfile(ckpt(PIPE, "DONE", 30)) and [x["step"] for x in read_log(PIPE) if "loss" in x] == list(range(1, 31)),
        os.listdir(PIPE) if os.path.isdir(PIPE) else "no -o")
s.check("closed stdout: ... saying so once on stderr", err.count("standard output is closed") == 1, err[-300:])
s.expect_ok("closed stdout: ... and -y then finds the run complete", BASE + ["-x", "30", "-n", "10", "-o", PIPE, "-y"])

# numbers beyond their type are named as such, not as "not an integer" or "out of memory"
s.expect_fail("range: --loss-chunk 2147483648 is beyond an int", "2147483648 is beyond the range of an int",
              BASE + ["--loss-chunk", "2147483648"])
s.expect_fail("range: WORLD_SIZE=1000000000 is more processes than the program runs", "WORLD_SIZE=1000000000: more processes than",
              BASE, env={"RANK": "0", "WORLD_SIZE": "1000000000", "LOCAL_RANK": "0"})

s.finish()
