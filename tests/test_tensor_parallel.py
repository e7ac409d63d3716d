"""test_tensor_parallel.py: tensor parallelism (--tp N, doc/tensor_parallel.md) end to end on the CPU
trainer: N ranks that split each layer's matrices train as one process does, alone (--tp 2, --tp 4)
and inside data parallelism (--tp 2 on 4 ranks: two data-parallel ranks, --zero 1 and 3), for every
optimizer and with the memory flags on top; measured memory equals the plan; the model file is the
whole model (it opens in one process); a resume is bitwise (one onto another layout:
tests/test_relayout.py); and the layouts that cannot be (heads or ranks that do not divide, on either
backend) stop before any work, naming the fix.

    python3 tests/test_tensor_parallel.py ./train_gpt ./test_gpt [./build/emu/train_gpt]

Every run is `-e tiny` (L=2 C=64 NH=4 with GPT-2's vocabulary, from the seed) on test_gpt's fixture
shards, 10 steps of B*T = 32 tokens on each data-parallel rank. Without mpirun (or with a train_gpt
built without MPI) the multi-rank part is skipped and counted.

Tolerances. The ranks of a group add the slices' partial products (the row-parallel matmuls, the
column-parallel input gradients), and the norm and Adafactor's and CAME's statistics their parts, in
another order than one process does: losses agree to LOSS_RTOL and weights to MODEL_RTOL (relative
L2 over every weight, test_gpt --compare-models), but the key biases (rows C..2C-1 of qkvb): their
gradient is zero in exact arithmetic, so what fp32 computes there is rounding noise, which the
normalised updates turn into steps of about lr in any other order of the sums (one process with
--attention flash against matmul shows the same). Adafactor and CAME run with --eps1 1e-12, as
tests/test_zero.py does, so that the noise does not also move their RMS clipping of qkvb. What is
bitwise: the memory flags (recompute, offload) on top of --tp, ZeRO's stages against each other at
one layout, and a resume. The optimizer state in 8 bits or bf16 is held to LOWP_LOSS_RTOL and
LOWP_MODEL_RTOL: a slice's quantization blocks (and bf16's rounding draws) are the slice's, not the
whole tensor's, so the two layouts round the moments differently, each by up to a step of the format.
"""

import os
import re
import shutil
import sys

import e2e
from e2e import ckpt, memory_record, same_bytes, same_state, train_rows

TRAIN, TESTER, EMU = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/emu/train_gpt"], optional=1)
s = e2e.Suite("test_tensor_parallel", tester=TESTER, run_limit=120)
FIX, W = s.fix, s.root
STEPS = 10
LOSS_RTOL = 2e-6          # log.jsonl prints 6 decimals: 1e-6 absolute is 1e-7 of a loss of 10.8
MODEL_RTOL = "1e-5"       # as test_gpt --compare-models reads it
LOWP_LOSS_RTOL = 5e-5     # --optimizer-state 8bit and bf16 (see the top): measured 9e-6 and 5e-6
LOWP_MODEL_RTOL = "5e-3"  # measured 5e-4 (8bit) and 1.5e-3 (bf16)
BT = 32                   # B*T: the tokens of a micro-batch

FLAGS = ["-e", "tiny", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16", "-x", str(STEPS),
         "-u", "2", "-v", "0", "-s", "0", "-n", "5"]
BASE = [TRAIN] + FLAGS
EPS1 = ["--eps1", "1e-12"]
OPTIMIZERS = {"adamw": ["adamw"], "adafactor": ["adafactor"] + EPS1, "came": ["came"] + EPS1}


def planned_mib(out, row):
    """the planned MiB of a row of a printed memory table (--plan writes no log)"""
    m = re.search(rf"^\| {re.escape(row)} +\| +([0-9.]+) MiB", out, re.M)
    return float(m.group(1)) if m else None


def losses_close(name, a, b, rtol=LOSS_RTOL):
    """every step's loss (log.jsonl) within rtol"""
    la, lb = [row[1] for row in train_rows(a)], [row[1] for row in train_rows(b)]
    if len(la) != STEPS or len(lb) != STEPS:
        return s.fail(f"{name}: losses of the {STEPS} steps agree", f"steps logged: {len(la)} and {len(lb)}")
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    return s.check(f"{name}: losses of the {STEPS} steps agree (worst {worst:.2e} relative)", worst <= rtol,
                   f"worst {worst:.2e} > {rtol}")


def models_close(name, a, b, rtol=MODEL_RTOL):
    """the final models within RTOL (relative L2 but the key biases: test_gpt --compare-models)"""
    r = s.run([TESTER, "--compare-models", ckpt(a, "model", STEPS, ".bin"), ckpt(b, "model", STEPS, ".bin"), rtol])
    detail = r.out.strip()
    return s.check(f"{name}: final weights agree to {rtol} ({detail.removeprefix('models: ')})", r.rc == 0,
                   f"exit code {r.rc}: {detail} {r.err[:300]}")


def batch(data_ranks):
    """-d of one micro-batch on each of data_ranks data-parallel ranks (one process accumulates them)"""
    return ["-d", str(BT * data_ranks)]


# ----------------------------------------------------------------------------
# 1. without ranks: the layouts that cannot be, and the plan of a rank's slices

s.expect_fail("--tp 0 is refused", "--tp 0: the ranks each layer is split over, at least 1", BASE + ["--tp", "0", "-o", ""])
s.expect_fail("--tp 2 with one process", "1 rank(s) do not split into tensor-parallel groups of 2",
              BASE + ["--tp", "2", "-o", ""])
s.expect_fail("--plan --tp 2 for 3 ranks", "3 rank(s) do not split into tensor-parallel groups of 2",
              [TRAIN, "--plan", "-e", "tiny", "--tp", "2", "--plan-ranks", "3"])
s.expect_fail("--tp 3 on a model of 4 heads", "the model's 4 heads do not split over 3 ranks",
              [TRAIN, "--plan", "-e", "tiny", "--tp", "3", "--plan-ranks", "3"])
s.expect_fail("--tp 5 on d36: its 20 heads split, its padded vocabulary of 50304 does not",
              "the model's padded vocabulary Vp = 50304 does not split over 5 ranks", [TRAIN, "--plan", "-e", "d36", "--tp", "5", "--plan-ranks", "5"])
if EMU:  # the CUDA trainer's --tp itself: tests/test_tensor_parallel_cuda.py
    s.expect_fail("the CUDA trainer (emulated device) takes the same layout checks", "1 rank(s) do not split into tensor-parallel groups of 2",
                  [EMU] + FLAGS + ["--tp", "2", "-o", ""])
else:
    s.skip("the CUDA trainer's layout checks", "no build/emu/train_gpt given")
# d12 on 4 ranks of --tp 2 (two data-parallel ranks, --zero 1): a rank's weights are its slices,
# (12C^2 + 7C)/2 + 6C a layer, half of wte's rows, wpe and lnf whole, and a split tensor's layer whole (4C^2)
C, L, Vp, maxT = 768, 12, 50304, 1024
rank_params = Vp // 2 * C + maxT * C + 2 * C + L * ((12 * C * C + 7 * C) // 2 + 6 * C)
r1 = s.expect_ok("--plan -e d12, one rank", [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64"])
r2 = s.expect_ok("--plan -e d12 --tp 2 --zero 1 --plan-ranks 4",
                 [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--tp", "2", "--zero", "1", "--plan-ranks", "4"])
if r1 and r2:
    want = 4 * (rank_params + 4 * C * C) / 1048576
    got = planned_mib(r2.out, "parameters")
    s.check(f"d12 --tp 2: a rank's planned weights {got} MiB = 4(its slices + 4C^2) = {want:.2f} MiB",
            got is not None and abs(got - want) < 0.01, r2.out[-600:])
    a1, a2 = planned_mib(r1.out, "activations"), planned_mib(r2.out, "activations")
    s.check(f"d12 --tp 2: a rank's planned activations {a2} MiB, less than one process's {a1} MiB",
            a1 is not None and a2 is not None and a2 < a1, "not less")
    s.check("--plan names the layout", "(--tp 2: its slices)" in r2.out, r2.out[:300])

# --sp: with --tp only, rows that split over its ranks, and a -t that a sample's padding fits in
s.expect_fail("--sp without --tp", "but this run has --tp 1", BASE + ["--sp", "-o", ""])
s.expect_fail("--sp: B*T = 15 rows over --tp 2", "the B*T = 15 rows of a micro-batch do not split over --tp 2 ranks",
              [TRAIN, "--plan", "-e", "tiny", "-b", "1", "-t", "15", "--tp", "2", "--sp", "--plan-ranks", "2"])
s.expect_fail("--sp with samples and -t 15 over --tp 2", "a sample's forward pads its tokens to a multiple of --tp 2 within -t 15",
              [TRAIN, "--plan", "-e", "tiny", "-b", "2", "-t", "15", "-s", "5", "--tp", "2", "--sp", "--plan-ranks", "2"])
# d12 at B=4, T=1024 on 2 ranks: --sp halves a residual-stream tensor (R) and the rows a layer keeps of it
rt, rs = (s.expect_ok(f"--plan -e d12 -b 4 -t 1024 --tp 2{extra}", [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "1024", "--tp", "2",
                                                                      "--plan-ranks", "2"] + extra.split()) for extra in ("", " --sp"))
if rt and rs:
    def plan_value(out, what):
        m = re.search(rf"{re.escape(what)} = ([0-9.]+) MiB", out)
        return float(m.group(1)) if m else None
    Rt, Rs = plan_value(rt.out, "R (a residual-stream tensor)"), plan_value(rs.out, "R (a residual-stream tensor)")  # planner.h's line
    s.check(f"d12 --tp 2 --sp: a residual-stream tensor {Rs} MiB a rank, half of --tp 2's {Rt}", Rt and Rs and abs(Rs - Rt / 2) < 0.01,
            rs.out[-400:])
    At, As = (re.search(r"A \(one layer's block: [^)]*\)\) = ([0-9.]+) MiB", r.out) for r in (rt, rs))
    d12_C, d12_BT = 768, 4 * 1024  # a layer keeps four (B,T,C) tensors and four (B,T) statistics of the residual stream: half each with --sp
    want = float(At.group(1)) - 4 * (4 * d12_BT * d12_C + 4 * d12_BT) / 2 / 1048576 if At else None
    s.check(f"d12 --tp 2 --sp: a layer's block {As.group(1) if As else None} MiB = --tp 2's less half its residual-stream rows ({want:.2f})",
            At and As and abs(float(As.group(1)) - want) < 0.01, rs.out[-400:])

MPIRUN, why_not = e2e.mpi_launcher(TRAIN)
if MPIRUN is None:
    s.skip("the multi-rank checks (mpirun -np 2 and 4)", why_not)
    s.finish()

s.expect_fail("--zero 1 with --tp 2 on 2 ranks (one data-parallel rank)", "there is 1 data-parallel rank",
              MPIRUN + ["2"] + BASE + ["--tp", "2", "--zero", "1", "-o", ""])

# ----------------------------------------------------------------------------
# 2. each optimizer: --tp 2 against one process, and --tp 2 inside two data-parallel ranks (--zero 1)
# against one process that accumulates their two micro-batches


def tp_run(name, ranks, flags, out):
    return s.expect_ok(name, MPIRUN + [str(ranks)] + BASE + flags + ["-o", out])


for name, opt in OPTIMIZERS.items():
    one, one2 = f"{W}/{name}_one", f"{W}/{name}_one_d2"
    tp2, tp2z1 = f"{W}/{name}_tp2", f"{W}/{name}_tp2_dp2_z1"
    if not (s.expect_ok(f"{name}: one process", BASE + ["--optimizer", *opt] + batch(1) + ["-o", one])
            and s.expect_ok(f"{name}: one process, two micro-batches", BASE + ["--optimizer", *opt] + batch(2) + ["-o", one2])):
        continue
    if tp_run(f"{name}: mpirun -np 2 --tp 2", 2, ["--optimizer", *opt, "--tp", "2"] + batch(1), tp2):
        losses_close(f"{name}: --tp 2 vs one process", one, tp2)
        models_close(f"{name}: --tp 2 vs one process", one, tp2)
        s.check_memory(f"{name}: --tp 2: measured memory = planned", tp2)
        if name == "adamw":  # the logits are a rank's Vp/2 columns: the head, most of tiny's activations, halves
            a1, a2 = (memory_record(d)["measured"]["activations"] for d in (one, tp2))
            s.check(f"--tp 2: a rank's activations {a2} bytes, about half of one process's {a1} (the logits split over the vocabulary)",
                    0.45 * a1 < a2 < 0.6 * a1, "not about half")
    rz = tp_run(f"{name}: mpirun -np 4 --tp 2 --zero 1 --check-replicas", 4,
                ["--optimizer", *opt, "--tp", "2", "--zero", "1", "--check-replicas"] + batch(2), tp2z1)
    if rz:
        losses_close(f"{name}: --tp 2 x 2 data-parallel ranks, --zero 1, vs one process", one2, tp2z1)
        models_close(f"{name}: --tp 2 x 2 data-parallel ranks, --zero 1, vs one process", one2, tp2z1)
        s.check(f"{name}: --tp 2 --zero 1: the whole model the same on all 4 ranks every step",
                re.search(rf"^replicas: parameters identical on 4 ranks after step {STEPS} ", rz.out, re.M), rz.out[-300:])
        s.check_memory(f"{name}: --tp 2 --zero 1: measured memory = planned", tp2z1)

# --tp 4 (each rank one head) and ZeRO-3 inside --tp 2: AdamW
A1, A2 = f"{W}/adamw_one", f"{W}/adamw_one_d2"
tp4, z3 = f"{W}/adamw_tp4", f"{W}/adamw_tp2_dp2_z3"
if tp_run("adamw: mpirun -np 4 --tp 4", 4, ["--tp", "4"] + batch(1), tp4):
    losses_close("adamw: --tp 4 vs one process", A1, tp4)
    models_close("adamw: --tp 4 vs one process", A1, tp4)
    s.check_memory("adamw: --tp 4: measured memory = planned", tp4)
if tp_run("adamw: mpirun -np 4 --tp 2 --zero 3", 4, ["--tp", "2", "--zero", "3"] + batch(2), z3):
    s.check("adamw: --tp 2 --zero 3: the model at step 10 bitwise --zero 1's (the same sums in the same order)",
            same_bytes(ckpt(z3, "model", STEPS, ".bin"), ckpt(f"{W}/adamw_tp2_dp2_z1", "model", STEPS, ".bin")), "cmp differs")
    s.check_memory("adamw: --tp 2 --zero 3: measured memory = planned", z3)

# ----------------------------------------------------------------------------
# 3. the memory flags on top: recompute and offload change no bit; flash attention and the head in
# chunks against one process with the same flags; the optimizer state in 8 bits and bf16

RO = f"{W}/adamw_tp2_recompute_offload"
if tp_run("adamw: --tp 2 --recompute 1,gelu,attn --offload 1", 2, ["--tp", "2", "--recompute", "1,gelu,attn", "--offload", "1"]
          + batch(1), RO):
    s.check("adamw: --tp 2 with recompute and offload: the model at step 10 bitwise plain --tp 2's",
            same_bytes(ckpt(RO, "model", STEPS, ".bin"), ckpt(f"{W}/adamw_tp2", "model", STEPS, ".bin")), "cmp differs")
    s.check_memory("adamw: --tp 2 with recompute and offload: measured memory = planned", RO)
for label, flags, lowp in (("flash attention, --loss-chunk 8", ["--attention", "flash", "--loss-chunk", "8"], False),
                           ("came, --optimizer-state bf16", ["--optimizer", "came", "--optimizer-state", "bf16"] + EPS1, True),
                           ("adamw, --optimizer-state 8bit", ["--optimizer-state", "8bit"], True)):
    tag = re.sub(r"[^a-z0-9]+", "_", label)
    one, tp2 = f"{W}/{tag}_one", f"{W}/{tag}_tp2"
    if s.expect_ok(f"{label}: one process", BASE + flags + batch(1) + ["-o", one]) and \
            tp_run(f"{label}: mpirun -np 2 --tp 2", 2, flags + ["--tp", "2"] + batch(1), tp2):
        losses_close(f"{label}: --tp 2 vs one process", one, tp2, LOWP_LOSS_RTOL if lowp else LOSS_RTOL)
        models_close(f"{label}: --tp 2 vs one process", one, tp2, LOWP_MODEL_RTOL if lowp else MODEL_RTOL)
        s.check_memory(f"{label}: --tp 2: measured memory = planned", tp2)

# --sp: each optimizer against one process; --tp 4; two data-parallel ranks (--zero 1 and 3, bitwise each
# other); recompute and offload bitwise plain --sp; flash attention with --loss-chunk
for name, opt in OPTIMIZERS.items():
    SP = f"{W}/{name}_tp2_sp"
    if tp_run(f"{name}: mpirun -np 2 --tp 2 --sp", 2, ["--optimizer", *opt, "--tp", "2", "--sp"] + batch(1), SP):
        losses_close(f"{name}: --tp 2 --sp vs one process", f"{W}/{name}_one", SP)
        models_close(f"{name}: --tp 2 --sp vs one process", f"{W}/{name}_one", SP)
        s.check_memory(f"{name}: --tp 2 --sp: measured memory = planned", SP)
for label, ranks, flags, ref in (("--tp 4 --sp", 4, ["--tp", "4", "--sp"] + batch(1), A1),
                                 ("--tp 2 --sp, 2 data-parallel ranks, --zero 1", 4, ["--tp", "2", "--sp", "--zero", "1"] + batch(2), A2),
                                 ("--tp 2 --sp, 2 data-parallel ranks, --zero 3", 4, ["--tp", "2", "--sp", "--zero", "3"] + batch(2), A2)):
    out = f"{W}/adamw_" + re.sub(r"[^a-z0-9]+", "_", label)
    if tp_run(f"adamw: mpirun -np {ranks} {label}", ranks, flags, out):
        losses_close(f"adamw: {label} vs one process", ref, out)
        models_close(f"adamw: {label} vs one process", ref, out)
        s.check_memory(f"adamw: {label}: measured memory = planned", out)
Z1, Z3 = f"{W}/adamw__tp_2_sp_2_data_parallel_ranks_zero_1", f"{W}/adamw__tp_2_sp_2_data_parallel_ranks_zero_3"
s.check("adamw: --tp 2 --sp: --zero 3's model at step 10 bitwise --zero 1's",
        same_bytes(ckpt(Z1, "model", STEPS, ".bin"), ckpt(Z3, "model", STEPS, ".bin")), "cmp differs")
RS = f"{W}/adamw_tp2_sp_recompute_offload"
if tp_run("adamw: --tp 2 --sp --recompute 1,gelu,attn --offload 1", 2, ["--tp", "2", "--sp", "--recompute", "1,gelu,attn", "--offload", "1"]
          + batch(1), RS):
    s.check("adamw: --tp 2 --sp with recompute and offload: the model at step 10 bitwise plain --sp's",
            same_bytes(ckpt(RS, "model", STEPS, ".bin"), ckpt(f"{W}/adamw_tp2_sp", "model", STEPS, ".bin")), "cmp differs")
    s.check_memory("adamw: --tp 2 --sp with recompute and offload: measured memory = planned", RS)
FL = f"{W}/flash_sp_tp2"
if tp_run("flash attention, --loss-chunk 8, --tp 2 --sp", 2, ["--attention", "flash", "--loss-chunk", "8", "--tp", "2", "--sp"] + batch(1), FL):
    one = f"{W}/flash_attention_loss_chunk_8_one"
    losses_close("flash attention, --loss-chunk 8: --tp 2 --sp vs one process", one, FL)
    models_close("flash attention, --loss-chunk 8: --tp 2 --sp vs one process", one, FL)
    s.check_memory("flash attention, --loss-chunk 8: --tp 2 --sp: measured memory = planned", FL)

# a sample during training: every rank of the group asks for one position's probabilities, gathered whole
# from the ranks' columns; with the same seed the same tokens as one process draws (their probabilities
# agree to rounding, and a draw falls on a boundary between two tokens with a chance of about 1e-6)
SAMPLE = ["-s", "5", "-g", "12", "-x", "5", "-n", "0"]
r1 = s.expect_ok("adamw: one process draws a sample at step 5", BASE + SAMPLE + batch(1) + ["-o", f"{W}/sample_one"])
r2 = tp_run("adamw: --tp 2 draws a sample at step 5", 2, SAMPLE + ["--tp", "2"] + batch(1), f"{W}/sample_tp2")
if r1 and r2:
    def sample_of(out):
        lines = out.splitlines()
        at = [i for i, line in enumerate(lines) if line.startswith("---- sample at step 5")]
        return lines[at[0] + 1] if at and at[0] + 1 < len(lines) else None
    s.check("adamw: --tp 2's sample is one process's (the same tokens)", sample_of(r1.out) and sample_of(r1.out) == sample_of(r2.out),
            f"one process: {sample_of(r1.out)!r}; --tp 2: {sample_of(r2.out)!r}")
    # --sp: a sample's forward of 1..T tokens, padded to a multiple of the group's size
    r3 = tp_run("adamw: --tp 2 --sp draws a sample at step 5", 2, SAMPLE + ["--tp", "2", "--sp"] + batch(1), f"{W}/sample_tp2_sp")
    if r3:
        s.check("adamw: --tp 2 --sp's sample is one process's (the same tokens)", sample_of(r1.out) == sample_of(r3.out),
                f"one process: {sample_of(r1.out)!r}; --tp 2 --sp: {sample_of(r3.out)!r}")

# ----------------------------------------------------------------------------
# 4. files: the model file is the whole model; a resume is bitwise (onto another layout: tests/test_relayout.py)

T2 = f"{W}/adamw_tp2"
if os.path.isfile(ckpt(T2, "DONE", 5)):
    R = f"{W}/adamw_tp2_resume"
    os.makedirs(R)
    for f in [ckpt(T2, "model", 5, ".bin"), ckpt(T2, "DONE", 5), ckpt(T2, "state", 5, "_00000.bin"), ckpt(T2, "state", 5, "_00001.bin")]:
        shutil.copy(f, R)
    if tp_run("adamw: --tp 2 resumes from step 5", 2, ["--tp", "2"] + batch(1) + ["-y", "1"], R):
        s.check("adamw: --tp 2 resumed: the model at step 10 bitwise the straight run's",
                same_bytes(ckpt(T2, "model", STEPS, ".bin"), ckpt(R, "model", STEPS, ".bin")), "cmp differs")
        for rank in (0, 1):
            s.check(f"adamw: --tp 2 resumed: rank {rank}'s state at step 10 the straight run's (but the run identity)",
                    same_state(ckpt(T2, "state", STEPS, f"_{rank:05d}.bin"), ckpt(R, "state", STEPS, f"_{rank:05d}.bin")), "differs")
    SPR, SP2 = f"{W}/adamw_tp2_sp_resume", f"{W}/adamw_tp2_sp"
    if os.path.isfile(ckpt(SP2, "DONE", 5)):
        os.makedirs(SPR)
        for f in [ckpt(SP2, "model", 5, ".bin"), ckpt(SP2, "DONE", 5), ckpt(SP2, "state", 5, "_00000.bin"), ckpt(SP2, "state", 5, "_00001.bin")]:
            shutil.copy(f, SPR)
        if tp_run("adamw: --tp 2 --sp resumes from step 5", 2, ["--tp", "2", "--sp"] + batch(1) + ["-y", "1"], SPR):
            s.check("adamw: --tp 2 --sp resumed: the model at step 10 bitwise the straight run's",
                    same_bytes(ckpt(SP2, "model", STEPS, ".bin"), ckpt(SPR, "model", STEPS, ".bin")), "cmp differs")
    # the whole model, in the whole model's order: one process starts from it as from one process's own
    # model file (the two within MODEL_RTOL: section 2), and its first step's loss is that one's
    O, O1 = f"{W}/from_tp2_model", f"{W}/from_one_model"
    r = s.expect_ok("one process starts from the --tp 2 run's model file", BASE + ["-e", ckpt(T2, "model", STEPS, ".bin"), "-x", "1",
                                                                                   "-o", O])
    if r and s.expect_ok("one process starts from one process's model file", BASE + ["-e", ckpt(A1, "model", STEPS, ".bin"),
                                                                                     "-x", "1", "-o", O1]):
        s.check("... a whole model file (llm.c's header: L=2 C=64 NH=4)", "L=2 C=64 NH=4" in r.out, r.out[:400])
        la, lb = train_rows(O), train_rows(O1)
        s.check(f"... its first loss {la[0][1] if la else None} is one process's model's {lb[0][1] if lb else None} (within {LOSS_RTOL})",
                la and lb and abs(la[0][1] - lb[0][1]) <= LOSS_RTOL * abs(lb[0][1]), f"{la} {lb}")
else:
    s.fail("adamw: --tp 2 checkpoints", f"no checkpoint 5 in {T2}")

s.finish()
