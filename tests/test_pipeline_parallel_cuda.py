"""test_pipeline_parallel_cuda.py: pipeline parallelism (--pp N, --pp-schedule; doc/pipeline_parallel.md) on
the CUDA trainer, over the emulated device and NCCL (or a real GPU box): N ranks that each hold a stage of
contiguous layers pass the activations and their gradients to their neighbours as ncclSend/ncclRecv on a
stream of their own (cuda/pipeline.cuh), and train what one process that accumulates the same
micro-batches trains:
  - AdamW, Adafactor and CAME on 2, 3 and 4 stages: one step with --grad-clip 0 bitwise the emulated
    trainer's own one process in every tensor but wte (within WTE_RTOL: its two stages' gradients are
    added as two sums, pp_sum_pair_cuda), six steps to rounding (LOSS_RTOL, MODEL_RTOL); GPipe bitwise
    1F1B; and one process's losses against the CPU trainer's --pp 2 (CPU_RTOL);
  - the memory flags: recompute and activation offload on --pp 3, bitwise plain --pp 3; --offload
    optimizer bitwise plain --pp 2, and ",gradients" and flash attention with --loss-chunk one step
    bitwise (but wte) one process with the same flags;
  - inside data parallelism: --pp 2 on 4 ranks with --zero 0, 1 and 2, one step bitwise (but wte) the
    2-rank run of the same --zero without --pp, ZeRO-1 bitwise ZeRO-0, --zero 1 --offload optimizer
    bitwise --zero 1, the replicas (wte's two copies among them) checked every step;
  - --tp 2 inside each stage (4 ranks): one step bitwise (but wte) the --tp 2 run's;
  - bf16: one step bitwise (but wte) one process's bf16;
  - the stream order: the memory flags, GPipe on 4 stages and --zero 2 on 4 ranks again under the
    emulator's late-nccl order (queued work, collectives and messages among it, runs only when the host
    waits: a compute stream that does not wait for a receive, or writes a buffer a send still reads,
    computes on stale bits there), bitwise the in-order runs;
  - every stage's measured memory equals its plan in every run (log.jsonl's memory_stages);
  - validation losses and a sample through the stages are one process's; a resume from step 3 is
    bitwise; the CPU trainer resumes the CUDA --pp checkpoint;
  - refused before any work, naming the fix: GPipe with --loss-chunk (the GPU keeps one d(final
    LayerNorm output) buffer), --zero 3 without --offload optimizer (the CPU trainer's --pp takes it),
    and the trainer's shared refusals (--pp on one process) reach the CUDA trainer;
  - --zero 2 and 3 with --offload optimizer (each rank's master shard on its host, the checkpoints'
    weights through the stages' stream a slice at a time): bitwise --zero 2, and a bitwise resume;
  - --tp 2 --sp --pp 2: each tensor rank's stage passes its rows, one step bitwise (but wte) --tp 2
    --sp's, validation and a sample --tp 2 --sp's (late-nccl order).

    python3 tests/test_pipeline_parallel_cuda.py ./build/emu/train_gpt ./train_gpt ./test_gpt

The runs are test_gpt's deep fixture (L=5 C=32 NH=2 V=64: five layers, for 2, 3 and 4 stages; model_hs8,
4 heads, for --tp 2), B*T = 32 tokens a micro-batch, m = 4 micro-batches a step, fp32 unless said.

Tolerances. A stage computes what one process computes for its layers, in the same order, and the
messages carry the bits one process passes from a layer to the next: so after one step every weight
but wte is bitwise. wte's gradient has two parts, the classifier's (last stage) and the embedding's
(first stage), which one process adds micro-batch by micro-batch and the pipeline as two sums: within
WTE_RTOL (measured 6e-9 to 4e-8). From the second step that rounding is in the weights: losses agree to
LOSS_RTOL, weights to MODEL_RTOL (test_gpt --compare-models, which leaves out the key biases: their
gradient is zero but for rounding, tests/test_tensor_parallel.py says why). Data parallelism adds its
ranks' sums in its own order: the reference of a --pp run on 4 ranks is the 2-rank run without --pp.
Prints "ok   name" or "FAIL name: detail" per check and, last, "N passed, N failed" (", N skipped"
without mpirun). About a minute on 2 cores.

Planted breaks, each of which failed it: the compute stream not waiting for a receive (7 checks, the
late-nccl runs only: in order the message has run before the compute stream reads it), no wait for the
sends before a held set's buffers are written again (GPipe on 4 stages under late-nccl), wte's pair not
summed (39: --check-replicas' wte copies, then every comparison), and the gradient norm counting wte on
both stages (20: the clipped steps).
"""

import os
import re
import shutil
import sys

import e2e
from e2e import ckpt, copy_checkpoint, read_log, same_bytes, same_state, train_rows, model_differences

CUDA, TRAIN, TESTER = e2e.usage(sys.argv, ["./build/emu/train_gpt", "./train_gpt", "./test_gpt"])
s = e2e.Suite("test_pipeline_parallel_cuda", tester=TESTER, run_limit=300)
FIX, W = s.fix, s.root
STEPS = 6
M = 4                     # micro-batches a step
BT = 32                   # B*T: the tokens of a micro-batch
LOSS_RTOL = 2e-6          # log.jsonl prints 6 decimals: 1e-6 absolute is 2.4e-7 of a loss of 4.16
MODEL_RTOL = "1e-5"       # as test_gpt --compare-models reads it
CPU_RTOL = "1e-4"         # tests/test_cuda.py's tolerance of the two backends
WTE_RTOL = 1e-6           # wte after one step, relative L2
LATE = ["CUDA_EMU_STREAMS=late-nccl"]

FLAGS = ["-e", f"{FIX}/model_deep.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-x", str(STEPS), "-u", "2", "-v", "0", "-s", "0", "-n", "3"]
FP32 = ["--precision", "fp32"]
ONE_STEP = ["-x", "1", "-n", "1", "--grad-clip", "0"]
EPS1 = ["--eps1", "1e-12"]
OPTIMIZERS = {"adamw": ["adamw"], "adafactor": ["adafactor"] + EPS1, "came": ["came"] + EPS1}
HS8 = ["-e", f"{FIX}/model_hs8.bin"]

def batch(data_ranks=1, m=M):
    """-d of m micro-batches on each of data_ranks data-parallel ranks"""
    return ["-d", str(BT * m * data_ranks)]


def one_step_bitwise(name, ref, pp):
    """after one step with --grad-clip 0: every tensor but wte bitwise, wte within WTE_RTOL"""
    try:
        differ, r = model_differences(ref, pp, 1)
    except OSError as e:
        return s.fail(f"{name}: the models after one step", repr(e))
    s.check(f"{name}: after one step every tensor but wte bitwise, wte within {WTE_RTOL} ({r:.1e})", not differ and r <= WTE_RTOL,
            f"differ: {differ}; wte {r:.3e}")


def losses_close(name, a, b, rtol=LOSS_RTOL):
    la, lb = [row[1] for row in train_rows(a)], [row[1] for row in train_rows(b)]
    if len(la) != len(lb) or not la:
        return s.fail(f"{name}: losses agree", f"steps logged: {len(la)} and {len(lb)}")
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    return s.check(f"{name}: losses of the {len(la)} steps agree (worst {worst:.2e} relative)", worst <= rtol, f"worst {worst:.2e} > {rtol}")


def models_close(name, a, b, rtol=MODEL_RTOL):
    r = s.run([TESTER, "--compare-models", ckpt(a, "model", STEPS, ".bin"), ckpt(b, "model", STEPS, ".bin"), rtol])
    detail = r.out.strip()
    return s.check(f"{name}: final weights agree to {rtol} ({detail.removeprefix('models: ')})", r.rc == 0,
                   f"exit code {r.rc}: {detail} {r.err[:300]}")


def same_model(name, a, b, step=STEPS):
    s.check(f"{name}: the model at step {step} bit for bit", same_bytes(ckpt(a, "model", step, ".bin"), ckpt(b, "model", step, ".bin")),
            "the model files differ")


def stage_memory(name, run_dir, stages):
    """log.jsonl's memory_stages record: every stage's measured bytes equal its plan"""
    recs = [r["memory_stages"] for r in read_log(run_dir) if "memory_stages" in r]
    if len(recs) != 1 or len(recs[0]) != stages:
        return s.fail(f"{name}: every stage's memory recorded", f"{len(recs)} records in {run_dir}/log.jsonl")
    bad = [f"stage {i} {k}: planned {st['planned'][k]} measured {st['measured'][k]}"
           for i, st in enumerate(recs[0]) for k in st["planned"] if st["planned"][k] != st["measured"][k]]
    return s.check(f"{name}: each of the {stages} stages' measured memory = its plan", not bad, "; ".join(bad))


def val_and_sample(out):
    """the validation lines ("step N | val loss x") and each sample's text, as printed"""
    lines = out.splitlines()
    vals = [x for x in lines if "| val loss " in x]
    return vals + [lines[i + 1] for i, x in enumerate(lines) if x.startswith("---- sample") and i + 1 < len(lines)]


def one(name, out, flags, trainer=None):
    """one process of the trainer (the CUDA one unless given); its memory checked against the plan"""
    r = s.expect_ok(name, [trainer or CUDA] + FLAGS + flags + ["-o", out])
    if r:
        s.check_memory(f"{name}: measured memory equals the plan", out)
    return r


MPIRUN, why_not = e2e.mpi_launcher(CUDA)


def ranks(name, n, out, flags, trainer=None, env=()):
    """mpirun -np N of the trainer (the CUDA one unless given) on FLAGS, the emulator's variables ENV; with
    --pp in FLAGS every stage's memory checked against its plan"""
    extra = []
    for v in env:
        extra += ["-x", v]
    r = s.expect_ok(name, MPIRUN + [str(n)] + extra + [trainer or CUDA] + FLAGS + flags + ["-o", out])
    if r and "--pp" in flags:
        stage_memory(name, out, int(flags[flags.index("--pp") + 1]))
    return r


# ----------------------------------------------------------------------------
# 1. refused before any work, naming the fix (the trainer's shared checks, and the CUDA backend's own)

s.expect_fail("--pp 2 on one process", "--pp 2: 1 rank(s) do not split into 2 stages", [CUDA] + FLAGS + ["--pp", "2", "-o", ""])
# the GPU's own refusals (gpt2_pp_refusal) reach --plan too: its search leaves them out
s.expect_fail("--plan --pp 2 --zero 3 (the GPU's refusal, in the plan)", "hint: --zero 2 with --pp",
              [CUDA, "--plan", "-e", "d12", "--pp", "2", "--zero", "3", "--plan-ranks", "4"])
r = s.expect_ok("--plan --max-memory on 8 ranks (the search over --pp, --zero, --pp-schedule, --loss-chunk)",
                [CUDA, "--plan", "-e", "d12", "--max-memory", "20", "--plan-ranks", "8"])
if r:
    s.check("... its search leaves out the GPU's --pp refusals (GPipe with --loss-chunk, --zero 3), naming them",
            "--pp-schedule gpipe with --loss-chunk" in r.out and "--zero 3: the GPU's weight shards" in r.out, r.out[-1500:])

if MPIRUN is None:
    s.skip("the CUDA trainer's --pp on 2, 3 and 4 ranks", why_not)
    s.finish()

s.expect_fail("--pp 2 --pp-schedule gpipe with --loss-chunk (one d(final LayerNorm output) buffer on the GPU)",
              "hint: --pp-schedule 1f1b", MPIRUN + ["2", CUDA] + FLAGS + ["--pp", "2", "--pp-schedule", "gpipe", "--loss-chunk", "8", "-o", ""])
s.expect_fail("--pp 2 --zero 3 (the GPU's weight shards reach checkpoints a slice at a time; the CPU trainer's do through the stages)",
              "hint: --zero 2 with --pp", MPIRUN + ["4", CUDA] + FLAGS + batch(2) + ["--pp", "2", "--zero", "3", "-o", ""])

# ----------------------------------------------------------------------------
# 2. each optimizer on 2, 3 and 4 stages: one step bitwise (but wte), six steps to rounding; GPipe
# bitwise 1F1B; the CPU trainer's --pp 2 close

for name, opt in OPTIMIZERS.items():
    ref, ref1 = f"{W}/{name}_one", f"{W}/{name}_one_step"
    if not (one(f"{name}: one process, {M} micro-steps", ref, FP32 + ["--optimizer", *opt] + batch())
            and one(f"{name}: one process, one step, --grad-clip 0", ref1, FP32 + ["--optimizer", *opt] + batch() + ONE_STEP)):
        continue
    for N in (2, 3, 4):
        p1, pp = f"{W}/{name}_pp{N}_step", f"{W}/{name}_pp{N}"
        if ranks(f"{name}: --pp {N}, one step", N, p1, FP32 + ["--optimizer", *opt, "--pp", str(N)] + batch() + ONE_STEP):
            one_step_bitwise(f"{name}: --pp {N} against one process", ref1, p1)
        if ranks(f"{name}: --pp {N}", N, pp, FP32 + ["--optimizer", *opt, "--pp", str(N)] + batch()):
            losses_close(f"{name}: --pp {N} against one process", ref, pp)
            models_close(f"{name}: --pp {N} against one process", ref, pp)
for N in (2, 4):
    g, p = f"{W}/adamw_pp{N}_gpipe", f"{W}/adamw_pp{N}"
    if ranks(f"adamw: --pp {N} --pp-schedule gpipe", N, g, FP32 + ["--pp", str(N), "--pp-schedule", "gpipe"] + batch()):
        same_model(f"adamw: --pp {N}: GPipe against 1F1B (the same sums in the same order)", g, p)
CPU2 = f"{W}/cpu_pp2"
if ranks("the CPU trainer's --pp 2", 2, CPU2, ["--pp", "2"] + batch(), trainer=TRAIN):
    losses_close("--pp 2: the CUDA trainer against the CPU trainer's", f"{W}/adamw_pp2", CPU2, float(CPU_RTOL))
    models_close("--pp 2: the CUDA trainer against the CPU trainer's", f"{W}/adamw_pp2", CPU2, CPU_RTOL)

# ----------------------------------------------------------------------------
# 3. the memory flags, in the late-nccl stream order where they add copies or streams

P2, P3 = f"{W}/adamw_pp2", f"{W}/adamw_pp3"
for label, flags in (("--recompute 1,gelu,attn --offload 1", ["--recompute", "1,gelu,attn", "--offload", "1"]),
                     ("--recompute 2 --offload 1", ["--recompute", "2", "--offload", "1"])):
    out = f"{W}/pp3_{re.sub(r'[^a-z0-9]+', '_', label)}"
    if ranks(f"adamw: --pp 3 {label}, late-nccl streams", 3, out, FP32 + ["--pp", "3"] + flags + batch(), env=LATE):
        same_model(f"adamw: --pp 3 {label} (late-nccl) against plain --pp 3", out, P3)
OO = f"{W}/pp2_offload_opt"
if ranks("adamw: --pp 2 --offload optimizer, late-nccl streams", 2, OO, FP32 + ["--pp", "2", "--offload", "optimizer"] + batch(), env=LATE):
    same_model("adamw: --pp 2 --offload optimizer (late-nccl) against plain --pp 2", OO, P2)
for label, flags, n in (("--offload optimizer,gradients", ["--offload", "optimizer,gradients"], 2),
                        ("flash attention, --loss-chunk 8", ["--attention", "flash", "--loss-chunk", "8"], 3)):
    tag = re.sub(r"[^a-z0-9]+", "_", label)
    ref1, p1 = f"{W}/{tag}_one_step", f"{W}/{tag}_pp{n}_step"
    if one(f"{label}: one process, one step", ref1, FP32 + flags + batch() + ONE_STEP) and \
            ranks(f"{label}: --pp {n}, one step, late-nccl streams", n, p1, FP32 + flags + ["--pp", str(n)] + batch() + ONE_STEP, env=LATE):
        one_step_bitwise(f"{label}: --pp {n} against one process", ref1, p1)
G4 = f"{W}/adamw_pp4_gpipe_late"
if ranks("adamw: --pp 4 --pp-schedule gpipe, late-nccl streams", 4, G4, FP32 + ["--pp", "4", "--pp-schedule", "gpipe"] + batch(), env=LATE):
    same_model("adamw: --pp 4 GPipe (late-nccl) against in order", G4, f"{W}/adamw_pp4_gpipe")

# ----------------------------------------------------------------------------
# 4. inside data parallelism: --pp 2 on 4 ranks against the 2-rank run of the same --zero; --tp 2 inside
# each stage against --tp 2

for zero in ("0", "1", "2"):
    ref1, p1, out = f"{W}/dp2_z{zero}_step", f"{W}/pp2_dp2_z{zero}_step", f"{W}/pp2_dp2_z{zero}"
    if ranks(f"adamw: 2 data-parallel ranks, --zero {zero}, one step", 2, ref1, FP32 + ["--zero", zero] + batch(2) + ONE_STEP) and \
            ranks(f"adamw: --pp 2 x 2 data-parallel ranks, --zero {zero}, one step", 4, p1, FP32 + ["--pp", "2", "--zero", zero] + batch(2) + ONE_STEP):
        one_step_bitwise(f"adamw: --pp 2 x 2 data-parallel ranks, --zero {zero}, against 2 ranks without --pp", ref1, p1)
    r = ranks(f"adamw: --pp 2 x 2 data-parallel ranks, --zero {zero} --check-replicas" + (", late-nccl streams" if zero == "2" else ""), 4, out,
              FP32 + ["--pp", "2", "--zero", zero, "--check-replicas"] + batch(2), env=LATE if zero == "2" else ())
    if r:
        s.check(f"adamw: --pp 2 --zero {zero}: the whole model (wte's two copies too) the same on all 4 ranks every step",
                re.search(rf"^replicas: parameters identical on 4 ranks after step {STEPS} ", r.out, re.M), r.out[-300:])
same_model("adamw: --pp 2 x 2 data-parallel ranks: --zero 1 against --zero 0", f"{W}/pp2_dp2_z1", f"{W}/pp2_dp2_z0")
Z1OO = f"{W}/pp2_dp2_z1_offload_opt"
if ranks("adamw: --pp 2 x 2, --zero 1 --offload optimizer", 4, Z1OO, FP32 + ["--pp", "2", "--zero", "1", "--offload", "optimizer"] + batch(2)):
    same_model("adamw: --pp 2 x 2: --zero 1 --offload optimizer against --zero 1", Z1OO, f"{W}/pp2_dp2_z1")
# ZeRO-2 and 3 with --offload optimizer: each rank's master shard on its host, the checkpoints' weights a slice
# at a time from the data group's hosts through the stages' stream (cpu/pipeline.h's Zero3Runs): --zero 2's
# model bitwise, and a resume from step 3 (the stages' blocks read from the model file) bitwise the straight run
for zero in ("2", "3"):
    oo = f"{W}/pp2_dp2_z{zero}_offload_opt"
    if ranks(f"adamw: --pp 2 x 2, --zero {zero} --offload optimizer", 4, oo, FP32 + ["--pp", "2", "--zero", zero, "--offload", "optimizer"] + batch(2)):
        same_model(f"adamw: --pp 2 x 2: --zero {zero} --offload optimizer against --zero 2", oo, f"{W}/pp2_dp2_z2")
        if zero == "2" and os.path.isfile(ckpt(oo, "DONE", 3)):
            R = copy_checkpoint(oo, f"{W}/pp2_dp2_z2_offload_opt_resume", 3)
            if ranks("adamw: --pp 2 x 2, --zero 2 --offload optimizer resumes from step 3", 4, R,
                     FP32 + ["--pp", "2", "--zero", "2", "--offload", "optimizer", "-y", "1"] + batch(2)):
                same_model("adamw: --pp 2 x 2, --zero 2 --offload optimizer resumed from step 3 against the straight run", R, oo)
TP1, TPP1 = f"{W}/tp2_step", f"{W}/tp2_pp2_step"
if ranks("--tp 2 (2 ranks), one step", 2, TP1, FP32 + HS8 + ["--tp", "2"] + batch() + ONE_STEP) and \
        ranks("--tp 2 --pp 2 (4 ranks), one step", 4, TPP1, FP32 + HS8 + ["--tp", "2", "--pp", "2"] + batch() + ONE_STEP):
    one_step_bitwise("--tp 2 --pp 2 against --tp 2", TP1, TPP1)
# --sp: each tensor rank's stage passes its B*T/2 rows (pp_message_elems); a sample's forward padded first
SP1, SPP1 = f"{W}/tp2_sp_step", f"{W}/tp2_sp_pp2_step"
VS1 = ["-v", "1", "-m", "2", "-j", f"{FIX}/val.bin", "-s", "1", "-g", "8"]
r1 = ranks("--tp 2 --sp (2 ranks), one step, validation and a sample", 2, SP1, FP32 + HS8 + ["--tp", "2", "--sp"] + batch() + ONE_STEP + VS1)
r2 = ranks("--tp 2 --sp --pp 2 (4 ranks), one step, validation and a sample, late-nccl streams", 4, SPP1,
           FP32 + HS8 + ["--tp", "2", "--sp", "--pp", "2"] + batch() + ONE_STEP + VS1, env=LATE)
if r1 and r2:
    one_step_bitwise("--tp 2 --sp --pp 2 against --tp 2 --sp", SP1, SPP1)
    s.check("--tp 2 --sp --pp 2: the validation losses and the sample are --tp 2 --sp's", val_and_sample(r1.out) == val_and_sample(r2.out),
            f"{val_and_sample(r1.out)} vs {val_and_sample(r2.out)}")

# bf16 (the GPU's default): the messages carry the activations' bf16 bits
B1, BP = f"{W}/bf16_one_step", f"{W}/bf16_pp3_step"
if one("bf16: one process, one step", B1, batch() + ONE_STEP) and ranks("bf16: --pp 3, one step", 3, BP, ["--pp", "3"] + batch() + ONE_STEP):
    one_step_bitwise("bf16: --pp 3 against one process", B1, BP)

# ----------------------------------------------------------------------------
# 5. validation and a sample through the stages (the last stage's loss and probabilities, on every rank)


VS = ["-v", "3", "-m", "2", "-j", f"{FIX}/val.bin", "-s", str(STEPS), "-g", "8"]
r1 = one("one process: validation and a sample", f"{W}/vs_one", FP32 + batch() + VS)
r2 = ranks("--pp 3: validation and a sample", 3, f"{W}/vs_pp3", FP32 + ["--pp", "3"] + batch() + VS)
if r1 and r2:
    s.check("--pp 3: the validation losses and the sample are one process's",
            len(val_and_sample(r1.out)) >= 3 and val_and_sample(r1.out) == val_and_sample(r2.out),
            f"{val_and_sample(r1.out)} vs {val_and_sample(r2.out)}")

# ----------------------------------------------------------------------------
# 6. files: a resume is bitwise; the CPU trainer resumes the CUDA --pp checkpoint

if os.path.isfile(ckpt(P3, "DONE", 3)):
    R, X = f"{W}/pp3_resume", f"{W}/pp3_resume_cpu"
    os.makedirs(R)
    for f in [ckpt(P3, "model", 3, ".bin"), ckpt(P3, "DONE", 3)] + [ckpt(P3, "state", 3, f"_{k:05d}.bin") for k in range(3)]:
        shutil.copy(f, R)
    shutil.copytree(R, X)
    if ranks("adamw: --pp 3 resumes from step 3", 3, R, FP32 + ["--pp", "3", "-y", "1"] + batch()):
        same_model("adamw: --pp 3 resumed from step 3 against the straight run", R, P3)
        for rank in range(3):
            s.check(f"adamw: --pp 3 resumed: stage {rank}'s state at step {STEPS} the straight run's (but the run identity)",
                    same_state(ckpt(P3, "state", STEPS, f"_{rank:05d}.bin"), ckpt(R, "state", STEPS, f"_{rank:05d}.bin")), "differs")
    if ranks("the CPU trainer resumes the CUDA --pp 3 checkpoint of step 3", 3, X, ["--pp", "3", "-y", "1"] + batch(), trainer=TRAIN):
        models_close("the CPU trainer's resume of the CUDA --pp 3 checkpoint against the CUDA run", X, P3, CPU_RTOL)
else:
    s.fail("adamw: --pp 3 checkpoints", f"no checkpoint 3 in {P3}")

s.finish()
