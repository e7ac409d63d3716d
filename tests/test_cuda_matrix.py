"""test_cuda_matrix.py: every memory flag of the CUDA trainer, and their combinations, on the
emulated device (or a real GPU), against plain CUDA training:
  - each optimizer (adamw, adafactor, adafactor + beta1, came) with each activation policy and
    offload (--recompute 1, gelu,attn, --offload activations, optimizer, optimizer,gradients, and
    them together) trains to the bitwise same model as the same optimizer without it, on 1 rank
    and on 2 ranks with --zero 0 and 1, and the memory measured after the first step equals the plan
    (flash attention, the GPU's default; and a few with --attention matmul, the stored weights);
  - --offload optimizer (ZeRO-Offload: the master weights and optimizer state in host memory, the
    update on the CPU; with ",gradients" each micro-step's gradients too) also under the
    emulator's late stream order, where a missing wait reads stale data; in bf16; with gradient
    accumulation (bitwise; with ",gradients" the host adds the micro-batches' gradients where the
    GPU adds them inside its kernels: within 1e-6); resumed bitwise; its checkpoint resumed by the
    CPU trainer; planned for a large model.

    python3 tests/test_cuda_matrix.py ./build/emu/train_gpt ./train_gpt ./test_gpt

The five-layer fixture: two slots cannot hold five blocks (activation offload moves blocks both
ways), segments of 2 are uneven, and --offload optimizer's two gradient buffers take turns.
Adafactor and CAME run with --eps1 1e-12 (tests/test_cuda.py says why). Prints "ok   name" or
"FAIL name: detail" per check and, last, "N passed, N failed" (", N skipped" without mpirun).
"""

import glob
import os
import re
import shutil
import sys

import e2e
from e2e import ckpt, same_bytes

CUDA, TRAIN, TESTER = e2e.usage(sys.argv, ["./build/emu/train_gpt", "./train_gpt", "./test_gpt"])
s = e2e.Suite("test_cuda_matrix", tester=TESTER, run_limit=120)
FIX, W = s.fix, s.root
STEPS = 4
ACCUM_RTOL = 1e-6  # the bound for fp32 runs whose sums are taken in another order

# 4 steps; one micro-batch of B*T = 32 a rank (-d 32 on one rank, -d 64 on two), so every
# gradient is summed as in plain training
BASE = ["-e", f"{FIX}/model_deep.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
        "-x", str(STEPS), "-u", "1", "-v", "0", "-s", "0", "-n", "2", "--precision", "fp32"]
OPTIMIZERS = ["adamw", "adafactor", "adafactor --adafactor-beta1 0.9", "came"]
EPS1 = ["--eps1", "1e-12"]  # Adafactor's and CAME's (AdamW refuses a flag it does not read)


def optimizer_flags(opt):
    """--optimizer OPT, and --eps1 for the factored ones"""
    return ["--optimizer", *opt.split()] + ([] if opt == "adamw" else EPS1)
POLICIES = ["--recompute 1", "--recompute gelu,attn", "--offload activations", "--offload optimizer",
            "--offload optimizer,gradients", "--recompute 2,gelu,attn --offload activations,optimizer,gradients"]
RANK_POLICIES = ["--offload activations", "--offload optimizer", "--offload optimizer,gradients",
                 "--recompute 2,gelu,attn --offload activations,optimizer"]

mpirun, why_not = e2e.mpi_launcher(CUDA)
LAUNCHES = [("1 rank", [], ["-d", "32"], POLICIES)]  # name, launcher, flags, policies
for zero in ("0", "1"):
    if mpirun:
        LAUNCHES.append((f"2 ranks --zero {zero}", mpirun + ["2"], ["-d", "64", "--zero", zero], RANK_POLICIES))
    else:
        s.skip(f"2 ranks --zero {zero}: {len(OPTIMIZERS)} optimizers x {len(RANK_POLICIES) + 1} runs", why_not)


def train(name, run_dir, launcher, flags, env=None):
    """trains into RUN_DIR with the launcher and flags; checks the run and its memory record"""
    if not s.expect_ok(name, launcher + [CUDA] + BASE + flags + ["-o", run_dir], env=env):
        return False
    s.check_memory(f"{name}: measured memory equals the plan", run_dir)
    return True


def slug(text):
    return re.sub(r"[ ,-]+", "_", text)


def same_model(name, a, b, step=STEPS):
    s.check(f"{name}: model bitwise equal to the run without it",
            same_bytes(ckpt(a, "model", step, ".bin"), ckpt(b, "model", step, ".bin")), "cmp differs")


def models_close(name, a, b, rtol):
    r = s.run([TESTER, "--compare-models", a, b, str(rtol)])
    s.check(name, r.rc == 0, (r.out + r.err).strip()[:300])
    print(f"     {r.out.strip()}")


refs = {}
for lname, launcher, flags, policies in LAUNCHES:
    for opt in OPTIMIZERS:
        ref = f"{W}/ref_{slug(lname)}_{slug(opt)}"
        if not train(f"{lname}, {opt}", ref, launcher, [*optimizer_flags(opt), *flags]):
            continue
        refs[(lname, opt)] = ref
        for pol in policies:
            d = f"{W}/run_{slug(lname)}_{slug(opt)}_{slug(pol)}"
            if train(f"{lname}, {opt}, {pol}", d, launcher, [*optimizer_flags(opt), *flags, *pol.split()]):
                same_model(f"{lname}, {opt}, {pol}", ref, d)

# the stored-weights attention (--attention matmul; the runs above take the GPU's default, flash
# attention): its selective recompute, checkpointing and offload are bitwise the same model too
MATMUL = ["--attention", "matmul", "-d", "32"]
if train("--attention matmul", f"{W}/matmul_plain", [], MATMUL):
    for pol in ("--recompute attn", "--recompute 2,gelu,attn", "--recompute 2,attn --offload activations",
                "--offload activations,optimizer"):
        d = f"{W}/matmul_{slug(pol)}"
        if train(f"--attention matmul {pol}", d, [], MATMUL + pol.split()):
            same_model(f"--attention matmul {pol}", f"{W}/matmul_plain", d)

# the late stream order: gradients copied before their layer's backward ran, or a staging buffer
# refilled before its upload ran, give another model
plain = refs.get(("1 rank", "adamw"))
for pol in ("--offload optimizer", "--offload optimizer,gradients", "--recompute 2 --offload activations,optimizer,gradients"):
    d = f"{W}/late_{slug(pol)}"
    if plain and train(f"late streams, {pol}", d, [], ["-d", "32", *pol.split()], env={"CUDA_EMU_STREAMS": "late"}):
        same_model(f"late streams, {pol}", plain, d)

# bf16: the working weights rounded on the CPU as the GPU rounds them (to nearest-even)
for opt, what in (("adamw", "optimizer"), ("came", "optimizer,gradients")):
    ref, d = f"{W}/bf16_{opt}", f"{W}/bf16_{opt}_offload"
    bf16 = ["--precision", "bf16", *optimizer_flags(opt), "-d", "32"]
    if train(f"bf16 {opt}", ref, [], bf16) and train(f"bf16 {opt}, --offload {what}", d, [], bf16 + ["--offload", what]):
        same_model(f"bf16 {opt}, --offload {what}", ref, d)

# gradient accumulation, two micro-batches a step: summed on the GPU as in plain training
# (bitwise), or with ",gradients" on the host (within 1e-6)
for opt in ("adamw", "came"):
    ref = f"{W}/accum_{opt}"
    acc = [*optimizer_flags(opt), "-d", "64"]
    if not train(f"2 micro-steps, {opt}", ref, [], acc):
        continue
    for what in ("optimizer", "optimizer,gradients"):
        d = f"{W}/accum_{opt}_{slug(what)}"
        if not train(f"2 micro-steps, {opt}, --offload {what}", d, [], acc + ["--offload", what]):
            continue
        if what == "optimizer":
            same_model(f"2 micro-steps, {opt}, --offload {what}", ref, d)
        else:
            models_close(f"2 micro-steps, {opt}, --offload {what}: within {ACCUM_RTOL:g} of plain",
                         ckpt(d, "model", STEPS, ".bin"), ckpt(ref, "model", STEPS, ".bin"), ACCUM_RTOL)

# resume from step 2 (the state file is the host's master weights and state): bitwise the same
# end; the checkpoint also resumes on the CPU trainer, where the same run ends within 1e-6
src = f"{W}/run_1_rank_adafactor_offload_optimizer"
for name, trainer, flags in (("--offload optimizer resume", CUDA, ["--offload", "optimizer"]), ("--offload optimizer checkpoint, CPU resume", TRAIN, [])):
    if not os.path.exists(ckpt(src, "model", 2, ".bin")):
        break
    d = f"{W}/{slug(name)}"
    os.makedirs(d)
    for f in glob.glob(f"{src}/*_{2:08d}*") + glob.glob(f"{src}/DONE_{2:08d}"):
        shutil.copy(f, d)
    cmd = [trainer] + BASE + optimizer_flags("adafactor") + ["-d", "32", "-y", "1", "-o", d] + flags
    if s.expect_ok(f"{name}: from step 2", cmd):
        if trainer == CUDA:
            for kind, suffix in (("model", ".bin"), ("state", "_00000.bin")):
                s.check(f"{name}: ends with the same {kind} file", same_bytes(ckpt(src, kind, STEPS, suffix), ckpt(d, kind, STEPS, suffix)),
                        "files differ")
        else:
            models_close(f"{name}: ends within {ACCUM_RTOL:g} of the run on the GPU",
                         ckpt(d, "model", STEPS, ".bin"), ckpt(src, "model", STEPS, ".bin"), ACCUM_RTOL)

# --loss-chunk 12 (B*T = 32: chunks of 12, 12, 8): the classifier and its loss a chunk at a time, their
# gradients in the forward (the fused softmax/loss/dlogits kernel, two GEMMs a chunk); wte's gradient
# is summed chunk by chunk, so within CHUNK_RTOL of the whole head; the other memory flags on top
# change nothing (bitwise); planned = measured in every run (train() checks it)
CHUNK_RTOL = 1e-6
CHUNK = ["--loss-chunk", "12"]
for lname, launcher, flags, policies in LAUNCHES:
    for opt in (OPTIMIZERS if lname == "1 rank" else ["adamw", "came"]):
        ref = refs.get((lname, opt))
        d = f"{W}/chunk_{slug(lname)}_{slug(opt)}"
        if not ref or not train(f"{lname}, {opt}, --loss-chunk 12", d, launcher, [*optimizer_flags(opt), *flags, *CHUNK]):
            continue
        models_close(f"{lname}, {opt}, --loss-chunk 12: within {CHUNK_RTOL:g} of the whole head",
                     ckpt(d, "model", STEPS, ".bin"), ckpt(ref, "model", STEPS, ".bin"), CHUNK_RTOL)
        pol = policies[-1]  # every flag together
        d2 = f"{W}/chunk_{slug(lname)}_{slug(opt)}_{slug(pol)}"
        if train(f"{lname}, {opt}, --loss-chunk 12 {pol}", d2, launcher, [*optimizer_flags(opt), *flags, *CHUNK, *pol.split()]):
            same_model(f"{lname}, {opt}, --loss-chunk 12 {pol}: as --loss-chunk 12 alone", d, d2)
for name, extra in (("--attention matmul", ["--attention", "matmul"]), ("bf16", ["--precision", "bf16"]),
                    ("2 micro-steps, --offload optimizer,gradients", ["-d", "64", "--offload", "optimizer,gradients"])):
    ref, d = f"{W}/chunk_ref_{slug(name)}", f"{W}/chunk_{slug(name)}"
    run = (["-d", "32"] if "-d" not in extra else []) + extra
    if train(f"{name}", ref, [], run) and train(f"{name}, --loss-chunk 12", d, [], run + CHUNK):
        models_close(f"{name}, --loss-chunk 12: within {CHUNK_RTOL if 'bf16' not in name else 1e-2:g} of the whole head",
                     ckpt(d, "model", STEPS, ".bin"), ckpt(ref, "model", STEPS, ".bin"), CHUNK_RTOL if "bf16" not in name else 1e-2)
plain = refs.get(("1 rank", "adamw"))
d = f"{W}/chunk_late"
if plain and train("late streams, --loss-chunk 12 --offload optimizer,gradients", d, [], ["-d", "32", *CHUNK, "--offload", "optimizer,gradients"],
                   env={"CUDA_EMU_STREAMS": "late"}):
    models_close("late streams, --loss-chunk 12 --offload optimizer,gradients: within 1e-6 of the whole head",
                 ckpt(d, "model", STEPS, ".bin"), ckpt(plain, "model", STEPS, ".bin"), CHUNK_RTOL)

# GPT-2 124M (d12) at B=16, T=1024 on the GPU, bf16, flash attention, AdamW: the plan with the
# head whole and with --loss-chunk 4096 (doc/memory.md, "The logits in chunks", beside llm.c's 7.6 GiB)
def d12_plan(extra):
    r = s.run([CUDA, "-e", "d12", "-b", "16", "-t", "1024", "--plan", *extra])
    dev = re.search(r"\| device total +\| +([0-9.]+) MiB", r.out)
    act = re.search(r"\| activations +\| +([0-9.]+) MiB", r.out)
    head = re.search(r"head \(.*\) = ([0-9.]+) MiB", r.out)
    return r, (float(dev.group(1)) if dev else None), (float(act.group(1)) if act else None), (float(head.group(1)) if head else None)


r0, dev0, act0, head0 = d12_plan([])
r1, dev1, act1, head1 = d12_plan(["--loss-chunk", "4096"])
ok = None not in (dev0, dev1, head0, head1)
if ok:
    print(f"     d12 B=16 T=1024 bf16 GPU plan: device total {dev0:.2f} MiB ({dev0 / 1024:.2f} GiB), head {head0:.2f} MiB; "
          f"--loss-chunk 4096: device total {dev1:.2f} MiB ({dev1 / 1024:.2f} GiB), head {head1:.2f} MiB")
s.check("--plan d12 B=16 T=1024: --loss-chunk 4096 holds 4096 of the 16384 tokens' logits (the head a quarter), "
        "the device total below llm.c's 7.6 GiB",
        ok and abs(head1 - head0 / 4) < 0.03 * head0 and abs((dev0 - dev1) - (head0 - head1)) < 0.02 and dev1 < 7.6 * 1024,
        (r0.out + r1.out)[-2500:])

# the plan: GPT-2 XL (d48, P = 1.56e9) at T=1024 with Adafactor; the GPU keeps 2 bytes a weight
# (2975 MiB), two layers' fp32 gradients and the activations; the host 8 bytes a weight (11900
# MiB: master weights and gradients), staging and the state (no allocation: --plan)
r = s.run([CUDA, "-e", "d48", "-b", "1", "-t", "1024", "--optimizer", "adafactor", "--recompute", "sqrt", "--plan",
           "--offload", "optimizer,gradients"])
m = re.search(r"\| device total +\| +([0-9.]+) MiB", r.out)
h = re.search(r"\| optimizer \(host\) +\| +([0-9.]+) MiB", r.out)
s.check("--plan --offload optimizer, d48: the GPU keeps about 2 bytes a weight, the host 8 and the state",
        r.rc == 0 and m and h and 2975 < float(m.group(1)) < 5000 and 11900 < float(h.group(1)) < 13000, r.out[-1500:] + r.err)

# misuse: a clear message
s.expect_fail("CPU: --offload optimizer is refused", "the CPU backend's weights, gradients and optimizer state are host memory already",
              [TRAIN, "-e", f"{FIX}/model.bin", "-t", "16", "--offload", "optimizer", "--plan"])
s.expect_fail("--offload gradients without the optimizer", "gradients go to the host only with the optimizer",
              [CUDA, "-e", f"{FIX}/model.bin", "-t", "16", "--offload", "gradients", "--plan"])
s.expect_fail("--offload with an unknown word", "'weights' is not something that moves to host memory",
              [CUDA, "-e", f"{FIX}/model.bin", "-t", "16", "--offload", "optimizer,weights", "--plan"])
s.finish()
