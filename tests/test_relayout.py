"""test_relayout.py: -y 1 onto another layout (llmc/relayout.h): a checkpoint written by one --tp, --pp
and --zero resumes on another, its optimizer state moved onto the new ranks' parts, and trains on as
the run that never stopped does.

    python3 tests/test_relayout.py ./train_gpt ./test_gpt [./build/emu/train_gpt]

  1. the state itself (test_gpt --relayout-state, which moves a checkpoint's state as -y 1 does and
     writes it as another layout's checkpoint): for each optimizer, the --tp 2 checkpoint's state moved
     to one process's layout equals, bit for bit, the state moved first to --tp 4 (or --pp 2, or --tp 2
     --pp 2 on 2 data-parallel ranks under ZeRO) and then to one process's; and moved to --tp 4 and
     back to --tp 2 it is the checkpoint's own files again, bf16 state too. Every entry of fp32 and
     bf16 state moves as it is, so this is exact.
  2. the runs: the --tp 2 run's checkpoint of step 5 resumed by one process, by --tp 4, --pp 2 and
     --tp 2 --pp 2 (adamw), by one process and --tp 4 (Adafactor, CAME), by two data-parallel ranks
     (--zero 0 and 1), a --pp 2 run of two data-parallel ranks under --zero 1 resumed by one process,
     by four data-parallel ranks under --zero 1, by plain data parallelism, by --tp 2 --zero 1 and by
     --pp 2 --zero 0, 8-bit state resumed by one process (requantized) and converted to fp32, and the
     emulated CUDA trainer resuming the CPU's --tp 2 checkpoint as one process: each ends where the
     straight run does, within the tolerances of the layouts themselves (below).
  3. refused, naming the fix: another optimizer than wrote the checkpoint, a damaged state file of a rank the new layout reads, and under
     Adafactor a tensor that is a vector in one layout and a matrix in the other.

The model (written here): L=2 C=64 NH=4 V=64 Vp=80: --tp 1, 2 and 4 (Vp/4 = 20 rows a rank) and --pp 1 and
2; its matrices large enough that 8-bit state quantizes them on every layout (fcw: 16,384 elements, 4,096
a rank of --tp 4; below 4,096 a slice's moments stay fp32, as qkvw's under --tp 4 and wte's under --tp 2).
B*T = 32 tokens a micro-batch, two micro-batches a data-parallel rank and step, 10 steps, checkpoints
at 5 and 10. Tolerances: --tp adds the row-parallel sums in another order, --pp wte's two gradients
(tests/test_tensor_parallel.py and tests/test_pipeline_parallel.py say how far each goes): losses to
LOSS_RTOL, weights to MODEL_RTOL, CAME's to CAME_MODEL_RTOL; 8-bit state requantized on the new blocks
to LOWP_*; the CUDA trainer against the CPU's to CPU_RTOL (tests/test_cuda.py's).
Without mpirun the multi-rank part is skipped and counted.
"""

import os
import shutil
import sys

import e2e
from e2e import ckpt, copy_checkpoint, same_bytes, same_state, train_rows, write_model

TRAIN, TESTER, EMU = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/emu/train_gpt"], optional=1)
s = e2e.Suite("test_relayout", tester=TESTER, run_limit=120)
FIX, W = s.fix, s.root
STEPS, AT = 10, 5         # the runs' steps, and the checkpoint resumed
BT = 32                   # B*T: the tokens of a micro-batch
M = 2                     # micro-batches a data-parallel rank and step
LOSS_RTOL = 2e-6          # log.jsonl prints 6 decimals
MODEL_RTOL = "1e-5"
CAME_MODEL_RTOL = "1e-4"  # tests/test_pipeline_parallel.py: CAME's confidence term grows a rounding difference
LOWP_LOSS_RTOL = 5e-5
LOWP_MODEL_RTOL = "5e-3"
CPU_RTOL = "1e-4"

MODEL = f"{FIX}/model_relayout.bin"
write_model(MODEL, L=2, C=64, NH=4, V=64, Vp=80)
FLAGS = ["-e", MODEL, "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-x", str(STEPS), "-u", "2", "-v", "0", "-s", "0", "-n", str(AT)]
BASE = [TRAIN] + FLAGS
EPS1 = ["--eps1", "1e-12"]
OPTIMIZERS = {"adamw": ["adamw"], "adafactor": ["adafactor"] + EPS1, "came": ["came"] + EPS1}

MPIRUN, why_not = e2e.mpi_launcher(TRAIN)


def batch(data_ranks):
    return ["-d", str(BT * M * data_ranks)]


def layout(tp=1, pp=1, zero=0):
    return ["--tp", str(tp), "--pp", str(pp), "--zero", str(zero)]


def launch(ranks, trainer=TRAIN):
    return ([trainer] if ranks == 1 else MPIRUN + [str(ranks), trainer]) + FLAGS


def losses_close(name, a, b, rtol):
    la, lb = [row[1] for row in train_rows(a)], [row[1] for row in train_rows(b)]
    la, lb = la[-(STEPS - AT):], lb[-(STEPS - AT):]  # the resumed steps
    if len(la) != STEPS - AT or len(lb) != STEPS - AT:
        return s.fail(f"{name}: losses of steps {AT + 1}..{STEPS} agree", f"steps logged: {len(la)} and {len(lb)}")
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    return s.check(f"{name}: losses of steps {AT + 1}..{STEPS} agree (worst {worst:.2e} relative)", worst <= rtol,
                   f"worst {worst:.2e} > {rtol}")


def model_distance(a, b, rtol):
    """(within rtol, test_gpt --compare-models' line) of the two runs' models at STEPS"""
    r = s.run([TESTER, "--compare-models", ckpt(a, "model", STEPS, ".bin"), ckpt(b, "model", STEPS, ".bin"), rtol])
    return r.rc == 0, (r.out.strip() or r.err[:300]).removeprefix("models: ")


def models_close(name, a, b, rtol):
    ok, detail = model_distance(a, b, rtol)
    return s.check(f"{name}: weights at step {STEPS} agree to {rtol} ({detail})", ok, detail)


def state_files(d, step=AT):
    return sorted(f for f in os.listdir(d) if f.startswith(f"state_{step:08d}_"))


def relayout_state(name, src, out, tp, pp, ranks, zero, opt, fmt="fp32"):
    """test_gpt --relayout-state: src's checkpoint state moved onto ranks of --tp tp --pp pp --zero zero,
    written into out as a checkpoint beside a copy of src's model file"""
    kind = opt[0]
    beta1 = "0"
    r = s.run([TESTER, "--relayout-state", src, str(AT), out, str(tp), str(pp), str(ranks), str(zero), kind, beta1, fmt, str(BT)])
    if r.rc != 0:
        s.fail(f"{name}: test_gpt --relayout-state", f"exit code {r.rc}: {r.err[-400:]}")
        return None
    shutil.copy(ckpt(src, "model", AT, ".bin"), out)
    return out


# ----------------------------------------------------------------------------
# the straight runs whose checkpoints of step 5 the others resume

if MPIRUN is None:
    s.skip("every run of several ranks", why_not)
    s.finish()

SRC = {}
for name, opt in OPTIMIZERS.items():
    d = f"{W}/{name}_tp2"
    if s.expect_ok(f"{name}: --tp 2, {STEPS} steps", launch(2) + ["--optimizer", *opt] + layout(tp=2) + batch(1) + ["-o", d]):
        SRC[name] = d
PP_DP = f"{W}/adamw_pp2_dp2_zero1"
s.expect_ok("adamw: --pp 2 on 2 data-parallel ranks, --zero 1", launch(4) + layout(pp=2, zero=1) + batch(2) + ["-o", PP_DP])
LOWP = f"{W}/adamw_tp2_8bit"
s.expect_ok("adamw: --tp 2, --optimizer-state 8bit", launch(2) + layout(tp=2) + ["--optimizer-state", "8bit"] + batch(1) + ["-o", LOWP])
BF16 = f"{W}/adamw_tp2_bf16"
s.expect_ok("adamw: --tp 2, --optimizer-state bf16", launch(2) + layout(tp=2) + ["--optimizer-state", "bf16"] + batch(1) + ["-o", BF16])

# ----------------------------------------------------------------------------
# 1. the state itself, bit for bit

for name, src in SRC.items():
    opt = OPTIMIZERS[name]
    whole = relayout_state(f"{name}: --tp 2 to one process", src, f"{W}/{name}_whole", 1, 1, 1, 0, opt)
    for via, (tp, pp, ranks, zero) in {"--tp 4": (4, 1, 4, 0), "--pp 2": (1, 2, 2, 0),
                                       "--tp 2 --pp 2 on 2 data-parallel ranks, --zero 1": (2, 2, 8, 1)}.items():
        tag = via.split(",")[0].replace("--", "").replace(" ", "")
        mid = relayout_state(f"{name}: --tp 2 to {via}", src, f"{W}/{name}_{tag}", tp, pp, ranks, zero, opt)
        again = mid and relayout_state(f"{name}: {via} to one process", mid, f"{W}/{name}_{tag}_whole", 1, 1, 1, 0, opt)
        if whole and again:
            s.check(f"{name}: the --tp 2 state moved to one process = moved through {via} first, bit for bit",
                    same_state(ckpt(whole, "state", AT, "_00000.bin"), ckpt(again, "state", AT, "_00000.bin")), "differs")
    back4 = f"{W}/{name}_tp4"
    back = os.path.isdir(back4) and relayout_state(f"{name}: --tp 4 back to --tp 2", back4, f"{W}/{name}_tp4_tp2", 2, 1, 2, 0, opt)
    if back:
        for f in state_files(src):
            s.check(f"{name}: --tp 2 to --tp 4 and back: {f} is the checkpoint's own (but the run identity)",
                    same_state(os.path.join(src, f), os.path.join(back, f)), "differs")
if os.path.isdir(BF16):
    mid = relayout_state("bf16 state: --tp 2 to --tp 4", BF16, f"{W}/bf16_tp4", 4, 1, 4, 0, ["adamw"], "bf16")
    back = mid and relayout_state("bf16 state: --tp 4 back to --tp 2", mid, f"{W}/bf16_tp4_tp2", 2, 1, 2, 0, ["adamw"], "bf16")
    if back:
        s.check("bf16 state: --tp 2 to --tp 4 and back is the checkpoint's own files, bit for bit",
                all(same_state(os.path.join(BF16, f), os.path.join(back, f)) for f in state_files(BF16)), "differs")
if os.path.isdir(PP_DP):
    whole = relayout_state("--pp 2 --zero 1 on 2 data-parallel ranks to one process", PP_DP, f"{W}/ppdp_whole", 1, 1, 1, 0, ["adamw"])
    mid = relayout_state("... to --tp 2 on 2 data-parallel ranks, --zero 0", PP_DP, f"{W}/ppdp_tp2", 2, 1, 4, 0, ["adamw"])
    again = mid and relayout_state("... and to one process", mid, f"{W}/ppdp_tp2_whole", 1, 1, 1, 0, ["adamw"])
    if whole and again:
        s.check("--pp 2 --zero 1's state (2 data-parallel ranks) to one process = through --tp 2 --zero 0 first, bit for bit",
                same_state(ckpt(whole, "state", AT, "_00000.bin"), ckpt(again, "state", AT, "_00000.bin")), "differs")

# ----------------------------------------------------------------------------
# 2. the runs: a resume onto another layout ends where the straight run does


def resume(name, src, ranks, flags, straight=None, loss_rtol=LOSS_RTOL, model_rtol=MODEL_RTOL, trainer=TRAIN, bitwise=False):
    """src's checkpoint of step AT resumed by `ranks` ranks of flags, against the straight run"""
    d = copy_checkpoint(src, f"{W}/resume_{len(os.listdir(W))}", AT)
    r = s.expect_ok(f"{name}: resumes from step {AT}", launch(ranks, trainer) + flags + ["-o", d, "-y", "1"])
    if not r:
        return None
    s.check(f"{name}: -y 1 says the state was moved onto the new layout", "each rank's optimizer state\n  assembled" in r.out,
            r.out[:600])
    straight = straight or src
    if bitwise:
        s.check(f"{name}: the model at step {STEPS} bitwise the straight run's",
                same_bytes(ckpt(straight, "model", STEPS, ".bin"), ckpt(d, "model", STEPS, ".bin")), "cmp differs")
    else:
        losses_close(name, d, straight, loss_rtol)
        models_close(name, d, straight, model_rtol)
    return d


if "adamw" in SRC:
    A = SRC["adamw"]
    for via, ranks, flags in (("one process", 1, layout()), ("--tp 4", 4, layout(tp=4)), ("--pp 2", 2, layout(pp=2)),
                              ("--tp 2 --pp 2", 4, layout(tp=2, pp=2))):
        resume(f"adamw: --tp 2's checkpoint, {via}", A, ranks, flags + batch(1))
for name in ("adafactor", "came"):
    if name in SRC:
        rtol = CAME_MODEL_RTOL if name == "came" else MODEL_RTOL
        for via, ranks, flags in (("one process", 1, layout()), ("--tp 4", 4, layout(tp=4))):
            resume(f"{name}: --tp 2's checkpoint, {via}", SRC[name], ranks, ["--optimizer", *OPTIMIZERS[name]] + flags + batch(1),
                   model_rtol=rtol)
if "adamw" in SRC:  # another count of data-parallel ranks: the same -d, the same windows each step
    resume("adamw: --tp 2's checkpoint (1 data-parallel rank), 2 data-parallel ranks of --tp 1", SRC["adamw"], 2, layout() + batch(1))
    resume("adamw: --tp 2's checkpoint (1 data-parallel rank), 2 data-parallel ranks of --tp 1, --zero 1", SRC["adamw"], 2,
           layout(zero=1) + batch(1))
if os.path.isdir(PP_DP):
    resume("adamw: --pp 2 --zero 1 (2 data-parallel ranks), one process", PP_DP, 1, layout() + batch(2))
    resume("adamw: --pp 2 --zero 1 (2 data-parallel ranks), 4 data-parallel ranks, --zero 1", PP_DP, 4, layout(zero=1) + batch(2))
    resume("adamw: --pp 2 --zero 1 (2 data-parallel ranks), plain data parallelism", PP_DP, 2, layout() + batch(2))
    resume("adamw: --pp 2 --zero 1 (2 data-parallel ranks), --tp 2 --zero 1", PP_DP, 4, layout(tp=2, zero=1) + batch(2))
    resume("adamw: --pp 2 --zero 1 (2 data-parallel ranks), --pp 2 --zero 0 (ZeRO-1 and plain data parallelism: the same sums)",
           PP_DP, 4, layout(pp=2) + batch(2), bitwise=True)
if os.path.isdir(LOWP):
    resume("8-bit state: --tp 2's checkpoint, one process (each slice's blocks requantized)", LOWP, 1,
           layout() + ["--optimizer-state", "8bit"] + batch(1), loss_rtol=LOWP_LOSS_RTOL, model_rtol=LOWP_MODEL_RTOL)
    resume("8-bit state: --tp 2's checkpoint, one process in fp32 state (converted)", LOWP, 1, layout() + batch(1),
           loss_rtol=LOWP_LOSS_RTOL, model_rtol=LOWP_MODEL_RTOL)
if EMU and "adamw" in SRC:
    resume("the CUDA trainer (emulated device, fp32): the CPU's --tp 2 checkpoint, one process", SRC["adamw"], 1,
           layout() + ["--precision", "fp32"] + batch(1), model_rtol=CPU_RTOL, loss_rtol=float(CPU_RTOL), trainer=EMU)
elif not EMU:
    s.skip("the CUDA trainer's resume onto another layout", "no build/emu/train_gpt given")

# ----------------------------------------------------------------------------
# 3. refused before any work, naming the fix

if "adamw" in SRC:
    A = SRC["adamw"]
    s.expect_fail("the adamw checkpoint resumed with --optimizer adafactor on another layout", "the optimizer flags that wrote it",
                  launch(1) + ["--optimizer", "adafactor"] + layout() + batch(1) + ["-o", copy_checkpoint(A, f"{W}/refuse_opt", AT), "-y", "1"])
    D = copy_checkpoint(A, f"{W}/refuse_damaged", AT)
    with open(ckpt(D, "state", AT, "_00001.bin"), "r+b") as f:
        f.truncate(os.path.getsize(ckpt(D, "state", AT, "_00001.bin")) - 4)
    s.expect_fail("a checkpoint whose rank 1 state file is cut short, resumed by one process", ckpt(D, "state", AT, "_00001.bin"),
                  launch(1) + layout() + batch(1) + ["-o", D, "-y", "1"])
    # a matrix that --tp 4 cuts to one column (attprojw of C=4: each rank 4 x 1) under Adafactor: a vector's
    # state there, a matrix's factored state on --tp 2
    NARROW, N4 = f"{FIX}/model_narrow.bin", f"{W}/narrow_tp4"
    write_model(NARROW, L=1, C=4, NH=4, V=64, Vp=64)
    narrow = ["-e", NARROW, "--optimizer", "adafactor", "-n", "2"] + batch(1)
    if s.expect_ok("adafactor: --tp 4 on a model of C=4 (attprojw: one column a rank)",
                   launch(4) + narrow + layout(tp=4) + ["-x", "2", "-o", N4]):
        s.expect_fail("... its checkpoint resumed with --tp 2 (attprojw a matrix there): refused", "is a vector under the checkpoint's --tp 4",
                      launch(2) + narrow + layout(tp=2) + ["-x", "4", "-o", N4, "-y", "1"])
    # checkpoint 10 damaged (rank 1's file cut short): -y 1 on one process skips it, resumes 5 onto the new
    # layout and writes 10 again, with one state file: rank 1's old one of step 10 is removed, not left beside it
    D = f"{W}/rewrite_10"
    shutil.copytree(A, D)
    with open(ckpt(D, "state", STEPS, "_00001.bin"), "r+b") as f:
        f.truncate(os.path.getsize(ckpt(D, "state", STEPS, "_00001.bin")) - 4)
    if s.expect_ok("the --tp 2 run's directory, checkpoint 10 damaged, resumed by one process", launch(1) + layout() + batch(1)
                   + ["-o", D, "-y", "1"]):
        s.check("... checkpoint 10 written again by one rank: one state file of step 10, rank 1's old one removed",
                state_files(D, STEPS) == [f"state_{STEPS:08d}_00000.bin"], f"{state_files(D, STEPS)}")
        losses_close("... ", D, A, LOSS_RTOL)

s.finish()
