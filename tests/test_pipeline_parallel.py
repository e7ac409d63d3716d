"""test_pipeline_parallel.py: pipeline parallelism (--pp N, doc/pipeline_parallel.md) end to end on the
CPU trainer: N ranks that each hold a stage of contiguous layers, the step's micro-batches flowing through
them in 1F1B's or GPipe's order, train as one process that accumulates the same micro-batches does: for
every optimizer on 2, 3 and 4 stages, with the memory flags, and inside two data-parallel ranks (--zero
0, 1, 2, 3); every stage's measured memory equals its plan, and the first stage's activations under 1F1B
are N/m of GPipe's; a resume is bitwise (onto another layout: tests/test_relayout.py); a rank killed mid-run ends
the others, and the resume from the last checkpoint ends where the run never stopped would; and the
layouts that cannot be stop before any work, naming the fix.

    python3 tests/test_pipeline_parallel.py ./train_gpt ./test_gpt [./build/emu/train_gpt]

The runs are test_gpt's deep fixture (L=5 C=32 NH=2 V=64 maxT=32: five layers, for 2, 3 and 4 stages) on
its shards, B*T = 32 tokens a micro-batch, m = 4 micro-batches a step (-d) unless said. Without mpirun
(or with a train_gpt built without MPI) the multi-rank part is skipped and counted.

Tolerances. What a stage computes is what one process computes for its layers, in the same order: each
layer's gradients add up over the micro-batches 0 .. m-1 under either schedule. So after one step with
--grad-clip 0 every weight but wte is bitwise one process's. wte's gradient has two parts, the
classifier's (last stage) and the embedding's (first stage), which one process adds micro-batch by
micro-batch and the pipeline adds as two sums (pp_sum_pair): within WTE_RTOL. From the second step on
that rounding is in the weights, and the gradient norm adds its stages' parts in another order: losses
agree to LOSS_RTOL and weights to MODEL_RTOL (test_gpt --compare-models, which leaves out the key
biases: tests/test_tensor_parallel.py says why); CAME's to CAME_MODEL_RTOL: its confidence term (the
squared gap between the update and its mean) grows a rounding difference on this small model from
3e-7 at step 5 to 1.9e-5 at step 10, as it does for plain data parallelism (3 ranks against one
process, the same micro-batches: 5.6e-5 at step 10). Bitwise: 1F1B against GPipe, the memory flags'
recompute and offload on top of --pp, ZeRO-1 against plain data parallelism, and a resume. The optimizer
state in 8 bits is held to LOWP_LOSS_RTOL and LOWP_MODEL_RTOL (a stage's blocks quantize as the whole
model's do, but wte's rounding moves a block's absmax).
"""

import os
import re
import signal
import subprocess
import sys
import time

import e2e
from e2e import ckpt, copy_checkpoint, read_log, same_bytes, same_state, train_rows, model_differences

TRAIN, TESTER, EMU = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/emu/train_gpt"], optional=1)
s = e2e.Suite("test_pipeline_parallel", tester=TESTER, run_limit=120)
FIX, W = s.fix, s.root
STEPS = 10
M = 4                     # micro-batches a step
BT = 32                   # B*T: the tokens of a micro-batch
LOSS_RTOL = 2e-6          # log.jsonl prints 6 decimals: 1e-6 absolute is 2.5e-7 of a loss of 4.16
MODEL_RTOL = "1e-5"       # as test_gpt --compare-models reads it (measured 5e-8)
CAME_MODEL_RTOL = "1e-4"  # measured 1.9e-5 (see the top)
WTE_RTOL = 1e-6           # wte after one step, relative L2 (measured 3e-12)
LOWP_LOSS_RTOL = 5e-5
LOWP_MODEL_RTOL = "5e-3"
KILL_BOUND_S = 20         # the others end within this of a rank's death (mpirun ends them)

FLAGS = ["-e", f"{FIX}/model_deep.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-x", str(STEPS), "-u", "2", "-v", "0", "-s", "0", "-n", "5"]
BASE = [TRAIN] + FLAGS
EPS1 = ["--eps1", "1e-12"]
OPTIMIZERS = {"adamw": ["adamw"], "adafactor": ["adafactor"] + EPS1, "came": ["came"] + EPS1}

def batch(data_ranks=1, m=M):
    """-d of m micro-batches on each of data_ranks data-parallel ranks"""
    return ["-d", str(BT * m * data_ranks)]


def one_step_bitwise(name, one, pp):
    """after one step with --grad-clip 0: every tensor but wte bitwise, wte within WTE_RTOL"""
    try:
        differ, r = model_differences(one, pp, 1)
    except OSError as e:
        return s.fail(f"{name}: the models after one step", repr(e))
    s.check(f"{name}: after one step every tensor but wte bitwise one process's", not differ, f"differ: {differ}")
    s.check(f"{name}: ... and wte within {WTE_RTOL} ({r:.1e}: its two stages' gradients added as two sums)", r <= WTE_RTOL,
            f"{r:.3e}")


def losses_close(name, a, b, rtol=LOSS_RTOL):
    la, lb = [row[1] for row in train_rows(a)], [row[1] for row in train_rows(b)]
    if len(la) != len(lb) or not la:
        return s.fail(f"{name}: losses agree", f"steps logged: {len(la)} and {len(lb)}")
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    return s.check(f"{name}: losses of the {len(la)} steps agree (worst {worst:.2e} relative)", worst <= rtol, f"worst {worst:.2e} > {rtol}")


def models_close(name, a, b, rtol=MODEL_RTOL, step=STEPS):
    r = s.run([TESTER, "--compare-models", ckpt(a, "model", step, ".bin"), ckpt(b, "model", step, ".bin"), rtol])
    detail = r.out.strip()
    return s.check(f"{name}: final weights agree to {rtol} ({detail.removeprefix('models: ')})", r.rc == 0,
                   f"exit code {r.rc}: {detail} {r.err[:300]}")


def stage_memory(name, run_dir, stages):
    """log.jsonl's memory_stages record: every stage's measured bytes equal its plan; the record"""
    recs = [r["memory_stages"] for r in read_log(run_dir) if "memory_stages" in r]
    if len(recs) != 1 or len(recs[0]) != stages:
        s.fail(f"{name}: every stage's memory recorded", f"{len(recs)} records in {run_dir}/log.jsonl")
        return None
    bad = [f"stage {i} {k}: planned {st['planned'][k]} measured {st['measured'][k]}"
           for i, st in enumerate(recs[0]) for k in st["planned"] if st["planned"][k] != st["measured"][k]]
    s.check(f"{name}: each of the {stages} stages' measured memory = its plan", not bad, "; ".join(bad))
    return recs[0]


def val_and_sample(out):
    """the validation lines ("step N | val loss x") and each sample's text, as printed"""
    lines = out.splitlines()
    vals = [x for x in lines if "| val loss " in x]
    return vals + [lines[i + 1] for i, x in enumerate(lines) if x.startswith("---- sample") and i + 1 < len(lines)]


# ----------------------------------------------------------------------------
# 1. without ranks: the layouts that cannot be, and the plan of each stage

s.expect_fail("--pp 0 is refused", "--pp 0: the stages the layers are split into, at least 1", BASE + ["--pp", "0", "-o", ""])
s.expect_fail("--pp 2 with one process", "--pp 2: 1 rank(s) do not split into 2 stages", BASE + ["--pp", "2", "-o", ""])
s.expect_fail("--pp 6 on a model of 5 layers", "--pp 6: the model's 5 layers do not fill 6 stages",
              [TRAIN, "--plan", "-e", f"{FIX}/model_deep.bin", "--pp", "6", "--plan-ranks", "6"])
s.expect_fail("--plan --pp 2 for 3 ranks", "--pp 2: 3 rank(s) do not split into 2 stages",
              [TRAIN, "--plan", "-e", f"{FIX}/model_deep.bin", "--pp", "2", "--plan-ranks", "3"])
s.expect_fail("--pp-schedule without --pp", "but this run has --pp 1", BASE + ["--pp-schedule", "gpipe", "-o", ""])
s.expect_fail("--pp-schedule of another name", "--pp-schedule", BASE + ["--pp", "2", "--pp-schedule", "interleaved", "-o", ""])
if EMU:  # the CUDA trainer has --pp (tests/test_pipeline_parallel_cuda.py): the shared checks reach it
    s.expect_fail("the CUDA trainer (emulated device): --pp 2 with one process", "--pp 2: 1 rank(s) do not split into 2 stages",
                  [EMU] + FLAGS + ["--pp", "2", "-o", ""])
else:
    s.skip("the CUDA trainer's shared --pp checks", "no build/emu/train_gpt given")

# d12 on 4 stages of B=4 T=1024, m = 32: the split, the bubble, and each stage's plan; under 1F1B stage s
# holds N - s micro-batches' activations, under GPipe all m (the first stage's: N/m of GPipe's)
D12 = [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "1024", "-d", str(4 * 1024 * 32), "--pp", "4", "--plan-ranks", "4"]
r1, rg = s.expect_ok("--plan -e d12 --pp 4, m = 32", D12), s.expect_ok("--plan -e d12 --pp 4 --pp-schedule gpipe", D12 + ["--pp-schedule", "gpipe"])
if r1 and rg:
    s.check("--plan --pp 4: the bubble 3/35 and 1F1B's micro-batches held by stage",
            "1f1b, 4 stages, 32 micro-batches: bubble 3/35 = 8.6%; activations of at most 4, 3, 2, 1 micro-batches" in r1.out, r1.out[-900:])
    s.check("--plan --pp 4: the split, stage by stage", "stage 3 (layers 9-11 + final LayerNorm, classifier)" in r1.out, r1.out[-900:])
    acts1 = [float(x) for x in re.findall(r"^  stage \d+ \([^)]*\): [0-9.]+ MiB, activations ([0-9.]+) MiB", r1.out, re.M)]
    actsg = [float(x) for x in re.findall(r"^  stage \d+ \([^)]*\): [0-9.]+ MiB, activations ([0-9.]+) MiB", rg.out, re.M)]
    if len(acts1) == 4 and len(actsg) == 4:
        ratio = acts1[0] / actsg[0]
        s.check(f"--plan --pp 4 m 32: stage 0's activations under 1F1B {acts1[0]} MiB = N/m = 1/8 of GPipe's {actsg[0]} ({ratio:.3f})",
                abs(ratio - 4 / 32) < 0.01, f"{ratio}")
    else:
        s.fail("--plan --pp 4: a line a stage", r1.out[-900:])
    s.check("--plan --pp 4: the table is the largest stage's", "(--pp 4: stage 0's, the largest)" in r1.out, r1.out[:400])
# the search over the stage count and the schedule: 110,592 combinations on several ranks, GPipe with
# --pp 1 refused (it would change nothing), and pipelines planned
rs = s.expect_ok("--plan --max-memory on 4 ranks searches --pp and --pp-schedule",
                 [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "1024", "-d", str(4 * 1024 * 16), "--plan-ranks", "4", "--max-memory", "3GiB"])
if rs:
    s.check("... 110,592 combinations", '"combinations": 110592' in rs.out, rs.out[-600:])
    s.check("... rows with --pp 4 --pp-schedule gpipe planned", re.search(r"\| 4 +\| gpipe +\|", rs.out), rs.out[-600:])
    s.check("... --pp-schedule gpipe with --pp 1 refused", "--pp-schedule gpipe orders the micro-batches of a pipeline's stages, but this run has --pp 1"
            in rs.out, rs.out[-600:])

MPIRUN, why_not = e2e.mpi_launcher(TRAIN)
if MPIRUN is None:
    s.skip("the multi-rank checks (mpirun -np 2, 3 and 4)", why_not)
    s.finish()


def pp_run(name, ranks, flags, out):
    return s.expect_ok(name, MPIRUN + [str(ranks)] + BASE + flags + ["-o", out])


# ----------------------------------------------------------------------------
# 2. each optimizer on 2, 3 and 4 stages: one step bitwise (but wte), ten steps to rounding; 1F1B and
# GPipe bitwise each other

ONE_STEP = ["-x", "1", "-n", "1", "--grad-clip", "0"]
for name, opt in OPTIMIZERS.items():
    one, one1 = f"{W}/{name}_one", f"{W}/{name}_one_step"
    if not (s.expect_ok(f"{name}: one process, {M} micro-steps", BASE + ["--optimizer", *opt] + batch() + ["-o", one])
            and s.expect_ok(f"{name}: one process, one step, --grad-clip 0", BASE + ["--optimizer", *opt] + batch() + ONE_STEP + ["-o", one1])):
        continue
    for N in (2, 3, 4):
        p1 = f"{W}/{name}_pp{N}_step"
        if pp_run(f"{name}: mpirun -np {N} --pp {N}, one step, --grad-clip 0", N, ["--optimizer", *opt, "--pp", str(N)] + batch() + ONE_STEP, p1):
            one_step_bitwise(f"{name}: --pp {N}", one1, p1)
        if name != "adamw" and N != 3:
            continue  # ten steps: every stage count for AdamW, 3 stages for the others
        pp = f"{W}/{name}_pp{N}"
        if pp_run(f"{name}: mpirun -np {N} --pp {N}", N, ["--optimizer", *opt, "--pp", str(N)] + batch(), pp):
            losses_close(f"{name}: --pp {N} vs one process", one, pp)
            models_close(f"{name}: --pp {N} vs one process", one, pp, CAME_MODEL_RTOL if name == "came" else MODEL_RTOL)
            stage_memory(f"{name}: --pp {N}", pp, N)
for N in (2, 4):
    g1 = f"{W}/adamw_pp{N}_gpipe_step"
    if pp_run(f"adamw: mpirun -np {N} --pp {N} --pp-schedule gpipe, one step, --grad-clip 0", N,
              ["--pp", str(N), "--pp-schedule", "gpipe"] + batch() + ONE_STEP, g1):
        one_step_bitwise(f"adamw: --pp {N} --pp-schedule gpipe", f"{W}/adamw_one_step", g1)
    g, p = f"{W}/adamw_pp{N}_gpipe", f"{W}/adamw_pp{N}"
    if pp_run(f"adamw: mpirun -np {N} --pp {N} --pp-schedule gpipe", N, ["--pp", str(N), "--pp-schedule", "gpipe"] + batch(), g):
        s.check(f"adamw: --pp {N}: GPipe's model at step {STEPS} bitwise 1F1B's (the same sums in the same order)",
                same_bytes(ckpt(g, "model", STEPS, ".bin"), ckpt(p, "model", STEPS, ".bin")), "cmp differs")
        stage_memory(f"adamw: --pp {N} --pp-schedule gpipe", g, N)

# the first stage's activations: 1F1B holds N of the m micro-batches, GPipe all of them (m = 8, N = 2)
F8, G8 = f"{W}/adamw_pp2_m8", f"{W}/adamw_pp2_m8_gpipe"
if pp_run("adamw: --pp 2, 8 micro-batches", 2, ["--pp", "2", "-x", "1"] + batch(m=8), F8) and \
        pp_run("adamw: --pp 2 --pp-schedule gpipe, 8 micro-batches", 2, ["--pp", "2", "--pp-schedule", "gpipe", "-x", "1"] + batch(m=8), G8):
    a, b = stage_memory("--pp 2 m 8", F8, 2), stage_memory("--pp 2 m 8 gpipe", G8, 2)
    if a and b:
        fa, fg = a[0]["measured"]["activations"], b[0]["measured"]["activations"]
        s.check(f"--pp 2 m 8: stage 0's measured activations under 1F1B {fa} bytes about N/m = 1/4 of GPipe's {fg} ({fa / fg:.3f})",
                abs(fa / fg - 0.25) < 0.03, f"{fa / fg:.3f}")

# ----------------------------------------------------------------------------
# 3. the memory flags on 3 stages: recompute and offload change no bit; flash attention and the head
# in chunks, and the optimizer state in 8 bits, against one process with the same flags

P3 = f"{W}/adamw_pp3"
RO = f"{W}/adamw_pp3_recompute_offload"
if pp_run("adamw: --pp 3 --recompute 1,gelu,attn --offload 1", 3, ["--pp", "3", "--recompute", "1,gelu,attn", "--offload", "1"] + batch(), RO):
    s.check(f"adamw: --pp 3 with recompute and offload: the model at step {STEPS} bitwise plain --pp 3's",
            same_bytes(ckpt(RO, "model", STEPS, ".bin"), ckpt(P3, "model", STEPS, ".bin")), "cmp differs")
    stage_memory("adamw: --pp 3 with recompute and offload", RO, 3)
for label, flags, lowp in (("flash attention, --loss-chunk 8", ["--attention", "flash", "--loss-chunk", "8"], False),
                           ("--recompute 2", ["--recompute", "2"], False),
                           ("--optimizer-state 8bit", ["--optimizer-state", "8bit"], True)):
    tag = re.sub(r"[^a-z0-9]+", "_", label)
    one, pp = f"{W}/{tag}_one", f"{W}/{tag}_pp3"
    if s.expect_ok(f"{label}: one process", BASE + flags + batch() + ["-o", one]) and \
            pp_run(f"{label}: mpirun -np 3 --pp 3", 3, flags + ["--pp", "3"] + batch(), pp):
        losses_close(f"{label}: --pp 3 vs one process", one, pp, LOWP_LOSS_RTOL if lowp else LOSS_RTOL)
        models_close(f"{label}: --pp 3 vs one process", one, pp, LOWP_MODEL_RTOL if lowp else MODEL_RTOL)
        stage_memory(f"{label}: --pp 3", pp, 3)

# ----------------------------------------------------------------------------
# 4. inside data parallelism: --pp 2 on 4 ranks (two data-parallel ranks a stage), --zero 0, 1, 2 and 3,
# against one process that accumulates both ranks' micro-batches; ZeRO-1 bitwise plain; replicas checked
# (wte's two copies, on the first and the last stage, among them)
ONE2 = f"{W}/adamw_one_d2"
if s.expect_ok("adamw: one process, 2 x 4 micro-steps", BASE + batch(2) + ["-o", ONE2]):
    for zero in ("0", "1", "2"):
        out = f"{W}/adamw_pp2_dp2_z{zero}"
        r = pp_run(f"adamw: mpirun -np 4 --pp 2 --zero {zero} --check-replicas", 4, ["--pp", "2", "--zero", zero, "--check-replicas"] + batch(2), out)
        if r:
            losses_close(f"adamw: --pp 2 x 2 data-parallel ranks, --zero {zero}, vs one process", ONE2, out)
            models_close(f"adamw: --pp 2 x 2 data-parallel ranks, --zero {zero}, vs one process", ONE2, out)
            s.check(f"adamw: --pp 2 --zero {zero}: the whole model (wte's two copies too) the same on all 4 ranks every step",
                    re.search(rf"^replicas: parameters identical on 4 ranks after step {STEPS} ", r.out, re.M), r.out[-300:])
            stage_memory(f"adamw: --pp 2 --zero {zero}", out, 2)
    s.check("adamw: --pp 2 x 2 data-parallel ranks: --zero 1's model bitwise --zero 0's",
            same_bytes(ckpt(f"{W}/adamw_pp2_dp2_z0", "model", STEPS, ".bin"), ckpt(f"{W}/adamw_pp2_dp2_z1", "model", STEPS, ".bin")), "cmp differs")
    # --zero 3: each stage's weights its data-parallel ranks' blocks, gathered a layer at a time; checkpoints
    # move them a slice at a time through the stages' stream (cpu/pipeline.h): ZeRO-2's model bitwise, and a
    # resume (the stages' blocks read from the whole model file) bitwise the straight run
    Z3 = f"{W}/adamw_pp2_dp2_z3"
    if pp_run("adamw: mpirun -np 4 --pp 2 --zero 3", 4, ["--pp", "2", "--zero", "3"] + batch(2), Z3):
        s.check("adamw: --pp 2 x 2 data-parallel ranks: --zero 3's model bitwise --zero 2's (the same gradient sums)",
                same_bytes(ckpt(f"{W}/adamw_pp2_dp2_z2", "model", STEPS, ".bin"), ckpt(Z3, "model", STEPS, ".bin")), "cmp differs")
        stage_memory("adamw: --pp 2 --zero 3", Z3, 2)
        if os.path.isfile(ckpt(Z3, "DONE", 5)):
            R = copy_checkpoint(Z3, f"{W}/adamw_pp2_dp2_z3_resume", 5)
            if pp_run("adamw: --pp 2 --zero 3 resumes from step 5", 4, ["--pp", "2", "--zero", "3", "-y", "1"] + batch(2), R):
                s.check(f"adamw: --pp 2 --zero 3 resumed: the model at step {STEPS} bitwise the straight run's",
                        same_bytes(ckpt(Z3, "model", STEPS, ".bin"), ckpt(R, "model", STEPS, ".bin")), "cmp differs")

# validation and a sample: the last stage's loss and probabilities, reported on rank 0 as one process's
VS = ["-v", "5", "-m", "2", "-j", f"{FIX}/val.bin", "-s", "10", "-g", "8", "-n", "0"]
r1 = s.expect_ok("one process: validation and a sample", BASE + batch() + VS + ["-o", f"{W}/vs_one"])
r2 = pp_run("--pp 3: validation and a sample", 3, ["--pp", "3"] + batch() + VS, f"{W}/vs_pp3")
if r1 and r2:
    s.check("--pp 3: the validation losses and the sample are one process's",
            len(val_and_sample(r1.out)) >= 3 and val_and_sample(r1.out) == val_and_sample(r2.out),
            f"{val_and_sample(r1.out)} vs {val_and_sample(r2.out)}")

# --tp 2 inside each stage (4 ranks: 2 stages of a tensor-parallel pair; 8 with two data-parallel ranks),
# test_gpt's fixture of 4 heads: one step bitwise (but wte) the --tp 2 run's of the same micro-batches,
# ten steps against one process, a sample one process's, every stage's memory = plan, a resume bitwise
HS8 = ["-e", f"{FIX}/model_hs8.bin"]
TP1, TPP1 = f"{W}/tp2_step", f"{W}/tp2_pp2_step"
if pp_run("--tp 2 (2 ranks), one step, --grad-clip 0", 2, HS8 + ["--tp", "2"] + batch() + ONE_STEP, TP1) and \
        pp_run("--tp 2 --pp 2 (4 ranks), one step, --grad-clip 0", 4, HS8 + ["--tp", "2", "--pp", "2"] + batch() + ONE_STEP, TPP1):
    one_step_bitwise("--tp 2 --pp 2 against --tp 2", TP1, TPP1)
ONE_HS8, TPP = f"{W}/hs8_one", f"{W}/tp2_pp2"
if s.expect_ok("one process, the 4-head fixture", BASE + HS8 + batch() + ["-o", ONE_HS8]) and \
        pp_run("--tp 2 --pp 2 (4 ranks)", 4, HS8 + ["--tp", "2", "--pp", "2"] + batch(), TPP):
    losses_close("--tp 2 --pp 2 vs one process", ONE_HS8, TPP)
    models_close("--tp 2 --pp 2 vs one process", ONE_HS8, TPP)
    stage_memory("--tp 2 --pp 2", TPP, 2)
    if os.path.isfile(ckpt(TPP, "DONE", 5)):
        R = copy_checkpoint(TPP, f"{W}/tp2_pp2_resume", 5)
        if pp_run("--tp 2 --pp 2 resumes from step 5", 4, HS8 + ["--tp", "2", "--pp", "2", "-y", "1"] + batch(), R):
            s.check(f"--tp 2 --pp 2 resumed: the model at step {STEPS} bitwise the straight run's",
                    same_bytes(ckpt(TPP, "model", STEPS, ".bin"), ckpt(R, "model", STEPS, ".bin")), "cmp differs")
TPZ = f"{W}/tp2_pp2_dp2_z1"
ONE_HS8_2 = f"{W}/hs8_one_d2"
r = pp_run("--tp 2 --pp 2 --zero 1 on 8 ranks (2 data-parallel ranks) --check-replicas", 8,
           HS8 + ["--tp", "2", "--pp", "2", "--zero", "1", "--check-replicas"] + batch(2), TPZ)
if r and s.expect_ok("one process, the 4-head fixture, 2 x 4 micro-steps", BASE + HS8 + batch(2) + ["-o", ONE_HS8_2]):
    losses_close("--tp 2 --pp 2 --zero 1 (8 ranks) vs one process", ONE_HS8_2, TPZ)
    models_close("--tp 2 --pp 2 --zero 1 (8 ranks) vs one process", ONE_HS8_2, TPZ)
    s.check("--tp 2 --pp 2 --zero 1: the whole model the same on all 8 ranks every step",
            re.search(rf"^replicas: parameters identical on 8 ranks after step {STEPS} ", r.out, re.M), r.out[-300:])
    stage_memory("--tp 2 --pp 2 --zero 1", TPZ, 2)
TPZ3 = f"{W}/tp2_pp2_dp2_z3"
if pp_run("--tp 2 --pp 2 --zero 3 on 8 ranks", 8, HS8 + ["--tp", "2", "--pp", "2", "--zero", "3"] + batch(2), TPZ3) and os.path.isdir(ONE_HS8_2):
    losses_close("--tp 2 --pp 2 --zero 3 (8 ranks) vs one process", ONE_HS8_2, TPZ3)
    models_close("--tp 2 --pp 2 --zero 3 (8 ranks) vs one process", ONE_HS8_2, TPZ3)
    stage_memory("--tp 2 --pp 2 --zero 3", TPZ3, 2)
# --sp too: each tensor rank's stage passes its B*T/2 rows of the residual stream (and of its gradient) to its
# place in the next stage: one step bitwise (but wte) --tp 2 --sp's, ten steps against one process, memory = plan
SP1, SPP1, SPP = f"{W}/tp2_sp_step", f"{W}/tp2_sp_pp2_step", f"{W}/tp2_sp_pp2"
if pp_run("--tp 2 --sp (2 ranks), one step, --grad-clip 0", 2, HS8 + ["--tp", "2", "--sp"] + batch() + ONE_STEP, SP1) and \
        pp_run("--tp 2 --sp --pp 2 (4 ranks), one step, --grad-clip 0", 4, HS8 + ["--tp", "2", "--sp", "--pp", "2"] + batch() + ONE_STEP, SPP1):
    one_step_bitwise("--tp 2 --sp --pp 2 against --tp 2 --sp", SP1, SPP1)
if pp_run("--tp 2 --sp --pp 2 (4 ranks)", 4, HS8 + ["--tp", "2", "--sp", "--pp", "2"] + batch(), SPP) and os.path.isdir(ONE_HS8):
    losses_close("--tp 2 --sp --pp 2 vs one process", ONE_HS8, SPP)
    models_close("--tp 2 --sp --pp 2 vs one process", ONE_HS8, SPP)
    rec = stage_memory("--tp 2 --sp --pp 2", SPP, 2)
    tpp = [r["memory_stages"] for r in read_log(TPP) if "memory_stages" in r] if os.path.isdir(TPP) else []
    if rec and tpp:
        a_sp, a_tp = rec[0]["measured"]["activations"], tpp[0][0]["measured"]["activations"]
        s.check(f"--tp 2 --sp --pp 2: stage 0's activations {a_sp} bytes, less than --tp 2 --pp 2's {a_tp} (the residual stream's rows halved)",
                a_sp < a_tp, "not less")
VS_TP = ["-v", "5", "-m", "2", "-j", f"{FIX}/val.bin", "-s", "10", "-g", "8", "-n", "0"]
r1 = s.expect_ok("one process, the 4-head fixture: validation and a sample", BASE + HS8 + batch() + VS_TP + ["-o", f"{W}/vs_hs8_one"])
r2 = pp_run("--tp 2 --pp 2: validation and a sample", 4, HS8 + ["--tp", "2", "--pp", "2"] + batch() + VS_TP, f"{W}/vs_tp2_pp2")
if r1 and r2:
    s.check("--tp 2 --pp 2: the validation losses and the sample are one process's",
            len(val_and_sample(r1.out)) >= 3 and val_and_sample(r1.out) == val_and_sample(r2.out),
            f"{val_and_sample(r1.out)} vs {val_and_sample(r2.out)}")
# --sp: a sample's forward of 1..T tokens padded to the group's multiple, its rows passed between the stages
r3 = pp_run("--tp 2 --sp --pp 2: validation and a sample", 4, HS8 + ["--tp", "2", "--sp", "--pp", "2"] + batch() + VS_TP, f"{W}/vs_tp2_sp_pp2")
if r1 and r3:
    s.check("--tp 2 --sp --pp 2: the validation losses and the sample are one process's",
            len(val_and_sample(r1.out)) >= 3 and val_and_sample(r1.out) == val_and_sample(r3.out),
            f"{val_and_sample(r1.out)} vs {val_and_sample(r3.out)}")

# ----------------------------------------------------------------------------
# 5. files: a resume is bitwise; the model file opens in one process

if os.path.isfile(ckpt(P3, "DONE", 5)):
    R = copy_checkpoint(P3, f"{W}/adamw_pp3_resume", 5)
    if pp_run("adamw: --pp 3 resumes from step 5", 3, ["--pp", "3", "-y", "1"] + batch(), R):
        s.check(f"adamw: --pp 3 resumed: the model at step {STEPS} bitwise the straight run's",
                same_bytes(ckpt(P3, "model", STEPS, ".bin"), ckpt(R, "model", STEPS, ".bin")), "cmp differs")
        for rank in range(3):
            s.check(f"adamw: --pp 3 resumed: stage {rank}'s state at step {STEPS} the straight run's (but the run identity)",
                    same_state(ckpt(P3, "state", STEPS, f"_{rank:05d}.bin"), ckpt(R, "state", STEPS, f"_{rank:05d}.bin")), "differs")
    O = f"{W}/from_pp3_model"
    r = s.expect_ok("one process starts from the --pp 3 run's model file (the whole model)",
                    BASE + ["-e", ckpt(P3, "model", STEPS, ".bin"), "-x", "1"] + batch() + ["-o", O])
    if r:
        s.check("... llm.c's header of the whole model: L=5 C=32 NH=2", "L=5 C=32 NH=2" in r.out, r.out[:400])
else:
    s.fail("adamw: --pp 3 checkpoints", f"no checkpoint 5 in {P3}")

# ----------------------------------------------------------------------------
# 6. a rank killed mid-run (SIGKILL, the middle stage of 3 while it trains): mpirun ends the others
# within KILL_BOUND_S, and the resume from the last complete checkpoint ends bitwise where the run never
# stopped does. -e tiny (GPT-2's vocabulary: steps of some milliseconds, so that the kill lands mid-run)

KILL = [TRAIN, "-e", "tiny", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16", "-d", str(BT * 2), "-x", "60",
        "-u", "2", "-v", "0", "-s", "0", "-n", "10", "--pp", "2"]
STRAIGHT, KILLED = f"{W}/kill_straight", f"{W}/kill_resumed"
if s.expect_ok("--pp 2, -e tiny, 60 steps", MPIRUN + ["2"] + KILL + ["-o", STRAIGHT]):
    log = os.path.join(s.logs, "killed.stdout")
    with open(log, "w") as out:
        p = subprocess.Popen(MPIRUN + ["2"] + KILL + ["-o", KILLED], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    victim, t_kill = None, None
    try:
        for _ in range(600):  # up to 60 s for step 15
            with open(log, errors="replace") as f:
                if re.search(r"^step +1[5-9]/", f.read(), re.M) or p.poll() is not None:
                    break
            time.sleep(0.1)
        for pid in os.listdir("/proc"):  # rank 1: its environment says so
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if KILLED.encode() in cmd and b"OMPI_COMM_WORLD_RANK=1" in env and os.path.basename(cmd[0]) == b"train_gpt":
                victim = int(pid)
        if victim is not None and p.poll() is None:
            os.kill(victim, signal.SIGKILL)
            t_kill = time.monotonic()
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            e2e.kill_group(p)
            rc = None
        waited = time.monotonic() - t_kill if t_kill else None
    finally:
        e2e.kill_group(p)
    if t_kill is None:
        s.fail("--pp 2: rank 1 killed mid-run", f"rank 1 not found or the run ended first (victim {victim})")
    else:
        s.check(f"--pp 2: rank 1 killed mid-run: the run ends within {KILL_BOUND_S} s ({waited:.1f} s), not 0",
                rc not in (None, 0) and waited <= KILL_BOUND_S, f"exit code {rc} after {waited:.1f} s")
        done = e2e.latest_done(KILLED)
        r = s.expect_ok(f"--pp 2: the resume from the last complete checkpoint ({done})", MPIRUN + ["2"] + KILL + ["-o", KILLED, "-y", "1"])
        if r:
            s.check("--pp 2: resumed after the kill: the model at step 60 bitwise the straight run's",
                    same_bytes(ckpt(STRAIGHT, "model", 60, ".bin"), ckpt(KILLED, "model", 60, ".bin")), "cmp differs")

s.finish()
