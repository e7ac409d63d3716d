"""test_zero.py: data parallelism over MPI (--zero 0, 1, 2 and 3) end to end: N ranks train like
one rank with the same global batch, ZeRO-1 like --zero 0, the ranks hold the same weights, each
rank keeps 1/N of the optimizer state, checkpoints resume bitwise, a stop by SIGUSR1 checkpoints
every rank, and the misuses stop with a clear message. --zero 2 (ZeRO-2, section 2c) keeps a shard
of the gradients: it trains as --zero 0 (bit for bit where the additions are the same), its memory
is the plan, its collectives are counted, and its state files are ZeRO-1's. --zero 3 (ZeRO-3,
section 2d) keeps a shard of the weights too, gathered layer by layer: the same checks, its weight
gathers bounded per layer, recompute on top, and resume across the stages. Last, the grid of
tensor- and data-parallel groups (build/test_dist_grid on 4 ranks: each group's collectives).

    python3 tests/test_zero.py ./train_gpt ./test_gpt ./build/train_gpt_nompi

Every run uses test_gpt's tiny fixture model (L=2 C=32 NH=2 maxT=32 V=64), 10 steps of 192 tokens
(6 micro-batches of B*T = 32: 6, 3 or 2 per rank on 1, 2 or 3 ranks). Prints "ok   name" or
"FAIL name: detail" per check and, last, "N passed, N failed"; without mpirun (or with a train_gpt
built without MPI) the multi-rank part is skipped and counted: "N passed, N failed, 1 skipped".
Losses and memory are read from the runs' log.jsonl.

Tolerances. Runs on different numbers of ranks add the micro-batch gradients in another order,
so they agree to rounding: losses to LOSS_RTOL, weights to MODEL_RTOL. The runs use --eps1 1e-12
for Adafactor and CAME (as dev/reference does): the key biases (rows C..2C-1 of qkvb) have a
gradient that is zero in exact arithmetic, and with the papers' eps1 = 1e-30 the two optimizers
normalise its rounding noise into steps of about lr, which also moves the RMS clipping of their
qkvb slices. Section 2b runs eps1 = 1e-30 too, held to FACTORED_MODEL_RTOL (test_gpt
--compare-models leaves the key biases out and prints them apart). At the same number of ranks
--zero 1 and --zero 0 add in the same order and must agree to MODEL_RTOL (in practice bit for bit).
"""

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import e2e
from e2e import ckpt, kill_group, latest_done, memory_record, same_bytes, train_rows

TRAIN, TESTER, NOMPI = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/train_gpt_nompi"])
s = e2e.Suite("test_zero", tester=TESTER, run_limit=60)
FIX, W = s.fix, s.root
LOSS_RTOL = 2e-6  # log.jsonl prints 6 decimals: 1e-6 absolute is 2.4e-7 of a loss of 4.2
MODEL_RTOL = "1e-6"           # as test_gpt --compare-models reads it
FACTORED_MODEL_RTOL = "1e-4"

FLAGS = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-d", "192", "-x", "10", "-u", "2", "-v", "0", "-s", "0", "-n", "5"]
BASE = [TRAIN] + FLAGS
EPS1 = ["--eps1", "1e-12"]  # Adafactor's and CAME's (AdamW refuses it: it does not read it)
OPTIMIZERS = {"adamw": ["adamw"], "adafactor": ["adafactor"] + EPS1,
              "adafactor+beta1": ["adafactor", "--adafactor-beta1", "0.9"] + EPS1, "came": ["came"] + EPS1}


def planned_mib(out, row):
    """the planned MiB of a row of a printed memory table. --plan writes no log (it writes
    nothing), so this is the one number the suites still read from a drawn table"""
    m = re.search(rf"^\| {re.escape(row)} +\| +([0-9.]+) MiB", out, re.M)
    return float(m.group(1)) if m else None


# ----------------------------------------------------------------------------
# 1. without MPI: the single-process build refuses --zero 1; any build refuses --zero 2; --plan
# for N ranks needs no ranks

s.expect_fail("no MPI build: --zero 1 needs mpirun", "built without MPI, so it needs mpirun",
              [NOMPI] + FLAGS + ["--zero", "1", "-o", ""])
s.expect_fail("--plan-ranks without --plan is refused", "only goes with --plan",
              [NOMPI] + FLAGS + ["--plan-ranks", "2", "-o", ""])
s.expect_fail("--zero 4 is refused", "--zero 4: unknown; choose 0", BASE + ["--zero", "4", "-o", ""])
s.expect_fail("no MPI build: --zero 2 needs mpirun", "--zero 2 shards the optimizer state across MPI ranks, but this train_gpt was built without MPI",
              [NOMPI] + FLAGS + ["--zero", "2", "-o", ""])
# started by a launcher of several processes (mpirun, mpiexec, srun: their variables), the build
# without MPI stops before it trains, naming the rebuild: else each process would train alone
# (srun's variables come as a set: the CPU trainer, which has no NCCL, cannot join them without MPI)
for var in ("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", "PMI_SIZE=3", "PMI_RANK=2", "PMIX_RANK=1",
            "SLURM_STEP_NUM_TASKS=2,SLURM_PROCID=1,SLURM_LOCALID=1"):
    env = dict(v.split("=") for v in var.split(","))
    s.expect_fail(f"no MPI build started with {var}: stops at start-up, naming the rebuild",
                  "built without MPI: each would train alone", [NOMPI] + FLAGS + ["-o", s.path(f"nompi_{next(iter(env))}")],
                  env=env)
# one process: the launcher's count of 1, rank 0, or sbatch's/salloc's SLURM_NTASKS for the job's shell
for env in ({"OMPI_COMM_WORLD_SIZE": "1"}, {"PMIX_RANK": "0"}, {"SLURM_NTASKS": "4"}):
    s.expect_ok(f"no MPI build started with {' '.join(f'{k}={v}' for k, v in env.items())}: trains (one process)",
                [NOMPI] + FLAGS + ["-x", "1", "-o", s.path(f"nompi_one_{next(iter(env))}")], env=env)
r = s.expect_ok("no MPI build: --plan --zero 1 --plan-ranks 2 (planning on a laptop)",
                [NOMPI, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--zero", "1", "--plan-ranks", "2"])
if r:
    s.check("... prints the ZeRO-1 optimizer row", "ZeRO-1 block" in r.out,
            [line for line in r.out.splitlines() if "optimizer state" in line])
r1 = s.expect_ok("--plan -e d12 --optimizer adamw, 1 rank", [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64"])
if r1:
    r2 = s.expect_ok("--plan -e d12 --zero 1 --plan-ranks 2",
                     [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--zero", "1", "--plan-ranks", "2"])
    if r2:
        one, two = planned_mib(r1.out, "optimizer state"), planned_mib(r2.out, "optimizer state")
        if one is None or two is None:
            s.fail("d12 AdamW state per rank on 2 ranks vs 1", "no 'optimizer state' row in the --plan output")
        else:
            s.check(f"d12 AdamW state per rank: {two:.2f} MiB on 2 ranks vs {one:.2f} MiB on 1",
                    one / 2 <= two <= one / 2 + 1, "not about half")

MPIRUN, why_not = e2e.mpi_launcher(TRAIN)
if MPIRUN is None:
    s.skip("the multi-rank checks (mpirun -np 2 and 3)", why_not)
    s.finish()

s.expect_fail("--zero 1 with one process (no mpirun)", "but this run has 1 rank", BASE + ["--zero", "1", "-o", ""])
# srun without a PMI that MPI understands: the CPU trainer (no NCCL) cannot join its processes without MPI
s.expect_fail("the MPI build started as one of 2 processes that MPI does not join: stops", "more processes than the 1 that MPI joined",
              BASE + ["-o", s.path("mpi_apart")], env={"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
s.expect_fail("--zero 2 with one process (no mpirun)", "--zero 2 shards the optimizer state across ranks, but this run has 1 rank",
              BASE + ["--zero", "2", "-o", ""])
s.expect_fail("--zero 1 under mpirun -np 1", "but this run has 1 rank",
              MPIRUN + ["1"] + BASE + ["--zero", "1", "-o", ""])
s.expect_fail("memory check counts every rank on this machine", "2 rank(s) on this machine",
              MPIRUN + ["2"] + BASE + ["-e", "d48", "-b", "64", "-t", "1024", "-d", "-1", "-o", ""])
s.expect_fail("-d must be a multiple of B*T x ranks", "B*T times the ranks = 32 x 2 = 64",
              MPIRUN + ["2"] + BASE + ["-d", "96", "-o", ""])

# ----------------------------------------------------------------------------
# 2. each optimizer: 1 rank, then 2 ranks with --zero 0 and --zero 1


def losses_close(name, a, b):
    """every step's loss (log.jsonl) within LOSS_RTOL"""
    la, lb = [row[1] for row in train_rows(a)], [row[1] for row in train_rows(b)]
    if len(la) != 10 or len(lb) != 10:
        return s.fail(f"{name}: losses of the 10 steps agree", f"steps logged: {len(la)} and {len(lb)}")
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    s.check(f"{name}: losses of the 10 steps agree (worst {worst:.2e} relative)", worst <= LOSS_RTOL,
            f"worst {worst:.2e} > {LOSS_RTOL}")


def models_close(name, a, b, rtol):
    """the final models within RTOL (relative L2, test_gpt --compare-models)"""
    r = s.run([TESTER, "--compare-models", ckpt(a, "model", 10, ".bin"), ckpt(b, "model", 10, ".bin"), rtol])
    detail = r.out.strip()
    s.check(f"{name}: final weights agree to {rtol} ({detail.removeprefix('models: ')})", r.rc == 0,
            f"exit code {r.rc}: {detail} {r.err[:300]}")


def state_floats(path):
    """optimizer floats of a state file (its size less the 1 KiB header)"""
    return (os.path.getsize(path) - 1024) // 4 if os.path.isfile(path) else -1


def planned(run_dir, key):
    try:
        return memory_record(run_dir)["planned"][key]
    except (OSError, ValueError, KeyError):
        return None


FIX_LAYERS, MICRO_BATCHES = 2, 6   # the fixture's L; -d 192 / (B*T = 32)
ZERO1_LINE = re.compile(r"^ZeRO-1: step 1: (\d+) collectives in all \(L = (\d+)\)$", re.M)


def zero1_counts(name, r, sums_free):
    """ZeRO-1's exchange a layer at a time: L + 4 reduce-scatters (a layer's blocks packed rank by rank,
    and the head's 4 slices) and as many all-gathers, and the norm's and the loss's sums; an optimizer
    with sums over a slice (Adafactor, CAME) adds up to 5 a slice"""
    m = ZERO1_LINE.search(r.out)
    if not m:
        return s.fail(f"{name}: the ZeRO-1 line", "no 'ZeRO-1: step 1:' line")
    total, L = map(int, m.groups())
    bound = 2 * (L + 4) + 2 + (0 if sums_free else 5 * (4 + 12 * L))
    s.check(f"{name}: {total} collectives in step 1 <= 2(L + 4) + 2{'' if sums_free else ' + 5 per slice'} = {bound} "
            f"(a slice at a time would be 2(4 + 12L) = {2 * (4 + 12 * L)} for the exchange alone)", total <= bound, "more")


for name, opt in OPTIMIZERS.items():
    D1, D2, DZ = f"{W}/{name}_n1", f"{W}/{name}_n2z0", f"{W}/{name}_n2z1"
    if not s.expect_ok(f"{name}: 1 rank", BASE + ["--optimizer", *opt, "-o", D1]):
        continue
    if not s.expect_ok(f"{name}: mpirun -np 2 --zero 0",
                       MPIRUN + ["2"] + BASE + ["--optimizer", *opt, "--zero", "0", "-o", D2]):
        continue
    rz = s.expect_ok(f"{name}: mpirun -np 2 --zero 1",
                     MPIRUN + ["2"] + BASE + ["--optimizer", *opt, "--zero", "1", "-o", DZ])
    if not rz:
        continue
    losses_close(f"{name}: 2 ranks --zero 0 vs 1 rank", D1, D2)
    losses_close(f"{name}: 2 ranks --zero 1 vs 1 rank", D1, DZ)
    models_close(f"{name}: 2 ranks --zero 0 vs 1 rank", D1, D2, MODEL_RTOL)
    models_close(f"{name}: 2 ranks --zero 1 vs 1 rank", D1, DZ, MODEL_RTOL)
    models_close(f"{name}: --zero 1 vs --zero 0 on 2 ranks", D2, DZ, MODEL_RTOL)
    s.check(f"{name}: --zero 1 replica check passes",
            re.search(r"^replicas: parameters identical on 2 ranks after step 10 ", rz.out, re.M),
            "no 'replicas: parameters identical on 2 ranks'")
    s.check_memory(f"{name}: --zero 1 optimizer memory measured = planned", DZ)
    zero1_counts(f"{name} --zero 1", rz, name == "adamw")
    # one state file per rank, each half of one rank's: every slice's rows (and a matrix's column
    # statistics) are cut in two, and the fixture's sizes are even (no padding)
    n1 = state_floats(ckpt(D1, "state", 10, "_00000.bin"))
    r0, r1 = state_floats(ckpt(DZ, "state", 10, "_00000.bin")), state_floats(ckpt(DZ, "state", 10, "_00001.bin"))
    s.check(f"{name}: --zero 1 keeps 1/2 of the optimizer state per rank ({r0} and {r1} of {n1} floats)",
            n1 > 0 and r0 == r1 and 2 * r0 == n1, "not n1/2 each")
    p1, pz = planned(D1, "optimizer_state"), planned(DZ, "optimizer_state")
    s.check(f"{name}: --zero 1 plans 1/2 of the optimizer state per rank ({pz} of {p1} bytes)",
            p1 and pz and 2 * pz == p1, "not p1/2")

# uneven blocks: 3 ranks cut C = 32 into 11 + 11 + 10 rows and V = 64 into 22 + 22 + 20
D1, D3 = f"{W}/came_n1", f"{W}/came_n3z1"
if s.expect_ok("came: mpirun -np 3 --zero 1 (uneven blocks)",
               MPIRUN + ["3"] + BASE + ["--optimizer", *OPTIMIZERS["came"], "--zero", "1", "-o", D3]):
    losses_close("came: 3 ranks --zero 1 vs 1 rank", D1, D3)
    models_close("came: 3 ranks --zero 1 vs 1 rank", D1, D3, MODEL_RTOL)
    states = [ckpt(D3, "state", 10, f"_{r:05d}.bin") for r in range(3)]
    sizes = {os.path.getsize(p) for p in states if os.path.isfile(p)}
    s.check("came: 3 ranks: three state files of equal size", all(map(os.path.isfile, states)) and len(sizes) == 1,
            f"sizes differ or missing: {sizes}")
    n1, r = state_floats(ckpt(D1, "state", 10, "_00000.bin")), state_floats(states[0])
    s.check(f"came: 3 ranks keep 1/3 of the state each, plus padding ({r} of {n1} floats: at most 3% over)",
            n1 > 0 and 3 * r >= n1 and 300 * r <= 103 * n1, "beyond")
    s.check_memory("came: 3 ranks --zero 1: measured memory equals the plan", D3)

# 2b. the papers' eps1 = 1e-30: the same, to FACTORED_MODEL_RTOL (see the top)
for opt in ("adafactor", "came"):
    D1, DZ = f"{W}/{opt}_eps30_n1", f"{W}/{opt}_eps30_n2z1"
    if not s.expect_ok(f"{opt} eps1 1e-30: 1 rank", BASE + ["--optimizer", opt, "--eps1", "1e-30", "-o", D1]):
        continue
    if not s.expect_ok(f"{opt} eps1 1e-30: mpirun -np 2 --zero 1",
                       MPIRUN + ["2"] + BASE + ["--optimizer", opt, "--eps1", "1e-30", "--zero", "1", "-o", DZ]):
        continue
    losses_close(f"{opt} eps1 1e-30: 2 ranks --zero 1 vs 1 rank", D1, DZ)
    models_close(f"{opt} eps1 1e-30: 2 ranks --zero 1 vs 1 rank", D1, DZ, FACTORED_MODEL_RTOL)

# ----------------------------------------------------------------------------
# 2c. ZeRO-2 (--zero 2): each rank keeps its blocks of the reduced gradients only (a shard of
# about P/N floats), reduce-scattered during the backward, every micro-step: one collective a
# layer and one per head slice (wte, wpe, lnfw, lnfb). With accumulation (3 micro-steps a rank
# here) the micro-steps' sums are added to the shard in another order than --zero 0 adds them
# (each rank's micro-steps first): MODEL_RTOL. With one micro-step a rank on 2 ranks the additions
# are the same (a + b): bit for bit.

ZERO_LINE = re.compile(r"^ZeRO-([23]): step 1: (\d+) gradient reduce-scatters, (\d+) weight all-gathers, (\d+) collectives in all "
                       r"\(L = (\d+)\); gradients per rank: shard (\d+) of (\d+) floats, working buffer (\d+), pack (\d+)"
                       r"(?:; weights per rank: shard (\d+), working copy (\d+))?$", re.M)


def zero2_counts(name, r, ranks, micro_batches=MICRO_BATCHES):
    """the step-1 line: the gradients' collectives exactly micro-steps x (L + 4), all of them
    bounded (the norm, the optimizer's sums and the weights' gathers: a few per slice), and the
    shard at most 1/N of the gradients plus the blocks' padding"""
    m = ZERO_LINE.search(r.out)
    if not m or m.group(1) != "2":
        return s.fail(f"{name}: the ZeRO-2 line", "no 'ZeRO-2: step 1:' line")
    rs, gathers, total, L, shard, P, working, pack = map(int, m.groups()[1:9])
    s.check(f"{name}: no weight all-gathers during the step (ZeRO-2 gathers after the update)", gathers == 0, f"{gathers}")
    micro = micro_batches // ranks
    slices = 4 + 12 * L
    s.check(f"{name}: {rs} gradient reduce-scatters in step 1 = {micro} micro-steps x (L + 4)", rs == micro * (L + 4), "not")
    s.check(f"{name}: {total} collectives in step 1 <= reduce-scatters + 2 + 5 per slice ({rs} + 2 + 5 x {slices})",
            total <= rs + 2 + 5 * slices, "more")
    if name.startswith("adamw"):  # no sums in the update: the weights' all-gathers a layer at a time, L + 4
        s.check(f"{name}: {total} collectives in step 1 <= reduce-scatters + (L + 4) all-gathers + 2 ({rs} + {L + 4} + 2)",
                total <= rs + L + 4 + 2, "more: not a layer at a time")
    gone = 1 - shard / P
    s.check(f"{name}: the reduced gradients kept: {shard} of {P} floats ({gone:.1%} gone, >= (N-1)/N less padding; "
            f"besides the backward's working buffer {working} and pack {pack})",
            shard * ranks <= P and gone >= (ranks - 1) / ranks - 0.02, "more than 1/N")


for name, opt in OPTIMIZERS.items():
    D2, DZ2 = f"{W}/{name}_n2z0", f"{W}/{name}_n2z2"
    rz = s.expect_ok(f"{name}: mpirun -np 2 --zero 2", MPIRUN + ["2"] + BASE + ["--optimizer", *opt, "--zero", "2", "-o", DZ2])
    if not rz or not os.path.isdir(D2):
        continue
    losses_close(f"{name}: 2 ranks --zero 2 vs --zero 0", D2, DZ2)
    models_close(f"{name}: --zero 2 vs --zero 0 on 2 ranks (3 micro-steps: summed in another order)", D2, DZ2, MODEL_RTOL)
    s.check(f"{name}: --zero 2 replica check passes",
            re.search(r"^replicas: parameters identical on 2 ranks after step 10 ", rz.out, re.M), "no 'replicas: parameters identical'")
    s.check_memory(f"{name}: --zero 2 memory (gradients and optimizer) measured = planned", DZ2)
    zero2_counts(f"{name} --zero 2", rz, 2)
    p0, p2 = planned(D2, "gradients"), planned(DZ2, "gradients")
    s.check(f"{name}: --zero 2 plans its gradient buffers ({p2} bytes; --zero 0: {p0})", p0 and p2 and p2 != p0, "the same as --zero 0")

# one micro-step a rank on 2 ranks: the same additions as --zero 0, bit for bit
ONE = ["-d", "64"]
for z in ("0", "2"):
    s.expect_ok(f"adamw: mpirun -np 2 --zero {z}, one micro-step a rank", MPIRUN + ["2"] + BASE + ONE + ["--zero", z, "-o", f"{W}/one_z{z}"])
s.check("adamw: --zero 2 = --zero 0 bit for bit on 2 ranks with one micro-step a rank (model at step 10)",
        same_bytes(ckpt(f"{W}/one_z0", "model", 10, ".bin"), ckpt(f"{W}/one_z2", "model", 10, ".bin")), "cmp differs")

# 3 ranks: uneven blocks (padding), MPI's order of three sums: MODEL_RTOL


def came_three_ranks(z, counts):
    """CAME on 3 ranks with --zero z against one rank and against --zero z - 1 on 3 ranks"""
    D1, D3 = f"{W}/came_n1", f"{W}/came_n3z{z}"
    r3 = s.expect_ok(f"came: mpirun -np 3 --zero {z} (uneven blocks)",
                     MPIRUN + ["3"] + BASE + ["--optimizer", *OPTIMIZERS["came"], "--zero", str(z), "-o", D3])
    if r3:
        losses_close(f"came: 3 ranks --zero {z} vs 1 rank", D1, D3)
        models_close(f"came: 3 ranks --zero {z} vs 1 rank", D1, D3, MODEL_RTOL)
        models_close(f"came: 3 ranks --zero {z} vs --zero {z - 1}", f"{W}/came_n3z{z - 1}", D3, MODEL_RTOL)
        s.check_memory(f"came: 3 ranks --zero {z}: measured memory equals the plan (padding counted)", D3)
        counts(f"came 3 ranks --zero {z}", r3, 3)


came_three_ranks(2, zero2_counts)

# the activation flags on top: recompute, activation offload, flash attention, the chunked loss
ACT = ["--recompute", "1,attn", "--offload", "activations", "--attention", "flash", "--loss-chunk", "8"]
for z in ("0", "2"):
    s.expect_ok(f"adafactor: mpirun -np 2 --zero {z} with {' '.join(ACT)}",
                MPIRUN + ["2"] + BASE + ["--optimizer", *OPTIMIZERS["adafactor"], *ACT, "--zero", z, "-o", f"{W}/act_z{z}"])
models_close("adafactor with the activation flags: --zero 2 vs --zero 0", f"{W}/act_z0", f"{W}/act_z2", MODEL_RTOL)
s.check_memory("adafactor with the activation flags, --zero 2: measured = planned", f"{W}/act_z2")

# --plan: a rank's gradients at d12 on 8 ranks
r0 = s.expect_ok("--plan -e d12, 1 rank", [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64"])
r = s.expect_ok("--plan -e d12 --zero 2 --plan-ranks 8", [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--zero", "2", "--plan-ranks", "8"])
if r and r0:
    g0, g2 = planned_mib(r0.out, "gradients"), planned_mib(r.out, "gradients")
    s.check(f"d12 gradients per rank: {g2} MiB on 8 ranks with --zero 2 vs {g0} MiB on 1 (the working buffer: wte, wpe, a layer)",
            g0 and g2 and g2 < 0.6 * g0, "not below 0.6x")

# ----------------------------------------------------------------------------
# 2d. ZeRO-3 (--zero 3): the weights sharded too, in the gradient shard's layout; wte, wpe, lnf are
# gathered once a step and each layer before its forward and its backward (and each recompute).
# The gradients travel as ZeRO-2's and the update is ZeRO-1's on compact blocks, so the sums are
# ZeRO-2's: MODEL_RTOL against --zero 0 with accumulation, bit for bit with one micro-step on 2 ranks.


def zero3_counts(name, r, ranks, micro_batches=MICRO_BATCHES, recomputed=0):
    """the step-1 line: gradients' collectives exactly as ZeRO-2's; the weights' all-gathers between
    one a layer per micro-step and two (its forward and its backward, plus each recompute), plus the
    head's four once; the weight shard at most 1/N of the weights plus the blocks' padding"""
    m = ZERO_LINE.search(r.out)
    if not m or m.group(1) != "3" or m.group(10) is None:
        return s.fail(f"{name}: the ZeRO-3 line", "no 'ZeRO-3: step 1: ... weights per rank' line")
    rs, gathers, total, L, shard, P, working, pack, wshard, wworking = map(int, m.groups()[1:11])
    micro = micro_batches // ranks
    slices = 4 + 12 * L
    s.check(f"{name}: {rs} gradient reduce-scatters in step 1 = {micro} micro-steps x (L + 4)", rs == micro * (L + 4), "not")
    lo, hi = 4 + micro * L, 4 + micro * (2 * L + recomputed)
    s.check(f"{name}: {gathers} weight all-gathers in step 1, within 4 + micro-steps x L = {lo} and "
            f"4 + micro-steps x (2L + recomputed layers) = {hi}", lo <= gathers <= hi, "outside")
    s.check(f"{name}: {total} collectives in step 1 <= reduce-scatters + all-gathers + 2 + 5 per slice "
            f"({rs} + {gathers} + 2 + 5 x {slices})", total <= rs + gathers + 2 + 5 * slices, "more")
    if name.startswith("adamw"):  # no sums in the update, and nothing gathered after it
        s.check(f"{name}: {total} collectives in step 1 = reduce-scatters + all-gathers + 2 ({rs} + {gathers} + 2)",
                total == rs + gathers + 2, "not")
    gone = 1 - wshard / P
    s.check(f"{name}: the weights kept: a shard of {wshard} of {P} floats ({gone:.1%} gone, >= (N-1)/N less padding; "
            f"besides the working copy of {wworking}: wte, wpe, lnf and one layer)",
            wshard == shard and wshard * ranks <= P + 64 * ranks and gone >= (ranks - 1) / ranks - 0.02, "more than 1/N")


for name, opt in OPTIMIZERS.items():
    D2, DZ3 = f"{W}/{name}_n2z0", f"{W}/{name}_n2z3"
    rz = s.expect_ok(f"{name}: mpirun -np 2 --zero 3", MPIRUN + ["2"] + BASE + ["--optimizer", *opt, "--zero", "3", "-o", DZ3])
    if not rz or not os.path.isdir(D2):
        continue
    losses_close(f"{name}: 2 ranks --zero 3 vs --zero 0", D2, DZ3)
    models_close(f"{name}: --zero 3 vs --zero 0 on 2 ranks (3 micro-steps: summed in another order)", D2, DZ3, MODEL_RTOL)
    models_close(f"{name}: --zero 3 vs --zero 2 on 2 ranks (the same sums)", f"{W}/{name}_n2z2", DZ3, MODEL_RTOL)
    s.check_memory(f"{name}: --zero 3 memory (weights, gradients, optimizer) measured = planned", DZ3)
    s.check(f"{name}: --zero 3 has no whole copy of the weights, not even for checkpoints (host copies planned and measured: 0)",
            planned(DZ3, "host_copies") == 0, f"{planned(DZ3, 'host_copies')} bytes")
    zero3_counts(f"{name} --zero 3", rz, 2)
    p0, p3 = planned(D2, "parameters"), planned(DZ3, "parameters")
    s.check(f"{name}: --zero 3 plans its weight buffers ({p3} bytes; --zero 0: {p0})", p0 and p3 and p3 != p0, "the same as --zero 0")

s.expect_ok("adamw: mpirun -np 2 --zero 3, one micro-step a rank", MPIRUN + ["2"] + BASE + ONE + ["--zero", "3", "-o", f"{W}/one_z3"])
s.check("adamw: --zero 3 = --zero 0 bit for bit on 2 ranks with one micro-step a rank (model at step 10)",
        same_bytes(ckpt(f"{W}/one_z0", "model", 10, ".bin"), ckpt(f"{W}/one_z3", "model", 10, ".bin")), "cmp differs")

came_three_ranks(3, zero3_counts)

# recompute (segments of one layer: every layer's forward again in the backward), activation offload,
# flash attention and the chunked loss on top: each layer gathered for its recompute
r = s.expect_ok(f"adafactor: mpirun -np 2 --zero 3 with {' '.join(ACT)}",
                MPIRUN + ["2"] + BASE + ["--optimizer", *OPTIMIZERS["adafactor"], *ACT, "--zero", "3", "-o", f"{W}/act_z3"])
models_close("adafactor with the activation flags: --zero 3 vs --zero 0", f"{W}/act_z0", f"{W}/act_z3", MODEL_RTOL)
s.check_memory("adafactor with the activation flags, --zero 3: measured = planned", f"{W}/act_z3")
if r:
    zero3_counts("adafactor --zero 3 with recompute", r, 2, recomputed=FIX_LAYERS)
SQRT = ["--recompute", "sqrt"]
for z in ("0", "3"):
    s.expect_ok(f"adamw: mpirun -np 2 --zero {z} --recompute sqrt", MPIRUN + ["2"] + BASE + SQRT + ["--zero", z, "-o", f"{W}/sqrt_z{z}"])
models_close("adamw --recompute sqrt: --zero 3 vs --zero 0", f"{W}/sqrt_z0", f"{W}/sqrt_z3", MODEL_RTOL)
s.check_memory("adamw --recompute sqrt, --zero 3: measured = planned", f"{W}/sqrt_z3")

s.expect_fail("--zero 3 refuses --check-replicas (no replicas to compare)", "the ranks hold no replicas",
              MPIRUN + ["2"] + BASE + ["--zero", "3", "--check-replicas", "-o", ""])

# --plan: a rank's weights at d12 on 8 ranks
r3 = s.expect_ok("--plan -e d12 --zero 3 --plan-ranks 8", [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--zero", "3", "--plan-ranks", "8"])
if r3 and r0:
    w0, w3 = planned_mib(r0.out, "parameters"), planned_mib(r3.out, "parameters")
    s.check(f"d12 weights per rank: {w3} MiB on 8 ranks with --zero 3 vs {w0} MiB on 1 (the working copy: wte, wpe, a layer)",
            w0 and w3 and w3 < 0.6 * w0, "not below 0.6x")

# ----------------------------------------------------------------------------
# 3. resume: from the step-5 checkpoint of a 2-rank --zero 1 run to step 10, bitwise equal to the
# straight run (model and every rank's state file); other rank counts are refused

for name in ("adamw", "adafactor+beta1"):
    A, R = f"{W}/{name}_n2z1", f"{W}/{name}_resume"
    if not os.path.isfile(ckpt(A, "DONE", 5)):
        s.fail(f"{name}: resume", f"no checkpoint 5 in {A}")
        continue
    os.makedirs(R)
    for f in [ckpt(A, "model", 5, ".bin"), ckpt(A, "DONE", 5)] + glob.glob(f"{A}/state_00000005_0000[01].bin"):
        shutil.copy(f, R)
    if s.expect_ok(f"{name}: mpirun -np 2 --zero 1 resumes from step 5",
                   MPIRUN + ["2"] + BASE + ["--optimizer", *OPTIMIZERS[name], "--zero", "1", "-o", R, "-y", "1"]):
        s.check(f"{name}: resumed model at step 10 bitwise equal",
                same_bytes(ckpt(A, "model", 10, ".bin"), ckpt(R, "model", 10, ".bin")), "cmp differs")
        for rank in (0, 1):
            s.check(f"{name}: resumed state of rank {rank} bitwise equal",
                    same_bytes(ckpt(A, "state", 10, f"_{rank:05d}.bin"), ckpt(R, "state", 10, f"_{rank:05d}.bin")),
                    "cmp differs")
# the run identity: rank 1's state file of another run with the same flags (the same numbers,
# another identity) is not combined with rank 0's
A, A2, MIX = f"{W}/adamw_n2z1", f"{W}/adamw_n2z1_again", f"{W}/adamw_mixed"
if s.expect_ok("adamw: mpirun -np 2 --zero 1 again", MPIRUN + ["2"] + BASE + ["--zero", "1", "-o", A2]) and os.path.isdir(A):
    os.makedirs(MIX)
    for f in [ckpt(A, "model", 5, ".bin"), ckpt(A, "DONE", 5), ckpt(A, "state", 5, "_00000.bin"), ckpt(A2, "state", 5, "_00001.bin")]:
        shutil.copy(f, MIX)
    s.check("adamw: the two runs' rank 1 states differ only in the run identity (and the checksum that covers it)",
            e2e.same_state(ckpt(A, "state", 5, "_00001.bin"), ckpt(A2, "state", 5, "_00001.bin"))
            and not same_bytes(ckpt(A, "state", 5, "_00001.bin"), ckpt(A2, "state", 5, "_00001.bin")), "they differ elsewhere, or not at all")
    s.expect_fail("resume refuses state files of two runs", "rank 0's state file of the same checkpoint by run",
                  MPIRUN + ["2"] + BASE + ["--zero", "1", "-o", MIX, "-y", "1"])
# another count of ranks: each step of the same -d reads the same windows (llmc/relayout.h, the state's
# blocks cut anew): the straight run's model within MODEL_RTOL
for ranks in (1, 3):
    R = f"{W}/resume_adamw_n2z1_on_{ranks}"
    if os.path.isfile(ckpt(A, "DONE", 5)):
        os.makedirs(R)
        for f in [ckpt(A, "model", 5, ".bin"), ckpt(A, "DONE", 5), ckpt(A, "state", 5, "_00000.bin"), ckpt(A, "state", 5, "_00001.bin")]:
            shutil.copy(f, R)
        if s.expect_ok(f"adamw: the 2-rank --zero 1 checkpoint resumed on {ranks} rank(s)",
                       (MPIRUN + [str(ranks)] if ranks > 1 else []) + BASE + ["--zero", "1" if ranks > 1 else "0", "-o", R, "-y", "1"]):
            models_close(f"adamw: the 2-rank checkpoint resumed on {ranks} rank(s) vs straight", A, R, MODEL_RTOL)
# ZeRO-2 and 3 keep ZeRO-1's state files: each resumes the others'; --zero 2 and 3 resume themselves bit for bit;
# --zero 0 resumes them too, each rank's whole state gathered from the ranks' blocks (llmc/relayout.h,
# tests/test_relayout.py)
A2, A3 = f"{W}/adamw_n2z2", f"{W}/adamw_n2z3"
for src, z in ((A, "2"), (A2, "1"), (A2, "2"), (A, "3"), (A3, "1"), (A3, "3"), (A, "0"), (A2, "0")):
    R = f"{W}/resume_{os.path.basename(src)}_as_z{z}"
    if not os.path.isfile(ckpt(src, "DONE", 5)):
        s.fail(f"resume {src} with --zero {z}", "no checkpoint 5")
        continue
    os.makedirs(R)
    for f in [ckpt(src, "model", 5, ".bin"), ckpt(src, "DONE", 5)] + glob.glob(f"{src}/state_00000005_0000[01].bin"):
        shutil.copy(f, R)
    if s.expect_ok(f"adamw: a {os.path.basename(src)} checkpoint resumed with mpirun -np 2 --zero {z}",
                   MPIRUN + ["2"] + BASE + ["--zero", z, "-o", R, "-y", "1"]):
        if (src, z) in ((A2, "2"), (A3, "3")):
            s.check(f"adamw: --zero {z} resumed from step 5: model at step 10 bitwise equal",
                    same_bytes(ckpt(src, "model", 10, ".bin"), ckpt(R, "model", 10, ".bin")), "cmp differs")
        else:
            models_close(f"adamw: {os.path.basename(src)} resumed with --zero {z} vs straight", src, R, MODEL_RTOL)

# ----------------------------------------------------------------------------
# 3b. stopping a multi-rank run: SIGINT or SIGTERM to mpirun makes it kill the ranks, so the
# trainer also stops on SIGUSR1, which OpenMPI's mpirun forwards to every rank: all ranks finish
# the step, checkpoint (every rank's state file, then DONE) and exit 0

SIG = f"{W}/sig_USR1"
s.signal_check("USR1", SIG, 100, MPIRUN + ["2"] + BASE + ["-d", "1024", "-x", "100", "-n", "0", "--zero", "1"])
s.check("signal: USR1 under mpirun: rank 1's state file too",
        os.path.isfile(ckpt(SIG, "state", latest_done(SIG), "_00001.bin")), "missing")

# a stop signal that reaches one rank only, during a validation (long: -m 2000 batches, every step):
# under --zero 3 every forward gathers weights, so the ranks must agree batch by batch whether to
# go on (one rank leaving the loop early would leave the other waiting in a gather for ever)


def rank_pids(run_dir):
    """the pids of the trainer processes whose command line names RUN_DIR (mpirun's ranks)"""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"train_gpt") and run_dir.encode() in argv:
            pids.append(int(pid))
    return sorted(pids)


VAL_STOP = f"{W}/val_stop_z3"
cmd = MPIRUN + ["2"] + BASE + ["-j", f"{FIX}/val.bin", "-d", "64", "-x", "1000", "-v", "1", "-m", "2000", "-n", "0", "--zero", "3",
                               "-o", VAL_STOP]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
try:
    seen = ""
    while "val loss" not in seen and p.poll() is None:  # the first validation is done: the next runs soon
        seen += p.stdout.readline()
    time.sleep(0.2)
    ranks = rank_pids(VAL_STOP)
    if p.poll() is None and ranks:
        os.kill(ranks[-1], signal.SIGUSR1)
    try:
        out, _ = p.communicate(timeout=60)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc, out = None, "(hung: killed after 60 s)"
finally:
    kill_group(p)
s.check(f"--zero 3: SIGUSR1 to one rank of 2 (pid {ranks[-1] if ranks else '?'}) during validation: both stop at the same "
        f"step, checkpoint and exit 0", rc == 0 and re.search(r"stopped by signal after step \d+; wrote checkpoint", seen + out),
        f"exit code {rc}: {(seen + out)[-400:]}")

# ----------------------------------------------------------------------------
# 4. --check-replicas 1 checks after every step (and at the end of a run without -o)

r = s.expect_ok("--check-replicas 1 under mpirun -np 2 --zero 1",
                MPIRUN + ["2"] + BASE + ["-x", "3", "-n", "0", "--zero", "1", "--check-replicas", "1", "-o", ""])
if r:
    n = len(re.findall(r"^replicas: parameters identical on 2 ranks after step [123] ", r.out, re.M))
    s.check("... checks after each of the 3 steps", n == 4, f"{n} replica lines")

# two programs of different settings started by one mpirun (or two jobs that met) stop at start-up,
# every rank naming the first setting that differs, before any step (issue 38)
if MPIRUN:
    two = MPIRUN[:-1] + ["-np", "1"] + BASE + ["--zero", "3", "-o", ""] + [":", "-np", "1"] + BASE + \
        ["--zero", "3", "--seed", "7", "-l", "0.05", "-o", ""]
    r = s.expect_fail("settings: mpirun of two command lines (--seed 7 -l 0.05 on rank 1) stops",
                      "the ranks were started with different settings: --lr is 0.001 on rank 0, but 0.05 on rank 1", two)
    s.check("settings: ... before any step", not re.search(r"^step ", r.out, re.M), r.out[-300:])
    s.expect_fail("settings: --zero 1 and --zero 0 on two ranks: named too", "--zero is 1 on rank 0, but 0 on rank 1",
                  MPIRUN[:-1] + ["-np", "1"] + BASE + ["--zero", "1", "-o", ""] + [":", "-np", "1"] + BASE + ["-o", ""])

# 5. the grid of tensor-parallel and data-parallel groups (llmc/distributed.h's dist_grid, for --tp): each
# group's collectives over its ranks only, on 4 ranks split every way (build/test_dist_grid's own checks)
GRID = os.path.join(os.path.dirname(TRAIN), "build", "test_dist_grid")  # beside train_gpt (make test builds it)
r = s.run(MPIRUN + ["4", GRID])
checks = re.findall(r"^(ok  |FAIL) (.*)$", r.out, re.M)
s.check("the grid's test program runs on 4 ranks and ends with its summary",
        r.rc == 0 and checks and re.search(r"^\d+ passed, 0 failed$", r.out, re.M), (r.out + r.err)[-1500:])
for status, text in checks:
    s.check(f"grid: {text}", status == "ok  ", text)
s.expect_fail("grid: tp 3 on 4 ranks stops", "--tp 3: 4 rank(s) do not split into tensor-parallel groups of 3",
              MPIRUN + ["4", GRID, "3"])

s.finish()
