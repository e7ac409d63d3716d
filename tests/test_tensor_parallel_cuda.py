"""test_tensor_parallel_cuda.py: tensor and sequence parallelism (--tp N, --sp; doc/tensor_parallel.md) on
the CUDA trainer, over the emulated device and NCCL (or a real GPU box): the ranks of a tensor-parallel
group split each layer's matrices, the embedding and the classifier (cuda/tensor_parallel.cuh), each
group over an NCCL communicator of its own, and train what one process trains:
  - --tp 2, --tp 2 --sp and --tp 2 on 4 ranks (two data-parallel ranks, --zero 1), fp32: every step's
    loss and the final weights against the emulated trainer's own one-process run (the same sums in
    another order: LOSS_RTOL, MODEL_RTOL) and against the CPU trainer's run of the same layout
    (CPU_RTOL, tests/test_cuda.py's tolerance of the two backends);
  - CAME (--sp) and Adafactor (--zero 1 on 4 ranks): their statistics add the group's parts
    (cuda/adafactor.cuh's --tp sums), against one process; AdamW, Adafactor and CAME on --tp 4 (a
    model of 4 heads), Adafactor and CAME on --tp 2 x 2 with --zero 3, against one process;
  - the memory flags on top of --sp (recompute, activation offload) train to the bitwise same model, in
    the emulator's late-nccl stream order (a stream that does not wait for a collective reads stale
    memory there); --zero 3 with --offload optimizer and --loss-chunk under --tp gives --zero 1's
    model with --loss-chunk, bitwise;
  - bf16: --tp 2 --sp ends within BF16_LOSS_RTOL of one process's bf16 losses;
  - the memory measured after the first step equals the plan in every run;
  - a sample drawn during a --tp 2 run and a --tp 2 --sp one (a forward of 1..T tokens, padded to the
    group) is one process's, token for token;
  - a resume from step 3 gives the straight run's model and state files, bitwise; the checkpoint
    (the whole model, each rank's state of its slices) resumes on the CPU trainer;
  - one process resumes the --tp 2 --sp checkpoint (its state moved: llmc/relayout.h) and ends within
    MODEL_RTOL of the straight run;
  - refused: a --tp whose ranks cannot take whole heads and --tp launched without MPI (torchrun-style
    variables; with the emulated build without MPI), each naming the fix.

    python3 tests/test_tensor_parallel_cuda.py ./build/emu/train_gpt ./train_gpt ./test_gpt [./build/emu_nompi/train_gpt]

The model (written here): L=4 C=32 NH=2 (one head a rank), V=64 padded to Vp=80, so that each rank of
--tp 2 holds real tokens (rank 0 0..39, rank 1 40..63 and 16 padded rows) and the fixture's data has
targets on both. 6 steps of B*T = 32 tokens a data-parallel rank: CAME's confidence statistic grows
rounding on this small model past the tolerances from step 7 on (the CPU trainer's --tp 2 and its one
process, both correct, differ by 8e-4 in the loss at step 8 and 1e-2 in the weights at step 10), as it
does for plain data parallelism
(tests/test_pipeline_parallel.py says how far); the CPU suite runs 10 steps on -e tiny.

Tolerances. The row-parallel matmuls' and the column-parallel input gradients' partial sums, the
vocabulary-parallel softmax and the statistics' parts are added in another order than one process
adds them: losses agree to LOSS_RTOL, weights to MODEL_RTOL (relative L2, test_gpt --compare-models,
which leaves out the key biases: their gradient is zero but for rounding, tests/test_tensor_parallel.py
says why), Adafactor and CAME with --eps1 1e-12 as tests/test_zero.py. Against the CPU trainer the two
backends' own orders add to that: CPU_RTOL (tests/test_cuda.py's 1e-4). Prints "ok   name" or "FAIL
name: detail" per check and, last, "N passed, N failed" (", N skipped" without mpirun).
"""

import os
import re
import shutil
import sys

import e2e
from e2e import ckpt, memory_record, same_bytes, same_state, train_rows, write_model

CUDA, TRAIN, TESTER, NOMPI = e2e.usage(sys.argv, ["./build/emu/train_gpt", "./train_gpt", "./test_gpt", "./build/emu_nompi/train_gpt"],
                                       optional=1)
s = e2e.Suite("test_tensor_parallel_cuda", tester=TESTER, run_limit=300)
FIX, W = s.fix, s.root
STEPS = 6
LOSS_RTOL = 2e-6          # log.jsonl prints 6 decimals: 1e-6 absolute is 2.4e-7 of a loss of 4.2
MODEL_RTOL = "1e-5"
CPU_RTOL = "1e-4"
BF16_LOSS_RTOL = 2e-2     # tests/test_cuda.py's: weights and activations rounded to 8 bits of mantissa
BT = 32
LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "launch_local.sh")


MODEL = f"{FIX}/model_tp.bin"
write_model(MODEL)
FLAGS = ["-e", MODEL, "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16", "-x", str(STEPS), "-u", "2",
         "-v", "0", "-s", "0", "-n", "3"]
FP32 = ["--precision", "fp32"]
EPS1 = ["--eps1", "1e-12"]


def batch(data_ranks):
    """-d of one micro-batch on each of data_ranks data-parallel ranks (one process accumulates them)"""
    return ["-d", str(BT * data_ranks)]


def losses_close(name, a, b, rtol):
    la, lb = [row[1] for row in train_rows(a)], [row[1] for row in train_rows(b)]
    if len(la) != STEPS or len(lb) != STEPS:
        return s.fail(f"{name}: the losses of the {STEPS} steps", f"steps logged: {len(la)} and {len(lb)}")
    worst = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    return s.check(f"{name}: the losses of the {STEPS} steps within {rtol:g} (worst {worst:.2e} relative)", worst <= rtol,
                   f"worst {worst:.2e}: {la} vs {lb}")


def models_close(name, a, b, rtol):
    r = s.run([TESTER, "--compare-models", ckpt(a, "model", STEPS, ".bin"), ckpt(b, "model", STEPS, ".bin"), rtol])
    detail = r.out.strip()
    return s.check(f"{name}: the final weights within {rtol} ({detail.removeprefix('models: ')})", r.rc == 0,
                   f"exit code {r.rc}: {detail} {r.err[:300]}")


def same_model(name, a, b):
    s.check(f"{name}: the model at step {STEPS} bit for bit", same_bytes(ckpt(a, "model", STEPS, ".bin"), ckpt(b, "model", STEPS, ".bin")),
            "the model files differ")


run_of = {}  # each run's result by its folder


def one(name, out, flags, trainer=None):
    """one process of the trainer (the CUDA one unless given); its memory checked against the plan"""
    r = s.expect_ok(name, [trainer or CUDA] + FLAGS + flags + ["-o", out])
    if r:
        s.check_memory(f"{name}: measured memory equals the plan", out)
    run_of[out] = r
    return r


MPIRUN, why_not = e2e.mpi_launcher(CUDA)


def ranks(name, n, out, flags, trainer=None, env=()):
    """mpirun -np N of the trainer (the CUDA one unless given) on FLAGS, the emulator's variables ENV
    ("CUDA_EMU_STREAMS=late-nccl"); its memory checked against the plan"""
    extra = []
    for v in env:
        extra += ["-x", v]
    r = s.expect_ok(name, MPIRUN + [str(n)] + extra + [trainer or CUDA] + FLAGS + flags + ["-o", out])
    if r:
        s.check_memory(f"{name}: measured memory equals the plan", out)
    run_of[out] = r
    return r


# ----------------------------------------------------------------------------
# 1. the refusals that need no ranks: the shared checks reach the CUDA trainer before any work

s.expect_fail("--tp 2 on one process", "1 rank(s) do not split into tensor-parallel groups of 2",
              [CUDA] + FLAGS + FP32 + ["--tp", "2", "-o", ""])
s.expect_fail("--tp 4 on a model of 2 heads (each rank takes whole heads)", "the model's 2 heads do not split over 4 ranks",
              [CUDA, "--plan", "-e", MODEL, "-b", "2", "-t", "16", "--tp", "4", "--plan-ranks", "4"])

if MPIRUN is None:
    s.skip("the CUDA trainer's --tp on 2 and 4 ranks", why_not)
    s.finish()

# ----------------------------------------------------------------------------
# 2. fp32, AdamW: --tp 2, --tp 2 --sp, --tp 2 x 2 data-parallel ranks against one process and the CPU

ONE, ONE2 = f"{W}/one", f"{W}/one_d2"
one("one process (emulated device)", ONE, FP32 + batch(1) + ["-s", "3", "-g", "8"])
one("one process, two micro-batches (emulated device)", ONE2, FP32 + batch(2))
LAYOUTS = (("--tp 2", 2, ["--tp", "2"] + batch(1), ONE, "tp2"),
           ("--tp 2 --sp", 2, ["--tp", "2", "--sp"] + batch(1), ONE, "sp2"),
           ("--tp 2 x 2 data-parallel ranks, --zero 1", 4, ["--tp", "2", "--zero", "1"] + batch(2), ONE2, "tp2_z1"))
for label, n, flags, ref, tag in LAYOUTS:
    gpu, cpu = f"{W}/{tag}", f"{W}/cpu_{tag}"
    extra = ["-s", "3", "-g", "8"] if tag == "tp2" else []  # a sample during the run (section 5)
    if not ranks(f"{label} (emulated device)", n, gpu, FP32 + flags + extra):
        continue
    losses_close(f"{label} against one process", gpu, ref, LOSS_RTOL)
    models_close(f"{label} against one process", gpu, ref, MODEL_RTOL)
    if ranks(f"{label} (CPU trainer)", n, cpu, flags, trainer=TRAIN):
        losses_close(f"{label}: the CUDA trainer against the CPU trainer's", gpu, cpu, float(CPU_RTOL))
        models_close(f"{label}: the CUDA trainer against the CPU trainer's", gpu, cpu, CPU_RTOL)
if os.path.isfile(ckpt(ONE, "DONE", STEPS)) and os.path.isfile(ckpt(f"{W}/tp2", "DONE", STEPS)):
    a1, a2 = (memory_record(d)["measured"]["activations"] for d in (ONE, f"{W}/tp2"))
    s.check(f"--tp 2: a rank's activations {a2} bytes, less than one process's {a1} (its heads, hidden units and logits' columns)",
            a2 < a1, "not less")
    a3 = memory_record(f"{W}/sp2")["measured"]["activations"] if os.path.isfile(ckpt(f"{W}/sp2", "DONE", STEPS)) else None
    s.check(f"--tp 2 --sp: a rank's activations {a3} bytes, less than --tp 2's {a2} (the residual stream's rows halved)",
            a3 is not None and a3 < a2, "not less")

# ----------------------------------------------------------------------------
# 3. Adafactor and CAME: their statistics add the group's parts (and ZeRO's, with --zero 1)

for label, opt, n, flags, data_ranks in (("CAME, --tp 2 --sp", ["--optimizer", "came"] + EPS1, 2, ["--tp", "2", "--sp"], 1),
                                         ("Adafactor, --tp 2 --sp", ["--optimizer", "adafactor"] + EPS1, 2, ["--tp", "2", "--sp"], 1),
                                         ("Adafactor, --tp 2 x 2 data-parallel ranks, --zero 1",
                                          ["--optimizer", "adafactor", "--adafactor-beta1", "0.9"] + EPS1, 4, ["--tp", "2", "--zero", "1"], 2)):
    tag = re.sub(r"[^a-z0-9]+", "_", label.lower())
    ref, out = f"{W}/{tag}_one", f"{W}/{tag}"
    if one(f"{label.split(',')[0]}: one process", ref, FP32 + opt + batch(data_ranks)) and ranks(label, n, out, FP32 + opt + flags + batch(data_ranks)):
        losses_close(f"{label} against one process", out, ref, LOSS_RTOL)
        models_close(f"{label} against one process", out, ref, MODEL_RTOL)

# every optimizer on --tp 4 (a model of 4 heads: 20 of the padded vocabulary's 80 rows a rank, the last
# rank's 4 real ones among them), and Adafactor and CAME on --tp 2 x 2 data-parallel ranks with --zero 3
MODEL4 = f"{FIX}/model_tp4.bin"
write_model(MODEL4, L=2, C=32, NH=4)
OPTIMIZERS = {"AdamW": [], "Adafactor": ["--optimizer", "adafactor"] + EPS1, "CAME": ["--optimizer", "came"] + EPS1}
for name, opt in OPTIMIZERS.items():
    ref, out = f"{W}/tp4_{name}_one", f"{W}/tp4_{name}"
    if one(f"{name}: one process, the 4-head model", ref, ["-e", MODEL4] + FP32 + opt + batch(1)) and \
            ranks(f"{name}: --tp 4", 4, out, ["-e", MODEL4] + FP32 + opt + ["--tp", "4"] + batch(1)):
        losses_close(f"{name}: --tp 4 against one process", out, ref, LOSS_RTOL)
        models_close(f"{name}: --tp 4 against one process", out, ref, MODEL_RTOL)
for name in ("Adafactor", "CAME"):
    ref, out = f"{W}/z3_{name}_one", f"{W}/z3_{name}"
    if one(f"{name}: one process, two micro-batches", ref, FP32 + OPTIMIZERS[name] + batch(2)) and \
            ranks(f"{name}: --tp 2 x 2 data-parallel ranks, --zero 3", 4, out, FP32 + OPTIMIZERS[name] + ["--tp", "2", "--zero", "3"] + batch(2)):
        losses_close(f"{name}: --tp 2 x 2, --zero 3 against one process", out, ref, LOSS_RTOL)
        models_close(f"{name}: --tp 2 x 2, --zero 3 against one process", out, ref, MODEL_RTOL)

# ----------------------------------------------------------------------------
# 4. the memory flags: bitwise the same model, in the late-nccl stream order

SP = f"{W}/sp2"
MF = f"{W}/sp2_flags"
if ranks("--tp 2 --sp --recompute 2,gelu --offload 1, late-nccl streams", 2, MF,
         FP32 + ["--tp", "2", "--sp", "--recompute", "2,gelu", "--offload", "1", "-s", "3", "-g", "8"] + batch(1),
         env=["CUDA_EMU_STREAMS=late-nccl"]):
    same_model("--tp 2 --sp with recompute and offload (late-nccl streams) against plain --tp 2 --sp", MF, SP)
LC1, LC3 = f"{W}/tp2_z1_lc", f"{W}/tp2_z3_lc_oo"
if ranks("--tp 2 x 2, --zero 1 --loss-chunk 12", 4, LC1, FP32 + ["--tp", "2", "--zero", "1", "--loss-chunk", "12"] + batch(2)) and \
        ranks("--tp 2 x 2, --zero 3 --offload optimizer --loss-chunk 12, late-nccl streams", 4, LC3,
              FP32 + ["--tp", "2", "--zero", "3", "--offload", "optimizer", "--loss-chunk", "12"] + batch(2), env=["CUDA_EMU_STREAMS=late-nccl"]):
    same_model("--tp 2 x 2: --zero 3 with the optimizer on the host (late-nccl streams) against --zero 1", LC3, LC1)
    models_close("--tp 2 x 2 with --loss-chunk 12 against one process", LC1, ONE2, MODEL_RTOL)

# bf16 (the GPU's default): the partial sums in bf16, the losses close to one process's
B1, BS = f"{W}/one_bf16", f"{W}/sp2_bf16"
if one("bf16: one process", B1, batch(1)) and ranks("bf16: --tp 2 --sp", 2, BS, ["--tp", "2", "--sp"] + batch(1)):
    losses_close("bf16: --tp 2 --sp against one process", BS, B1, BF16_LOSS_RTOL)

# ----------------------------------------------------------------------------
# 5. sampling: a sample drawn during a --tp 2 run is one process's (every rank of the group asks for one
# position's probabilities, gathered whole from the ranks' columns; with --sp a forward of 1..T tokens
# is padded to a multiple of the group): with the same seed the same tokens (their probabilities agree
# to rounding, and a draw falls on a boundary between two tokens with a chance of about 1e-6)


def sample_of(run_dir):
    """the tokens of the sample at step 3 in a run's output"""
    r = run_of.get(run_dir)
    lines = r.out.splitlines() if r else []
    at = [i for i, line in enumerate(lines) if line.startswith("---- sample at step 3")]
    return lines[at[0] + 1] if at and at[0] + 1 < len(lines) else None


for label, run_dir in (("--tp 2", f"{W}/tp2"), ("--tp 2 --sp with recompute and offload", MF)):
    if run_of.get(run_dir) and run_of.get(ONE):
        s.check(f"{label}: the sample at step 3 is one process's (the same tokens)", sample_of(ONE) and sample_of(ONE) == sample_of(run_dir),
                f"one process: {sample_of(ONE)!r}; {label}: {sample_of(run_dir)!r}")


# ----------------------------------------------------------------------------
# 6. files: a resume is bitwise; the checkpoint resumes on the CPU, and on one process (another layout)

if os.path.isfile(ckpt(SP, "DONE", 3)):
    R = f"{W}/sp2_resume"
    os.makedirs(R)
    for f in [ckpt(SP, "model", 3, ".bin"), ckpt(SP, "DONE", 3), ckpt(SP, "state", 3, "_00000.bin"), ckpt(SP, "state", 3, "_00001.bin")]:
        shutil.copy(f, R)
    X = f"{W}/sp2_resume_cpu"
    shutil.copytree(R, X)
    if ranks("--tp 2 --sp resumes from step 3", 2, R, FP32 + ["--tp", "2", "--sp", "-y", "1"] + batch(1)):
        same_model("--tp 2 --sp resumed from step 3 against the straight run", R, SP)
        for rank in (0, 1):
            s.check(f"--tp 2 --sp resumed: rank {rank}'s state at step {STEPS} the straight run's (but the run identity)",
                    same_state(ckpt(SP, "state", STEPS, f"_{rank:05d}.bin"), ckpt(R, "state", STEPS, f"_{rank:05d}.bin")), "differs")
    if ranks("the CPU trainer resumes the CUDA --tp 2 --sp checkpoint of step 3", 2, X, ["--tp", "2", "--sp", "-y", "1"] + batch(1),
             trainer=TRAIN):
        models_close("the CPU trainer's resume of the CUDA checkpoint against the CUDA run", X, SP, CPU_RTOL)
    # onto another layout (llmc/relayout.h): one process of the CUDA trainer takes the --tp 2 --sp state
    O = f"{W}/sp2_resume_one"
    os.makedirs(O)
    for f in [ckpt(SP, "model", 3, ".bin"), ckpt(SP, "DONE", 3), ckpt(SP, "state", 3, "_00000.bin"), ckpt(SP, "state", 3, "_00001.bin")]:
        shutil.copy(f, O)
    if one("one process resumes the --tp 2 --sp checkpoint of step 3 (its state moved onto one process's layout)", O,
           FP32 + ["-y", "1"] + batch(1)):
        models_close("one process's resume of the --tp 2 --sp checkpoint against the straight run", O, SP, MODEL_RTOL)
else:
    s.fail("--tp 2 --sp checkpoints", f"no checkpoint 3 in {SP}")

# ----------------------------------------------------------------------------
# 7. --tp launched without MPI: dist_grid refuses the tensor group (its collectives go over the world only)

if NOMPI and os.path.isfile(NOMPI):
    meet = f"{W}/meet"
    os.makedirs(meet)
    s.expect_fail("--tp 2 started by torchrun-style variables (no MPI)", "launch with mpirun (or srun --mpi=pmix) for tensor parallelism",
                  ["bash", LAUNCH, "2", NOMPI, "--dist-init", f"file:{meet}"] + FLAGS + FP32 + ["--tp", "2", "-o", ""],
                  env={"CUDA_EMU_DEVICES": "2"})
else:
    s.skip("--tp launched without MPI", "no build/emu_nompi/train_gpt given")

s.finish()
