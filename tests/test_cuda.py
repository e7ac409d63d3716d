"""test_cuda.py: the CUDA trainer (train_gpt.cu) end to end, against the CPU trainer, on the tiny
fixture model (L=2 C=32 NH=2 V=64: a cheap classifier, so the emulated device runs it in seconds).
On machines without a GPU it runs the emulated build (build/emu/train_gpt: the same source
compiled for dev/cuda_emu); on a GPU pass ./train_gpt_cu instead.
  - fp32: 10 steps from the same weights and data as ./train_gpt: every step's loss within
    LOSS_RTOL, the final weights within MODEL_RTOL (relative L2, test_gpt --compare-models);
  - bf16: the losses within BF16_LOSS_RTOL of the CPU's;
  - the same run twice, and a run resumed from its step-5 checkpoint: bitwise the same model
    and optimizer state;
  - checkpoints move between the backends: the CUDA trainer's step-5 checkpoint, resumed by
    ./train_gpt, ends where ./train_gpt's own run ends (fp32 tolerances), and the other way round;
  - --recompute (sqrt, K, gelu, attn) and --offload 1 (alone and with checkpointing) train to the
    bitwise same model as plain training on a five-layer model, also under the emulator's late
    stream order (a copy the compute stream does not wait for reads stale memory there);
  - the memory measured after the first step equals the plan, byte for byte;
  - Adafactor (with and without its first moment) and CAME: the same checks (10 steps against the
    CPU, the same run twice, resume, checkpoints across the backends, --recompute, plan = measured,
    bf16); Adafactor's relative step: the 10 steps against the CPU;
  - --sample: the CPU's greedy tokens (a model allocated for forward only), in fp32 and bf16;
  - ZeRO-1 with Adafactor (with and without its first moment) and CAME on 2 emulated ranks: --zero 1
    equals --zero 0 bit for bit, within DP_RTOL of 1 rank, half the optimizer state per rank, the
    sharded checkpoint resumed by the CPU trainer on 2 ranks within MODEL_RTOL of the GPU's own end;
    CAME also on 3 ranks (uneven parts) and resumed bitwise by the GPU; Adafactor under the late
    stream order;
  - NCCL never hangs: 2 ranks started with WORLD_SIZE 2 and 3 (either way round) both stop with an
    error within LLMC_DIST_TIMEOUT; a rank stuck in a collective (the emulator's CUDA_EMU_NCCL_STALL
    stops it with SIGSTOP) makes the other stop, under mpirun and without MPI.

    python3 tests/test_cuda.py ./build/emu/train_gpt ./train_gpt ./test_gpt

Tolerances. fp32: the GPU sums in other orders than the CPU (cuBLAS GEMMs, block reductions), so
results agree to rounding: about 1e-6 per step on the losses, growing over 10 AdamW steps; the
weights are held to 1e-4 relative L2 as the issue asks (measured: see the printed distances).
bf16: weights and activations rounded to 8 bits of mantissa: the losses within 2e-2.
Adafactor and CAME run with --eps1 1e-12, as tests/test_zero.py explains: with the papers' 1e-30 the
key biases' gradient (zero but for rounding) is normalised into steps of about lr, so two correct
implementations that add in another order differ there.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import time

import e2e
from e2e import ckpt, same_bytes, same_state, train_rows

CUDA, TRAIN, TESTER = e2e.usage(sys.argv, ["./build/emu/train_gpt", "./train_gpt", "./test_gpt"])
s = e2e.Suite("test_cuda", tester=TESTER, run_limit=300)
FIX, W = s.fix, s.root
STEPS = 10
LOSS_RTOL = 1e-4
MODEL_RTOL = 1e-4
BF16_LOSS_RTOL = 2e-2
DP_RTOL = 1e-6        # N ranks against 1 rank: the same sums in another order (tests/test_zero.py)
HEADER_BYTES = 1024   # the state file's 256-int header

BASE = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
        "-x", str(STEPS), "-u", "2", "-v", "0", "-s", "0", "-n", "5"]
FP32 = ["--precision", "fp32"]
EMULATED = "build/emu/" in CUDA  # the emulated build: no real GPU underneath


def losses(run_dir):
    return [row[1] for row in train_rows(run_dir)]


def close(a, b, rtol):
    return len(a) == len(b) and all(abs(x - y) <= rtol * abs(y) for x, y in zip(a, b))


def worst(a, b):
    return max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=float("inf"))


def models_close(name, a, b, rtol):
    r = s.run([TESTER, "--compare-models", a, b, str(rtol)])
    s.check(name, r.rc == 0, (r.out + r.err).strip()[:300])
    print(f"     {r.out.strip()}")


cpu, gpu = f"{W}/cpu", f"{W}/gpu_fp32"
ran_cpu = s.expect_ok("CPU: 10 steps", [TRAIN] + BASE + ["-o", cpu])
ran_gpu = s.expect_ok("CUDA fp32: 10 steps", [CUDA] + BASE + FP32 + ["-o", gpu])
if ran_gpu:
    s.check_memory("CUDA fp32: measured memory equals the plan", gpu)
    m = re.search(r"GPU memory taken since start-up \(cudaMemGetInfo\): ([0-9.]+) MiB = ([0-9.]+) MiB.*\n"
                  r" *\+ ([0-9.]+) MiB of cuBLAS and allocation rounding", ran_gpu.out)
    # emulated, cudaMemGetInfo counts exactly the blocks allocated, each rounded up to cudaMalloc's 256
    # bytes: under 0.005 MiB in all, so the rest prints as 0.00 (a real GPU adds cuBLAS's own). The two
    # totals themselves may print 0.01 apart when they straddle a rounding boundary
    s.check("CUDA fp32: cudaMemGetInfo's difference is the table's GPU blocks", m is not None and
            (m.group(3) == "0.00" or not EMULATED), m.group(0) if m else "no cudaMemGetInfo line")

mfu = f"{W}/gpu_mfu"
if s.expect_ok("CUDA: --peak-tflops gives an MFU", [CUDA] + BASE + FP32 + ["-x", "2", "--peak-tflops", "0.001", "-o", mfu]):
    rows = [r for r in e2e.read_log(mfu) if "loss" in r]
    s.check("CUDA: log.jsonl has the MFU of every step", len(rows) == 2 and all(0 < r.get("mfu", -1) for r in rows), str(rows))
    # llm.c's count, 6N + 6LTC FLOPs a token (the fixture: N with its padded vocabulary Vp = 128,
    # L=2, C=32, maxT=32; T=16), over --peak-tflops 0.001; the whole square (12LTC) is 3% more
    N = 128 * 32 + 32 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32
    per_token = 6 * N + 6 * 2 * 16 * 32
    s.check("CUDA: the MFU is tokens/s x (6N + 6LTC) / peak (llm.c's count)",
            rows and all(abs(r["mfu"] - r["tokens_per_s"] * per_token / 1e9) <= 0.005 * r["mfu"] + 1e-4 for r in rows), str(rows))
if ran_cpu and ran_gpu:
    lc, lg = losses(cpu), losses(gpu)
    s.check(f"CUDA fp32: the 10 losses within {LOSS_RTOL:g} of the CPU's", close(lg, lc, LOSS_RTOL),
            f"worst relative difference {worst(lg, lc):.3g}: {lg} vs {lc}")
    print(f"     worst relative loss difference {worst(lg, lc):.3g}")
    models_close(f"CUDA fp32: final weights within {MODEL_RTOL:g} of the CPU's", ckpt(gpu, "model", STEPS, ".bin"),
                 ckpt(cpu, "model", STEPS, ".bin"), MODEL_RTOL)

# the same flags twice: bitwise the same files
again = f"{W}/gpu_fp32_again"
if ran_gpu and s.expect_ok("CUDA fp32: the same run again", [CUDA] + BASE + FP32 + ["-o", again]):
    for kind, suffix in (("model", ".bin"), ("state", "_00000.bin")):
        s.check(f"CUDA fp32: the same run twice writes the same {kind} file", same_state(ckpt(gpu, kind, STEPS, suffix),
                ckpt(again, kind, STEPS, suffix)), "files differ")

HALF = STEPS // 2


def resume_half(name, src, resumer, flags):
    """copies SRC's checkpoint of step HALF into a new folder and resumes it there with RESUMER
    to step STEPS; returns the folder, or None if the run failed"""
    d = f"{W}/{name.replace(' ', '_').replace(',', '')}"
    os.makedirs(d)
    for f in glob.glob(f"{src}/*_{HALF:08d}*") + glob.glob(f"{src}/DONE_{HALF:08d}"):
        shutil.copy(f, d)
    r = s.expect_ok(f"{name}: resumes from step {HALF}", [resumer] + BASE + flags + ["-o", d, "-y", "1"])
    if r is None:
        return None
    s.check(f"{name}: starts at step {HALF}", f"at step {HALF}" in r.out, r.out[-300:])
    return d


# resume from step 5: bitwise the same end
if ran_gpu:
    d = resume_half("CUDA fp32 resume", gpu, CUDA, FP32)
    if d:
        for kind, suffix in (("model", ".bin"), ("state", "_00000.bin")):
            s.check(f"CUDA fp32 resume: ends with the same {kind} file", same_bytes(ckpt(gpu, kind, STEPS, suffix),
                    ckpt(d, kind, STEPS, suffix)), "files differ")

# checkpoints move between the backends (the same file formats)
if ran_cpu and ran_gpu:
    for name, src, resumer, flags, want in (("CUDA checkpoint, CPU resume", gpu, TRAIN, [], cpu),
                                            ("CPU checkpoint, CUDA resume", cpu, CUDA, FP32, gpu)):
        d = resume_half(name, src, resumer, flags)
        if d:
            models_close(f"{name}: ends within {MODEL_RTOL:g} of the run that stayed on one backend",
                         ckpt(d, "model", STEPS, ".bin"), ckpt(want, "model", STEPS, ".bin"), MODEL_RTOL)

# bf16, the GPU's default
bf16 = f"{W}/gpu_bf16"
if s.expect_ok("CUDA bf16 (default precision): 10 steps", [CUDA] + BASE + ["-o", bf16]):
    s.check_memory("CUDA bf16: measured memory equals the plan", bf16)
    if ran_cpu:
        lb, lc = losses(bf16), losses(cpu)
        s.check(f"CUDA bf16: the losses within {BF16_LOSS_RTOL:g} of the CPU's fp32", close(lb, lc, BF16_LOSS_RTOL),
                f"worst relative difference {worst(lb, lc):.3g}")
        print(f"     worst relative loss difference {worst(lb, lc):.3g}")

# attention: flash (the GPU's default for these heads of 16 channels) and matmul (the stored
# weights) on both backends, each against the other backend's run of the same kind, and flash
# keeping less memory than matmul
att_runs = {}
for key, prog, flags in (("gpu matmul", CUDA, FP32 + ["--attention", "matmul"]), ("cpu flash", TRAIN, ["--attention", "flash"]),
                         ("gpu bf16 matmul", CUDA, ["--attention", "matmul"])):
    d = f"{W}/{key.replace(' ', '_')}"
    if s.expect_ok(f"{key} attention: 10 steps", [prog] + BASE + flags + ["-o", d]):
        att_runs[key] = d
        s.check_memory(f"{key} attention: measured memory equals the plan", d)
for key, other, want in (("gpu matmul", ran_cpu and cpu, "the CPU's (matmul)"), ("cpu flash", ran_gpu and gpu, "the GPU's fp32 (flash)")):
    if key in att_runs and other:
        la, lo = losses(att_runs[key]), losses(other)
        s.check(f"{key} attention: the 10 losses within {LOSS_RTOL:g} of {want}", close(la, lo, LOSS_RTOL),
                f"worst relative difference {worst(la, lo):.3g}")
        models_close(f"{key} attention: final weights within {MODEL_RTOL:g} of {want}", ckpt(att_runs[key], "model", STEPS, ".bin"),
                     ckpt(other, "model", STEPS, ".bin"), MODEL_RTOL)
if "gpu bf16 matmul" in att_runs and ran_cpu:
    lb, lc = losses(att_runs["gpu bf16 matmul"]), losses(cpu)
    s.check(f"gpu bf16 matmul attention: the losses within {BF16_LOSS_RTOL:g} of the CPU's fp32", close(lb, lc, BF16_LOSS_RTOL),
            f"worst relative difference {worst(lb, lc):.3g}")
if "gpu matmul" in att_runs and ran_gpu:
    flash_acts = e2e.memory_record(gpu)["measured"]["activations"]
    matmul_acts = e2e.memory_record(att_runs["gpu matmul"])["measured"]["activations"]
    s.check("CUDA flash attention keeps less activation memory than matmul (no T x T weights)", flash_acts < matmul_acts,
            f"flash {flash_acts} bytes, matmul {matmul_acts}")
    print(f"     activations: flash {flash_acts} bytes, matmul {matmul_acts}")
HS8 = ["-e", f"{FIX}/model_hs8.bin"] + BASE[2:] + ["-x", "1", "-n", "0"]
s.expect_fail("CUDA --attention flash with heads of 8 channels: refused, naming the head size and --attention matmul",
              "multiple of 16", [CUDA] + HS8 + ["--attention", "flash"])
r = s.expect_fail("CUDA --attention flash, heads of 8: the hint", "hint: --attention matmul", [CUDA] + HS8 + ["--attention", "flash"])
r = s.expect_ok("CUDA, heads of 8 channels and no --attention: matmul attention, the stored weights", [CUDA] + HS8 + ["-o", f"{W}/hs8"])
if r:
    s.check("CUDA, heads of 8: the plan names the attention weights, not flash attention",
            "activations: none" in r.out and "flash" not in r.out.split("memory plan")[1], r.out[-400:])
    s.check("CUDA, heads of 8: the configuration's backend line says matmul attention", "bf16, matmul attention" in r.out, r.out[:1500])
if ran_gpu:
    s.check("CUDA, heads of 16: the configuration's backend line says flash attention", "fp32, flash attention" in ran_gpu.out,
            ran_gpu.out[:1500])
s.expect_fail("--attention with an unknown name: refused, naming both", "choose flash or matmul", [CUDA] + BASE + ["--attention", "sdpa"])
# ZeRO-3 on the GPU: on one rank refused as every stage is (it shards across ranks); --plan prices it
s.expect_fail("CUDA --zero 3 on one rank: refused, saying it shards across ranks", "--zero 3 shards the optimizer state across",
              [CUDA] + BASE + ["--zero", "3"])
r = s.expect_ok("CUDA --plan --zero 3 --plan-ranks 2", [CUDA, "--plan", "-e", "d12", "--zero", "3", "--plan-ranks", "2"])
if r:
    s.check("CUDA --plan --zero 3 --plan-ranks 2: the weights' row is ZeRO-3's shards and working copy",
            re.search(r"^\| parameters .*ZeRO-3: 6E \+ 2\(one-layer model \+ Pl\)", r.out, re.M) is not None, r.out[-1500:])
# ZeRO-2 and 3 on the GPU (and ZeRO-1's per-layer collectives): tests/test_zero_cuda.py

# too little GPU memory: the message names what is needed, what is free, and the flags of --plan's
# search that fit (fp32: 32.71 MiB planned, Adafactor 32.50 MiB; the emulated GPU has 32.6 MiB), or
# that none does (the cuBLASLt workspace alone is 32 MiB)
if EMULATED:
    SMALL = BASE[:BASE.index("-x")] + ["-x", "1", "-v", "0", "-s", "0", "-n", "0", "-o", ""]
    r = s.expect_fail("CUDA: too little GPU memory stops before allocating, naming the need and the free memory",
                      "needs 32.7 MiB of GPU memory (the memory plan's device total) but the GPU has 32.6 MiB free",
                      [CUDA] + SMALL + FP32, env={"CUDA_EMU_MEMORY_BYTES": str(34183987)})
    s.check("CUDA: ... and names the flags that fit it, from --plan's search", r is not None and
            "these flags fit it (the fastest in --plan's search of the memory flags): --optimizer adafactor\n" in r.err,
            r.err[-400:] if r else "")
    r = s.expect_fail("CUDA: when no memory flag fits, the message says so", "no combination of --optimizer, --recompute and --offload fits",
                      [CUDA] + SMALL, env={"CUDA_EMU_MEMORY_BYTES": str(20 << 20)})
    s.check("CUDA: ... and does not suggest the precision it runs in (bf16)", r is not None and "--precision bf16" not in r.err,
            r.err[-400:] if r else "")
else:
    s.skip("CUDA: too little GPU memory (the emulated GPU's size is set; a real one's is not)", "a real GPU")

# activation checkpointing and offload: the same arithmetic, bitwise the same model. On the five-layer
# fixture (two slots cannot hold five blocks, so offload moves blocks both ways, and k=2 makes uneven
# segments), also with the emulator's late stream order, where a missing wait reads stale memory
DEEP = ["-e", f"{FIX}/model_deep.bin"] + BASE[2:] + ["-x", "4", "-n", "0"]
plain = f"{W}/deep_plain"
if s.expect_ok("CUDA fp32, 5 layers: plain", [CUDA] + DEEP + FP32 + ["-o", plain]):
    for policy in ("--recompute sqrt", "--recompute 1", "--recompute gelu,attn", "--offload 1",
                   "--offload 1 --recompute 2", "--offload 1 --recompute 1,gelu,attn"):
        for mode in ("inorder", "late"):
            name = f"CUDA fp32, 5 layers, {policy}, {mode} streams"
            d = f"{W}/deep_{policy.replace(' ', '_').replace(',', '_').replace('-', '')}_{mode}"
            if s.expect_ok(name, [CUDA] + DEEP + FP32 + policy.split() + ["-o", d], env={"CUDA_EMU_STREAMS": mode}):
                s.check(f"{name}: model bitwise equal to plain", same_bytes(ckpt(d, "model", 4, ".bin"), ckpt(plain, "model", 4, ".bin")),
                        "models differ")
                if mode == "inorder":
                    s.check_memory(f"{name}: measured memory equals the plan", d)
                    rows = [r for r in e2e.read_log(d) if "loss" in r]
                    timed = all(r.get("copy_wait_ms", -1) >= 0 for r in rows) if "--offload" in policy else \
                        all("copy_wait_ms" not in r for r in rows)
                    s.check(f"{name}: the log has the copy wait of each step {'(offload)' if '--offload' in policy else '(none: nothing copied)'}",
                            timed and len(rows) == 4, str(rows[:1]))

# data parallel: one process per (emulated) GPU, NCCL among them. 2 ranks with the global batch of
# 1 rank (-d 64: two micro-steps of B*T = 32 on one rank, one on each of two) train the same model to
# rounding (they add the micro-batches' gradients in another order); --zero 1 equals --zero 0 bit
# for bit; each rank keeps half the optimizer state; a sharded checkpoint resumes bitwise; two ranks
# on a machine of one GPU are refused by the trainer, before NCCL
mpirun, why_not = e2e.mpi_launcher(CUDA)
if mpirun is None:
    s.skip("CUDA data parallel (2 ranks, --zero 0 and 1)", why_not)
else:
    DP = DEEP + ["-d", "64", "-n", "2"]
    one = f"{W}/dp_1rank"
    ok1 = s.expect_ok("CUDA data parallel: 1 rank, 2 micro-steps", [CUDA] + DP + FP32 + ["-o", one])
    for zero in ("0", "1"):
        d = f"{W}/dp_2ranks_zero{zero}"
        if not s.expect_ok(f"CUDA data parallel: mpirun -np 2 --zero {zero}", mpirun + ["2", CUDA] + DP + FP32 + ["--zero", zero, "-o", d]):
            continue
        s.check_memory(f"CUDA data parallel --zero {zero}: measured memory equals the plan", d)
        if ok1:
            models_close(f"CUDA data parallel --zero {zero}: 2 ranks within {DP_RTOL:g} of 1 rank",
                         ckpt(d, "model", 4, ".bin"), ckpt(one, "model", 4, ".bin"), DP_RTOL)
    # the last micro-step's backward hands each layer's gradients to NCCL on a stream of their own;
    # under the late stream order a reduction that did not wait for its layer sums stale gradients
    for zero in ("0", "1"):
        d, want = f"{W}/dp_2ranks_zero{zero}_late", f"{W}/dp_2ranks_zero{zero}"
        if s.expect_ok(f"CUDA data parallel --zero {zero}, late streams",
                       mpirun + ["2", "-x", "CUDA_EMU_STREAMS=late", CUDA] + DP + FP32 + ["--zero", zero, "-o", d]):
            s.check(f"CUDA data parallel --zero {zero}, late streams: the same model as in order", os.path.exists(ckpt(want, "model", 4, ".bin"))
                    and same_bytes(ckpt(d, "model", 4, ".bin"), ckpt(want, "model", 4, ".bin")), "models differ")
    z0, z1 = f"{W}/dp_2ranks_zero0", f"{W}/dp_2ranks_zero1"
    if os.path.exists(ckpt(z1, "model", 4, ".bin")) and os.path.exists(ckpt(z0, "model", 4, ".bin")):
        s.check("CUDA data parallel: --zero 1 equals --zero 0 bit for bit", same_bytes(ckpt(z0, "model", 4, ".bin"), ckpt(z1, "model", 4, ".bin")),
                "models differ")
        full, half = (os.path.getsize(ckpt(z, "state", 4, "_00001.bin")) - HEADER_BYTES for z in (z0, z1))
        s.check("CUDA data parallel --zero 1: each rank keeps half the optimizer state", full == 2 * half, f"{half} of {full} bytes")
        # resume the sharded checkpoint of step 2 on 2 ranks: bitwise the same end
        r = f"{W}/dp_resume"
        os.makedirs(r)
        for f in glob.glob(f"{z1}/*_{2:08d}*") + glob.glob(f"{z1}/DONE_{2:08d}"):
            shutil.copy(f, r)
        if s.expect_ok("CUDA data parallel --zero 1: resume from step 2", mpirun + ["2", CUDA] + DP + FP32 + ["--zero", "1", "-o", r, "-y", "1"]):
            for kind, suffix in (("model", ".bin"), ("state", "_00000.bin"), ("state", "_00001.bin")):
                s.check(f"CUDA data parallel --zero 1: resumed run ends with the same {kind}{suffix}",
                        same_bytes(ckpt(z1, kind, 4, suffix), ckpt(r, kind, 4, suffix)), "files differ")
    r = s.run(mpirun + ["2", CUDA] + DP + FP32 + ["-o", ""], env={"CUDA_EMU_DEVICES": "1"})
    s.check("CUDA data parallel: 2 ranks on a machine of 1 GPU stop with the trainer's message",
            r.rc != 0 and "2 ranks run on this machine but it has 1 GPU(s)" in r.err, r.err[-400:])

# Adafactor and CAME: the checks above, for each (cuda/adafactor.cuh, cuda/came.cuh)
FACTORED = {  # name: (flags, all the checks, or only the 10 steps against the CPU)
    "adafactor": (["--optimizer", "adafactor"], True),
    "adafactor beta1": (["--optimizer", "adafactor", "--adafactor-beta1", "0.9"], True),
    "came": (["--optimizer", "came"], True),
    "adafactor relative step": (["--optimizer", "adafactor", "--relative-step", "-c", "0"], False),
}
for opt, (flags, full) in FACTORED.items():
    flags = flags + ["--eps1", "1e-12"]
    tag = opt.replace(" ", "_")
    ocpu, ogpu = f"{W}/cpu_{tag}", f"{W}/gpu_{tag}"
    # --relative-step reads no learning-rate schedule, and refuses BASE's -u (only the 10 steps run it)
    base = BASE[:BASE.index("-u")] + BASE[BASE.index("-u") + 2:] if "--relative-step" in flags else BASE
    ran_c = s.expect_ok(f"CPU {opt}: 10 steps", [TRAIN] + base + flags + ["-o", ocpu])
    ran_g = s.expect_ok(f"CUDA fp32 {opt}: 10 steps", [CUDA] + base + FP32 + flags + ["-o", ogpu])
    if ran_g:
        s.check_memory(f"CUDA fp32 {opt}: measured memory equals the plan", ogpu)
    if ran_c and ran_g:
        lc, lg = losses(ocpu), losses(ogpu)
        s.check(f"CUDA fp32 {opt}: the 10 losses within {LOSS_RTOL:g} of the CPU's", close(lg, lc, LOSS_RTOL),
                f"worst relative difference {worst(lg, lc):.3g}: {lg} vs {lc}")
        print(f"     worst relative loss difference {worst(lg, lc):.3g}")
        models_close(f"CUDA fp32 {opt}: final weights within {MODEL_RTOL:g} of the CPU's",
                     ckpt(ogpu, "model", STEPS, ".bin"), ckpt(ocpu, "model", STEPS, ".bin"), MODEL_RTOL)
    if not full:
        continue
    again = f"{W}/gpu_{tag}_again"
    if ran_g and s.expect_ok(f"CUDA fp32 {opt}: the same run again", [CUDA] + BASE + FP32 + flags + ["-o", again]):
        for kind, suffix in (("model", ".bin"), ("state", "_00000.bin")):
            s.check(f"CUDA fp32 {opt}: the same run twice writes the same {kind} file",
                    same_state(ckpt(ogpu, kind, STEPS, suffix), ckpt(again, kind, STEPS, suffix)), "files differ")
    if ran_g:
        d = resume_half(f"CUDA fp32 {opt} resume", ogpu, CUDA, FP32 + flags)
        if d:
            for kind, suffix in (("model", ".bin"), ("state", "_00000.bin")):
                s.check(f"CUDA fp32 {opt} resume: ends with the same {kind} file",
                        same_bytes(ckpt(ogpu, kind, STEPS, suffix), ckpt(d, kind, STEPS, suffix)), "files differ")
    if ran_c and ran_g:
        for name, src, resumer, rflags, want in ((f"CUDA {opt} checkpoint, CPU resume", ogpu, TRAIN, flags, ocpu),
                                                 (f"CPU {opt} checkpoint, CUDA resume", ocpu, CUDA, FP32 + flags, ogpu)):
            d = resume_half(name, src, resumer, rflags)
            if d:
                models_close(f"{name}: ends within {MODEL_RTOL:g} of the run that stayed on one backend",
                             ckpt(d, "model", STEPS, ".bin"), ckpt(want, "model", STEPS, ".bin"), MODEL_RTOL)
    d = f"{W}/gpu_{tag}_recompute"
    if ran_g and s.expect_ok(f"CUDA fp32 {opt} --recompute 1,gelu,attn",
                             [CUDA] + BASE + FP32 + flags + ["--recompute", "1,gelu,attn", "-o", d]):
        s.check(f"CUDA fp32 {opt} --recompute 1,gelu,attn: model bitwise equal to plain",
                same_bytes(ckpt(d, "model", STEPS, ".bin"), ckpt(ogpu, "model", STEPS, ".bin")), "models differ")
        s.check_memory(f"CUDA fp32 {opt} --recompute 1,gelu,attn: measured memory equals the plan", d)
    d = f"{W}/gpu_{tag}_bf16"
    if s.expect_ok(f"CUDA bf16 {opt}: 10 steps", [CUDA] + BASE + flags + ["-o", d]):
        s.check_memory(f"CUDA bf16 {opt}: measured memory equals the plan", d)
        if ran_c:
            lb, lc = losses(d), losses(ocpu)
            s.check(f"CUDA bf16 {opt}: the losses within {BF16_LOSS_RTOL:g} of the CPU's fp32", close(lb, lc, BF16_LOSS_RTOL),
                    f"worst relative difference {worst(lb, lc):.3g}")
            print(f"     worst relative loss difference {worst(lb, lc):.3g}")

# ZeRO-1 with Adafactor and CAME (cuda/adafactor.cuh): each rank updates its block of every slice's
# rows and keeps its block of the column statistics, the statistics over a whole slice added across
# the ranks by NCCL inside the update. --zero 1 adds those sums per rank, then across (in double), where
# --zero 0 adds them over the whole slice: they can differ only where two double sums round to
# different floats, which these runs never meet, so the check is bit for bit (as the CPU's
# tests/test_zero.py finds on the CPU). The GPU's sharded state files are the CPU's layout: the CPU
# trainer resumes them on 2 ranks and ends within MODEL_RTOL of the GPU (the two backends' sums
# differ in order, as in the checks above)
if mpirun is None:
    s.skip("CUDA data parallel with Adafactor and CAME (--zero 1)", why_not)
else:
    cpu_mpirun, cpu_why_not = e2e.mpi_launcher(TRAIN)
    ZERO_FACTORED = {"adafactor": ["--optimizer", "adafactor"],
                     "adafactor beta1": ["--optimizer", "adafactor", "--adafactor-beta1", "0.9"],
                     "came": ["--optimizer", "came"]}

    def dp_run(name, ranks, flags, out, env_late=False):
        """mpirun -np RANKS of the CUDA trainer on the data-parallel flags; ranks 1: no mpirun"""
        late = ["-x", "CUDA_EMU_STREAMS=late"] if env_late else []
        cmd = ([CUDA] if ranks == 1 else mpirun + [str(ranks)] + late + [CUDA]) + flags + ["-o", out]
        return s.expect_ok(name, cmd)

    def state_bytes(d, rank):
        return os.path.getsize(ckpt(d, "state", 4, f"_{rank:05d}.bin")) - HEADER_BYTES

    def copy_step(src, step, dst):
        os.makedirs(dst)
        for f in glob.glob(f"{src}/*_{step:08d}*") + glob.glob(f"{src}/DONE_{step:08d}"):
            shutil.copy(f, dst)

    for opt, oflags in ZERO_FACTORED.items():
        flags = DP + FP32 + oflags + ["--eps1", "1e-12"]
        tag = opt.replace(" ", "_")
        one, z0, z1 = f"{W}/dpf_{tag}_1rank", f"{W}/dpf_{tag}_zero0", f"{W}/dpf_{tag}_zero1"
        ok1 = dp_run(f"CUDA {opt}: 1 rank, 2 micro-steps", 1, flags, one)
        ok0 = dp_run(f"CUDA {opt}: mpirun -np 2 --zero 0", 2, flags + ["--zero", "0"], z0)
        if not dp_run(f"CUDA {opt}: mpirun -np 2 --zero 1", 2, flags + ["--zero", "1"], z1):
            continue
        s.check_memory(f"CUDA {opt} --zero 1: measured memory equals the plan", z1)
        if ok0:
            s.check(f"CUDA {opt}: --zero 1 equals --zero 0 bit for bit",
                    same_bytes(ckpt(z0, "model", 4, ".bin"), ckpt(z1, "model", 4, ".bin")), "models differ")
            full, half = state_bytes(z0, 0), state_bytes(z1, 0)
            s.check(f"CUDA {opt} --zero 1: each rank keeps half the optimizer state",
                    full == 2 * half and state_bytes(z1, 1) == half, f"{half} of {full} bytes")
        if ok1:
            models_close(f"CUDA {opt} --zero 1: 2 ranks within {DP_RTOL:g} of 1 rank",
                         ckpt(z1, "model", 4, ".bin"), ckpt(one, "model", 4, ".bin"), DP_RTOL)
        # the GPU's sharded checkpoint of step 2, resumed by the CPU trainer on 2 ranks
        if cpu_mpirun is None:
            s.skip(f"CUDA {opt} --zero 1 checkpoint, CPU resume", cpu_why_not)
            continue
        r = f"{W}/dpf_{tag}_cpu_resume"
        copy_step(z1, 2, r)
        ran = s.expect_ok(f"CUDA {opt} --zero 1 checkpoint: mpirun -np 2 ./train_gpt --zero 1 resumes it",
                          cpu_mpirun + ["2", TRAIN] + flags + ["--zero", "1", "-o", r, "-y", "1"])
        if ran:
            s.check(f"CUDA {opt} --zero 1 checkpoint, CPU resume: starts at step 2", "at step 2" in ran.out, ran.out[-300:])
            models_close(f"CUDA {opt} --zero 1 checkpoint, CPU resume: ends within {MODEL_RTOL:g} of the GPU's run",
                         ckpt(r, "model", 4, ".bin"), ckpt(z1, "model", 4, ".bin"), MODEL_RTOL)

    # CAME on 3 ranks: every slice's rows (32, 96, 128 of them) and columns cut unevenly; one micro-step
    # each (-d 96), against 1 rank's three
    flags = DEEP + ["-d", "96", "-n", "2"] + FP32 + ZERO_FACTORED["came"] + ["--eps1", "1e-12"]
    one, z0, z1 = f"{W}/dpf3_came_1rank", f"{W}/dpf3_came_zero0", f"{W}/dpf3_came_zero1"
    ok1 = dp_run("CUDA came: 1 rank, 3 micro-steps", 1, flags, one)
    ok0 = dp_run("CUDA came: mpirun -np 3 --zero 0", 3, flags + ["--zero", "0"], z0)
    if dp_run("CUDA came: mpirun -np 3 --zero 1", 3, flags + ["--zero", "1"], z1):
        if ok0:
            s.check("CUDA came, 3 ranks: --zero 1 equals --zero 0 bit for bit",
                    same_bytes(ckpt(z0, "model", 4, ".bin"), ckpt(z1, "model", 4, ".bin")), "models differ")
            full, parts = state_bytes(z0, 0), [state_bytes(z1, r) for r in range(3)]
            s.check("CUDA came --zero 1, 3 ranks: each rank keeps about a third of the optimizer state (parts padded to "
                    "ceil(units / 3))", len(set(parts)) == 1 and full <= 3 * parts[0] <= 1.05 * full,
                    f"{parts} of {full} bytes")
        if ok1:
            models_close(f"CUDA came --zero 1: 3 ranks within {DP_RTOL:g} of 1 rank",
                         ckpt(z1, "model", 4, ".bin"), ckpt(one, "model", 4, ".bin"), DP_RTOL)
        r = f"{W}/dpf3_came_resume"
        copy_step(z1, 2, r)
        if s.expect_ok("CUDA came --zero 1, 3 ranks: resume from step 2",
                       mpirun + ["3", CUDA] + flags + ["--zero", "1", "-o", r, "-y", "1"]):
            for kind, suffix in [("model", ".bin")] + [("state", f"_{k:05d}.bin") for k in range(3)]:
                s.check(f"CUDA came --zero 1, 3 ranks: resumed run ends with the same {kind}{suffix}",
                        same_bytes(ckpt(z1, kind, 4, suffix), ckpt(r, kind, 4, suffix)), "files differ")

    # the statistics' collectives run on the model's stream: under the late stream order an update that
    # did not wait for them (or a collective that did not wait for its sums) reads stale memory
    flags = DP + FP32 + ZERO_FACTORED["adafactor"] + ["--eps1", "1e-12", "--zero", "1"]
    late, want = f"{W}/dpf_adafactor_zero1_late", f"{W}/dpf_adafactor_zero1"
    if dp_run("CUDA adafactor --zero 1, late streams", 2, flags, late, env_late=True):
        s.check("CUDA adafactor --zero 1, late streams: the same model as in order", os.path.exists(ckpt(want, "model", 4, ".bin"))
                and same_bytes(ckpt(late, "model", 4, ".bin"), ckpt(want, "model", 4, ".bin")), "models differ")

# NCCL never hangs (cuda/nccl.cuh): ranks started with different WORLD_SIZE (2 and 3, by hand, NCCL's
# id through --dist-init file:), and a rank stuck in a collective (the emulator's CUDA_EMU_NCCL_STALL
# stops it with SIGSTOP: alive but silent) under mpirun and without MPI: the others end in an error
# within LLMC_DIST_TIMEOUT, never a hang. Emulated only: the stall is the emulator's, and the ranks
# take a GPU each
HANG_TIMEOUT_S = 5
HANG_SLACK_S = 30   # start-up of the emulated trainer on a busy machine, and the watchdog's look every 0.2 s
HANG_ENV = {"LLMC_DIST_TIMEOUT": str(HANG_TIMEOUT_S), "LLMC_DIST_SECRET": "0123456789abcdef0123456789abcdef"}
HANG = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16", "-n", "0"] + FP32
STALL = "CUDA_EMU_NCCL_STALL=1:12"   # rank 1 stops at its 12th collective, a few steps in


def hand_launch(name, worlds, flags, extra_env, must_end):
    """starts one process per entry of WORLDS (its WORLD_SIZE; rank = index) without MPI; the ranks in
    MUST_END must end by themselves within HANG_TIMEOUT_S + HANG_SLACK_S; returns their (rc, stderr)
    and ends the others (a stopped rank too)"""
    meet = f"{W}/meet_{name}"
    os.makedirs(meet)
    procs = []
    for r, world in enumerate(worlds):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), **HANG_ENV, **extra_env)
        # one -o for every rank, as a run has (the ranks' settings are compared, -o among them)
        procs.append(subprocess.Popen([CUDA] + flags + ["--dist-init", f"file:{meet}", "-o", f"{W}/hang_{name}"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True))
    deadline = time.monotonic() + HANG_TIMEOUT_S + HANG_SLACK_S
    ended = {}
    for r in must_end:
        try:
            ended[r] = (procs[r].wait(timeout=max(0.1, deadline - time.monotonic())), None)
        except subprocess.TimeoutExpired:
            ended[r] = (None, None)
    for p in procs:
        e2e.kill_group(p)
    for r in must_end:
        ended[r] = (ended[r][0], procs[r].communicate()[1])
    return ended


def check_ended(name, ended, phrases):
    for r, (rc, err) in sorted(ended.items()):
        s.check(f"{name}: rank {r} ends by itself within LLMC_DIST_TIMEOUT ({HANG_TIMEOUT_S} s) + {HANG_SLACK_S} s, "
                f"with an error and a hint", rc is not None and rc > 0 and "error:" in err and "hint:" in err and
                any(p in err for p in phrases), f"exit {rc}: {(err or '')[-500:]}")


if not EMULATED:
    s.skip("NCCL never hangs (mismatched WORLD_SIZE, a stuck rank)", "the emulated build's CUDA_EMU_NCCL_STALL")
else:
    for worlds in ((2, 3), (3, 2)):
        name = f"WORLD_SIZE {worlds[0]} and {worlds[1]}"
        # whichever stops them: the rendezvous (rank 0 of 3 waits for a rank 2), or NCCL's communicator
        check_ended(name, hand_launch(f"ws{worlds[0]}{worlds[1]}", worlds, HANG + ["-x", "2"], {}, (0, 1)),
                    ["no answer from the other ranks", "waited", "WORLD_SIZE", "world size"])
    stuck = ["another rank stopped or stalled", "a rank died or stopped"]
    check_ended("a rank stuck in a collective (SIGSTOP), without MPI",
                hand_launch("stall", (2, 2), HANG + ["-x", "50"], {"CUDA_EMU_NCCL_STALL": STALL.split("=")[1]}, (0,)), stuck)
    if mpirun is None:
        s.skip("a rank stuck in a collective, under mpirun", why_not)
    else:
        env = ["-x", f"LLMC_DIST_TIMEOUT={HANG_TIMEOUT_S}", "-x", STALL]
        r = s.expect_fail("a rank stuck in a collective (SIGSTOP), under mpirun: rank 0 stops after LLMC_DIST_TIMEOUT",
                          "another rank stopped or stalled", mpirun + ["2"] + env + [CUDA] + HANG + ["-x", "50", "-o", f"{W}/hang_mpi"])
        waited = re.search(r"rank 0: waited (\d+) s", r.err)
        s.check("a rank stuck under mpirun: rank 0 waited LLMC_DIST_TIMEOUT, not much longer",
                waited is not None and HANG_TIMEOUT_S <= int(waited.group(1)) <= HANG_TIMEOUT_S + 1, r.err[-400:])

# --sample: a model allocated for sampling (forward only) draws the CPU's greedy tokens, on
# e2e.copy_model (whose choices depend on the window) past the window; in bf16 too, since each of
# its choices leads the next token by 0.2 or more in probability, far more than bf16's rounding
BPE, why = e2e.bpe_dir()
COPY = e2e.copy_model(s, TRAIN) if BPE else None
if COPY is None:
    s.skip("CUDA --sample", why or "the copy model did not train")
else:
    SAMPLE = ["-e", COPY, "-k", "", "--bpe", BPE, "--sample", "A1B2C3", "-t", str(e2e.COPY_PERIOD), "-g", "20", "--temperature", "0"]
    rc = s.expect_ok("CPU --sample: greedy, 20 tokens", [TRAIN] + SAMPLE)
    rg = s.expect_ok("CUDA fp32 --sample: greedy, 20 tokens", [CUDA] + SAMPLE + FP32)
    if rc and rg:
        s.check("CUDA fp32 --sample: the CPU's greedy tokens", len(e2e.sample_ids(rc)) == 26 and e2e.sample_ids(rg) == e2e.sample_ids(rc),
                f"{e2e.sample_ids(rg)} vs {e2e.sample_ids(rc)}")
    rb = s.expect_ok("CUDA bf16 --sample: greedy, 20 tokens", [CUDA] + SAMPLE)
    if rc and rb:
        s.check("CUDA bf16 --sample: the CPU's greedy tokens", len(e2e.sample_ids(rb)) == 26 and e2e.sample_ids(rb) == e2e.sample_ids(rc),
                f"{e2e.sample_ids(rb)} vs {e2e.sample_ids(rc)}")
s.finish()
