"""test_checkpoint_ranks.py: a checkpoint of several ranks against kill -9 and damage. One rank of an
`mpirun -np 2` or `-np 3` run (--zero 0, 1, 2 and 3) is killed with SIGKILL at a chosen point of a
checkpoint's write; the next start (-y 1) must resume from the last checkpoint whose files every rank
completed, on every rank the same step, and end bitwise equal to a run never stopped. Where a
checkpoint's files are missing, truncated, of another rank, run or number of ranks, the start skips
it saying why, or stops naming the rank, the file and the fix, and removes nothing. --keep-checkpoints
never removes the last complete checkpoint, and a stop signal just after a resume never rewrites (so
never takes away) the checkpoint it resumed from.

    python3 tests/test_checkpoint_ranks.py ./train_gpt ./test_gpt ./build/fault_inject.so [./build/emu/train_gpt]

The CUDA trainer (the emulated build, when given) writes and resumes through the same code
(llmc/trainer.h): section 6 kills one of its ranks too.

How a rank is killed at a chosen point: build/fault_inject.so (tests/fault_inject.c), preloaded into
every rank (mpirun -x LD_PRELOAD), raises SIGKILL in the process that opens, half writes or renames
the file named in LLMC_FAULT: the state files carry their rank in their names, so exactly that rank
dies there, in the trainer as shipped. mpirun then ends the others (as it does after a real crash).

Every run uses test_gpt's tiny fixture model (L=2 C=32 NH=2 maxT=32 V=64), 6 steps of 192 tokens
with a checkpoint every 2 (2, 4, 6); the kills hit the write of checkpoint 4 (or 6). Tolerances:
none. A resumed run does the same arithmetic in the same order as the run never stopped: its
log.jsonl's losses are the same and its last checkpoint's files the same bytes (a state file's run
identity aside: every run draws its own).
"""

import glob
import os
import re
import shutil
import struct
import sys

import e2e
from e2e import ckpt, latest_done, same_bytes, same_state, train_rows

TRAIN, TESTER, FAULTS, EMU = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/fault_inject.so", "./build/emu/train_gpt"],
                                       optional=1)
s = e2e.Suite("test_checkpoint_ranks", tester=TESTER, run_limit=60)
FIX, W = s.fix, s.root
STEPS, EVERY = 6, 2
FLAGS = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-d", "192", "-x", str(STEPS), "-u", "2", "-v", "0", "-s", "0", "-n", str(EVERY)]
if not os.path.isfile(FAULTS):
    s.fail("fault injection", f"{FAULTS} not found: make build/fault_inject.so")
    s.finish()


def launch(ranks, zero, faults=None, train=TRAIN):
    """the command that starts TRAIN on RANKS ranks (1: no mpirun) with --zero ZERO, and with
    FAULTS (LLMC_FAULT, tests/fault_inject.c) preloaded into every rank"""
    if ranks == 1:
        return [train] + FLAGS
    pre = ["-x", f"LD_PRELOAD={FAULTS}", "-x", f"LLMC_FAULT={faults}"] if faults else []
    return MPIRUN + [str(ranks)] + pre + [train] + FLAGS + ["--zero", str(zero)]


def killed_run(name, ranks, zero, faults, out, rank, extra=(), train=TRAIN):
    """a run of FAULTS into OUT that must die by the SIGKILL of RANK (mpirun names it); the run"""
    env = {"LD_PRELOAD": FAULTS, "LLMC_FAULT": faults} if ranks == 1 else None
    r = s.run(launch(ranks, zero, faults, train) + list(extra) + ["-o", out], env=env)
    if ranks == 1:
        s.check(f"{name}: killed by SIGKILL", r.rc == -9, f"exit code {r.rc}: {r.err[-300:]}")
    else:
        s.check(f"{name}: rank {rank} killed by SIGKILL", r.rc != 0 and re.search(rf"process rank {rank} .* signal 9", r.err),
                f"exit code {r.rc}: {r.err[-300:]}")
    return r


def same_as_reference(name, out, ref, ranks, step=STEPS):
    """OUT's log and checkpoint STEP are those of the run never stopped (REF): losses and norms of
    every step, the model file and each rank's state file (but its run identity) bit for bit"""
    s.check(f"{name}: losses of steps 1..{STEPS} equal to the run never stopped", train_rows(out) == train_rows(ref) != [],
            f"resumed {train_rows(out)} vs {train_rows(ref)}")
    files = [(ckpt(out, "model", step, ".bin"), ckpt(ref, "model", step, ".bin"), same_bytes)]
    files += [(ckpt(out, "state", step, f"_{k:05d}.bin"), ckpt(ref, "state", step, f"_{k:05d}.bin"), same_state) for k in range(ranks)]
    differ = [os.path.basename(a) for a, b, same in files if not same(a, b)]
    s.check(f"{name}: checkpoint {step}'s model and {ranks} state files bitwise equal to the run never stopped", not differ,
            f"differ: {differ}")


def resumed_at(r, out, step):
    return re.search(rf"^resumed from {re.escape(out)}/ at step {step}$", r.out, re.M) is not None


STATE_SLOT_RANKS = 2  # a state file's header slot of the number of ranks that wrote it (llmc/checkpoint.h)


def patch_int(path, slot, value):
    """writes VALUE into int32 header slot SLOT of the state file at PATH, and its checksum to match (what is
    checked here is the header's meaning, not the file's integrity)"""
    with open(path, "r+b") as f:
        f.seek(4 * slot)
        f.write(struct.pack("<i", value))
    e2e.restamp_state(path)


def copy_steps(src, dst, steps, ranks):
    """a run folder DST holding checkpoints STEPS of SRC (every file of each) and its log"""
    os.makedirs(dst)
    for step in steps:
        for f in [ckpt(src, "model", step, ".bin"), ckpt(src, "DONE", step)] + \
                 [ckpt(src, "state", step, f"_{k:05d}.bin") for k in range(ranks)]:
            shutil.copy(f, dst)
    shutil.copy(f"{src}/log.jsonl", dst)


# ----------------------------------------------------------------------------
# 1. one process: a stop signal before the first step of a resumed run leaves its checkpoint alone
# (a rewrite would take its DONE marker away, and a kill then would lose it): here the signal comes
# as the log opens, and a kill waits at the rewrite's model file

REF1 = s.path("ref_np1")
s.expect_ok("1 rank: a run of 6 steps, never stopped", launch(1, 0) + ["-o", REF1])
if os.path.isfile(ckpt(REF1, "DONE", STEPS)):
    ONE = s.path("stop_np1")
    copy_steps(REF1, ONE, [4], 1)
    before = {f: e2e.sha256(f) for f in glob.glob(f"{ONE}/*_00000004*")}
    r = s.run(launch(1, 0) + ["-o", ONE, "-y", "1"],
              env={"LD_PRELOAD": FAULTS, "LLMC_FAULT": "usr1@open:log.jsonl,kill@open:model_00000004.bin.tmp"})
    s.check("1 rank: a stop signal before the first resumed step exits 0, without rewriting checkpoint 4",
            r.rc == 0 and "checkpoint 4, which this run resumed from, is in" in r.out, f"exit code {r.rc}: {r.out[-300:]} {r.err[-300:]}")
    s.check("1 rank: ... checkpoint 4's files and DONE marker untouched",
            {f: e2e.sha256(f) for f in glob.glob(f"{ONE}/*_00000004*") if os.path.isfile(f)} == before, "changed or removed")
    r = s.expect_ok("1 rank: ... and it resumes from there", launch(1, 0) + ["-o", ONE, "-y", "1"])
    if r:
        s.check("1 rank: ... at step 4", resumed_at(r, ONE, 4), r.out[:300])
        same_as_reference("1 rank", ONE, REF1, 1)

MPIRUN, why_not = e2e.mpi_launcher(TRAIN)
if MPIRUN is None:
    s.skip("the multi-rank checks (mpirun -np 2 and 3)", why_not)
    s.finish()

# ----------------------------------------------------------------------------
# 2. the runs never stopped: 2 and 3 ranks, --zero 0, 1, 2 and 3

REF = {}
for ranks in (2, 3):
    for zero in (0, 1, 2, 3):
        REF[ranks, zero] = s.path(f"ref_np{ranks}_z{zero}")
        s.expect_ok(f"{ranks} ranks --zero {zero}: a run of 6 steps, never stopped", launch(ranks, zero) + ["-o", REF[ranks, zero]])

# ----------------------------------------------------------------------------
# 3. kill -9 of one rank at each point of checkpoint 4's write; the next start resumes from the last
# checkpoint every rank completed (2, or 4 once its DONE marker is there), removing what the killed
# write left and saying so, and skips nothing: a kill never leaves a DONE marker without its files

KILLS = [  # ranks, --zero, the rank killed, where (LLMC_FAULT), what the killed write leaves, the step resumed
    (2, 0, 0, "write:model_00000004.bin.tmp", "its model file half written", 2),
    (2, 1, 1, "open:state_00000004_00001.bin.tmp", "before its state file (rank 0's model file written)", 2),
    (2, 2, 0, "open:DONE_00000004.tmp", "every rank's state file in place, no DONE marker", 2),
    (3, 0, 2, "renamed:state_00000004_00002.bin", "its state file in place, before the others are done", 2),
    (3, 1, 1, "write:state_00000004_00001.bin.tmp", "its state file half written", 2),
    (3, 2, 2, "rename:state_00000004_00002.bin", "its state file whole but not in place", 2),
    (3, 1, 0, "renamed:DONE_00000004", "checkpoint 4 complete (its DONE marker in place)", 4),
    # ZeRO-3 writes the model file a slice at a time, each gathered from every rank's blocks: the
    # other ranks are inside a gather when rank 0 dies half-way through it
    (2, 3, 0, "write:model_00000004.bin.tmp", "its model file half written (the others in a gather)", 2),
    (3, 3, 1, "open:state_00000004_00001.bin.tmp", "before its state file (rank 0's model file written)", 2),
]
for ranks, zero, rank, where, left, resume_step in KILLS:
    name = f"{ranks} ranks --zero {zero}: kill -9 of rank {rank} at {where.split(':')[0]} {where.split(':')[1]}"
    out = s.path(f"kill_np{ranks}_z{zero}_r{rank}_{where.split(':')[0]}")
    killed_run(name, ranks, zero, f"kill@{where}", out, rank)
    done_after = latest_done(out)
    s.check(f"{name}: leaves {left}; the newest DONE marker is of step {resume_step}", done_after == resume_step,
            f"newest DONE {done_after}; files {sorted(os.listdir(out))}")
    tmp = [f for f in os.listdir(out) if f.endswith(".tmp")]
    left4 = [f for f in os.listdir(out) if re.fullmatch(r"(model|state)_00000004[_0-9]*\.bin", f)]
    r = s.expect_ok(f"{name}: -y 1 starts", launch(ranks, zero) + ["-o", out, "-y", "1"])
    if not r:
        continue
    s.check(f"{name}: ... resumes from step {resume_step}", resumed_at(r, out, resume_step), r.out[:400])
    s.check(f"{name}: ... skipping no checkpoint", "skipped the checkpoint" not in r.out, r.out[:400])
    said = [f for f in tmp if f"removed '{out}/{f}', a temporary file that a crashed run left" not in r.out]
    s.check(f"{name}: ... saying which temporary files of the killed write it removed ({len(tmp)})", not said, f"not said: {said}")
    if resume_step == 2:  # every file of checkpoint 4 the kill left (not a .tmp) is named as it goes
        unsaid = [f for f in left4 if f"removed '{out}/{f}': a file of an incomplete checkpoint" not in r.out]
        s.check(f"{name}: ... and which files of incomplete checkpoint 4 it removed ({len(left4)})", not unsaid,
                f"not said: {unsaid}; {r.out[:400]}")
    same_as_reference(name, out, REF[ranks, zero], ranks)

# a kill during the rewrite of a checkpoint: a stop signal (SIGUSR1 to rank 0, as the log opens)
# before the first step of a resumed run would make it write again the checkpoint it resumed from,
# its DONE marker removed first; rank 1 killed there would leave the run without it
REW = s.path("stop_np2")
if os.path.isfile(ckpt(REF[2, 1], "DONE", STEPS)):
    copy_steps(REF[2, 1], REW, [4], 2)
    before = {f: e2e.sha256(f) for f in glob.glob(f"{REW}/*_00000004*")}
    r = s.run(launch(2, 1, "usr1@open:log.jsonl,kill@open:state_00000004_00001.bin.tmp") + ["-o", REW, "-y", "1"])
    s.check("2 ranks: a stop signal before the first resumed step exits 0, without rewriting checkpoint 4",
            r.rc == 0 and "checkpoint 4, which this run resumed from, is in" in r.out, f"exit code {r.rc}: {r.out[-300:]} {r.err[-300:]}")
    s.check("2 ranks: ... checkpoint 4's files and DONE marker untouched",
            {f: e2e.sha256(f) for f in glob.glob(f"{REW}/*_00000004*") if os.path.isfile(f)} == before, "changed or removed")
    r = s.expect_ok("2 ranks: ... and it resumes from there", launch(2, 1) + ["-o", REW, "-y", "1"])
    if r:
        s.check("2 ranks: ... at step 4", resumed_at(r, REW, 4), r.out[:300])
        same_as_reference("2 ranks, stopped after the resume", REW, REF[2, 1], 2)

# ----------------------------------------------------------------------------
# 4. a complete checkpoint (DONE marker there) with one rank's file missing, damaged or foreign:
# the start skips it, naming the rank, the file and why, on every rank alike (rank 0 decides), and
# resumes the newest whole one; when there is none it stops, naming the file to put back, and
# removes nothing

DAMAGE = [  # ranks, --zero, what is done to checkpoint 6, the reason the start gives
    (2, 1, "rank 1's state file deleted", lambda d, ref: os.remove(ckpt(d, "state", 6, "_00001.bin")),
     lambda d: f"rank 1's state file '{ckpt(d, 'state', 6, '_00001.bin')}': No such file or directory"),
    (3, 2, "rank 2's state file truncated", lambda d, ref: os.truncate(ckpt(d, "state", 6, "_00002.bin"), 5000),
     lambda d: f"rank 2's state file '{ckpt(d, 'state', 6, '_00002.bin')}' (5000 bytes) is not a whole state file"),
    (3, 0, "rank 1's state file of another run (another identity)",
     lambda d, ref: shutil.copy(ckpt(REF[3, 0] + "_again", "state", 6, "_00001.bin"), ckpt(d, "state", 6, "_00001.bin")),
     lambda d: f"rank 1's state file '{ckpt(d, 'state', 6, '_00001.bin')}' was written by run 0x"),
    (2, 2, "rank 1's state file a copy of rank 0's",
     lambda d, ref: shutil.copy(ckpt(d, "state", 6, "_00000.bin"), ckpt(d, "state", 6, "_00001.bin")),
     lambda d: f"rank 1's state file '{ckpt(d, 'state', 6, '_00001.bin')}' holds rank 0's state of step 6"),
    (3, 1, "rank 1's state file of a 2-rank run", lambda d, ref: shutil.copy(ckpt(REF[2, 1], "state", 6, "_00001.bin"),
                                                                             ckpt(d, "state", 6, "_00001.bin")),
     lambda d: f"rank 1's state file '{ckpt(d, 'state', 6, '_00001.bin')}' was written by one of 2 rank(s), rank 0's by one of 3"),
    (2, 1, "rank 0's state file naming 2^30 ranks", lambda d, ref: patch_int(ckpt(d, "state", 6, "_00000.bin"), STATE_SLOT_RANKS, 1 << 30),
     lambda d: f"rank 0's state file '{ckpt(d, 'state', 6, '_00000.bin')}' says it is one of 1073741824 rank(s): corrupt"),
    (2, 0, "the model file deleted", lambda d, ref: os.remove(ckpt(d, "model", 6, ".bin")),
     lambda d: f"'{ckpt(d, 'model', 6, '.bin')}': No such file or directory"),
]
s.expect_ok("3 ranks --zero 0: the same run again (another run identity)", launch(3, 0) + ["-o", REF[3, 0] + "_again"])
for i, (ranks, zero, what, damage, reason) in enumerate(DAMAGE):
    ref = REF[ranks, zero]
    if not os.path.isfile(ckpt(ref, "DONE", STEPS)):
        s.fail(f"{ranks} ranks --zero {zero}: {what}", "no reference run")
        continue
    name = f"{ranks} ranks --zero {zero}, checkpoint 6 with {what}"
    d = s.path(f"damaged_{i}_np{ranks}_z{zero}")
    copy_steps(ref, d, [4, 6], ranks)
    damage(d, ref)
    r = s.expect_ok(f"{name}: -y 1 starts", launch(ranks, zero) + ["-o", d, "-y", "1"])
    if r:
        s.check(f"{name}: ... saying it skipped checkpoint 6 and why", f"skipped the checkpoint of step 6 in {d}/: {reason(d)}" in r.out,
                r.out[:500])
        s.check(f"{name}: ... and that its files stay until this run writes a checkpoint of step 6 over them",
                "the skipped ones' files stay until this run writes\n  a checkpoint of the same step over them" in r.out, r.out[:500])
        s.check(f"{name}: ... resumes from step 4 (every rank: the run ends like the one never stopped)", resumed_at(r, d, 4), r.out[:400])
        same_as_reference(name, d, ref, ranks)
    # the damaged checkpoint alone: nothing to resume; the message names the file and the fix
    alone = d + "_alone"
    copy_steps(ref, alone, [6], ranks)
    damage(alone, ref)
    bad = re.search(r"rank (\d)'s state file", reason(alone))
    fix = (f"put rank {bad.group(1)}'s state file of step 6 back from a copy, as '{ckpt(alone, 'state', 6, f'_0000{bad.group(1)}.bin')}'"
           if bad else f"put the model file of step 6 back from a copy, as '{ckpt(alone, 'model', 6, '.bin')}'")
    r = s.expect_fail(f"{name} and no other: stops, naming the file and why, removing nothing", f"the newest, of step 6: {reason(alone)}",
                      launch(ranks, zero) + ["-o", alone, "-y", "1"])
    s.check(f"{name} and no other: ... and the fix", fix in r.err, r.err[-400:])

# another number of ranks than wrote the checkpoint (llmc/relayout.h reads every old rank's state file):
# 3 ranks' checkpoint 6 without rank 2's state file, resumed on 2 ranks, is skipped as on 3, and checkpoint
# 4 resumes onto the 2 ranks, ending where the 3 ranks' straight run does (the same windows each step)
if os.path.isfile(ckpt(REF[3, 1], "DONE", STEPS)):
    d = s.path("np3_on_np2")
    copy_steps(REF[3, 1], d, [4, 6], 3)
    os.remove(ckpt(d, "state", 6, "_00002.bin"))
    r = s.expect_ok("a 3-rank checkpoint 6 without rank 2's state file, -y 1 on 2 ranks", launch(2, 1) + ["-o", d, "-y", "1"])
    if r:
        s.check("... skips checkpoint 6 naming rank 2's file", "skipped the checkpoint of step 6" in r.out and "_00002.bin" in r.out, r.out[:500])
        s.check("... resumes checkpoint 4 onto the 2 ranks", resumed_at(r, d, 4) and "assembled from the checkpoint's state files" in r.out,
                r.out[:500])
        c = s.run([TESTER, "--compare-models", ckpt(REF[3, 1], "model", STEPS, ".bin"), ckpt(d, "model", STEPS, ".bin"), "1e-5"])
        s.check(f"... and ends within 1e-5 of the 3 ranks' straight run ({c.out.strip()})", c.rc == 0, c.out + c.err[-300:])

# ----------------------------------------------------------------------------
# 5. --keep-checkpoints never removes the last complete checkpoint: a newer one that -y 1 skipped as
# damaged does not count among the kept. Here checkpoint 6 lacks rank 1's file; the run resumes at 4
# with --keep-checkpoints 1 -n 1 and writes 5 (which stays: 4 and 2 go), and rank 0 is killed as it
# rewrites 6; the next start finds 5

KEEP = s.path("keep_np2")
if os.path.isfile(ckpt(REF[2, 1], "DONE", STEPS)):
    copy_steps(REF[2, 1], KEEP, [2, 4, 6], 2)
    os.remove(ckpt(KEEP, "state", 6, "_00001.bin"))
    killed_run("2 ranks --keep-checkpoints 1, checkpoint 6 damaged: resumed at 4, killed rewriting 6", 2, 1,
               "kill@open:model_00000006.bin.tmp", KEEP, 0, ["-y", "1", "--keep-checkpoints", "1", "-n", "1"])
    s.check("... checkpoint 5, the one it wrote, is kept (and 4 and 2 removed)",
            os.path.isfile(ckpt(KEEP, "DONE", 5)) and not glob.glob(f"{KEEP}/*_0000000[24]*"), f"files {sorted(os.listdir(KEEP))}")
    r = s.expect_ok("... -y 1 starts", launch(2, 1) + ["-o", KEEP, "-y", "1"])
    if r:
        s.check("... and resumes from step 5", resumed_at(r, KEEP, 5), r.out[:400])
        same_as_reference("2 ranks --keep-checkpoints 1", KEEP, REF[2, 1], 2)

# ----------------------------------------------------------------------------
# 6. the CUDA trainer (emulated device): the same write and resume. One rank killed half writing its
# state file (2 ranks, --zero 1), rank 0 killed before the DONE marker (3 ranks, --zero 0); each
# resumes from 2 and ends bitwise equal to the CUDA trainer's run never stopped

if EMU is None or not os.path.isfile(EMU):
    s.skip("the CUDA trainer's checkpoints (emulated device)", "no ./build/emu/train_gpt given: make build/emu/train_gpt")
else:
    for ranks, zero, rank, where in ((2, 1, 1, "write:state_00000004_00001.bin.tmp"), (3, 0, 0, "open:DONE_00000004.tmp")):
        name = f"CUDA trainer, {ranks} ranks --zero {zero}: kill -9 of rank {rank} at {where.split(':')[0]} {where.split(':')[1]}"
        ref, out = s.path(f"emu_ref_np{ranks}_z{zero}"), s.path(f"emu_kill_np{ranks}_z{zero}")
        if not s.expect_ok(f"CUDA trainer, {ranks} ranks --zero {zero}: a run of 6 steps, never stopped",
                           launch(ranks, zero, train=EMU) + ["-o", ref]):
            continue
        killed_run(name, ranks, zero, f"kill@{where}", out, rank, train=EMU)
        s.check(f"{name}: the newest DONE marker is of step 2", latest_done(out) == 2, f"files {sorted(os.listdir(out))}")
        r = s.expect_ok(f"{name}: -y 1 starts", launch(ranks, zero, train=EMU) + ["-o", out, "-y", "1"])
        if r:
            s.check(f"{name}: ... resumes from step 2, skipping nothing", resumed_at(r, out, 2) and "skipped" not in r.out, r.out[:400])
            same_as_reference(name, out, ref, ranks)

s.finish()
