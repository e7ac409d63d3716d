"""test_zero_cuda.py: ZeRO on the CUDA trainer, over the emulated NCCL (or a real GPU box): --zero 1,
2 and 3 exchange gradients and weights one collective per group of slices (cuda/zero.cuh: a
layer's 12 slices, or a round of the outer slices wte, wpe, lnfw, lnfb), packed rank by rank.
  - 2 ranks, one micro-step a rank, every optimizer: --zero 1 and --zero 2 train to the model of
    --zero 0 bit for bit (the sums are the same additions, a + b), their state files hold the same
    floats, the memory measured after the first step equals the plan, and step 1's collectives are
    counted: one reduce-scatter per group and micro-step (ZeRO-1: the last micro-step only), one
    all-gather per group, where the old exchange made one call per slice and rank, W x (4 + 12L);
  - ZeRO-2 keeps at most 1/N of the reduced gradients (plus the blocks' padding), printed;
  - 3 ranks (uneven blocks, padding) with CAME; 2 micro-steps a rank (ZeRO-2 adds each micro-step's
    sums to its shard, --zero 0 each rank's micro-steps first); the memory flags (recompute,
    activation offload, the chunked loss, both attentions, bf16) under the emulator's late stream
    order, where a stream that does not wait for the other reads stale memory;
  - a model whose outer blocks are larger than a layer's: they go in two rounds;
  - the CPU trainer's --zero 2 agrees with the GPU's; checkpoints resume across --zero 1 and 2 and
    across the backends;
  - --zero 3 (the weights sharded too, gathered layer by layer into two buffers, the next layer
    prefetched on the comm stream): bit for bit against --zero 2 (the same additions) with every
    optimizer, on 3 ranks, with accumulation and the memory flags under the late stream order and the
    other emulated orders, and against --zero 0 where --zero 2 is; the weight shard at most 1/N,
    the gathers a step bounded per layer; its checkpoints resume with --zero 1 and 2 and on the CPU;
  - --zero 2 and 3 started without MPI (torchrun-style variables, scripts/launch_local.sh; the emulated
    build without MPI, when given): the model of mpirun's --zero 0, bit for bit;
  - --offload optimizer under --zero 2 and 3 (each rank offloads its shard: the master weights, the
    gradients and the state of its blocks in host memory, the step on the CPU): bit for bit the same
    stage without it, every optimizer, 3 ranks, accumulation with the memory flags in the late stream
    order, bf16, without MPI; its checkpoints resume without it and on the CPU; ",gradients" with them
    is refused, saying why; --plan prices ZeRO-1's pack, ZeRO-2's buffers and the offloaded shard.

    python3 tests/test_zero_cuda.py ./build/emu/train_gpt ./train_gpt ./test_gpt [./build/emu_nompi/train_gpt]

Tolerances: where the additions are the same the check is bit for bit. The emulated NCCL adds the
ranks in rank order in every collective, so 3 ranks are exact here too; a real NCCL ring may add
three in another order: those checks are within RTOL (1e-6), and say so. Gradient accumulation
under ZeRO-2 adds in another order than --zero 0: RTOL. CPU against GPU: MODEL_RTOL (1e-4, as
tests/test_cuda.py). Prints "ok   name" or "FAIL name: detail" per check and, last, "N passed,
N failed" (", N skipped" without mpirun).
"""

import glob
import os
import re
import shutil
import sys

import e2e
from e2e import ckpt, same_bytes

CUDA, TRAIN, TESTER, NOMPI = e2e.usage(sys.argv, ["./build/emu/train_gpt", "./train_gpt", "./test_gpt", "./build/emu_nompi/train_gpt"],
                                       optional=1)
s = e2e.Suite("test_zero_cuda", tester=TESTER, run_limit=300)
FIX, W = s.fix, s.root
STEPS = 4
RTOL = 1e-6
MODEL_RTOL = 1e-4
LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "launch_local.sh")
HEADER_BYTES = 1024  # a state file's 256-int header (the run identity, the stage): the floats follow

DEEP = dict(L=5, C=32, V=64, maxT=32)  # test_gpt's model_deep.bin
FLAGS = ["-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16", "-x", str(STEPS), "-u", "1", "-v", "0",
         "-s", "0", "-n", "2", "--precision", "fp32"]
EPS1 = ["--eps1", "1e-12"]  # Adafactor's and CAME's (tests/test_zero.py says why)
OPTIMIZERS = {"adamw": ["--optimizer", "adamw"], "adafactor": ["--optimizer", "adafactor"] + EPS1,
              "adafactor+beta1": ["--optimizer", "adafactor", "--adafactor-beta1", "0.9"] + EPS1,
              "came": ["--optimizer", "came"] + EPS1}

ZERO_LINE = re.compile(r"^ZeRO-(\d): step 1: (\d+) gradient reduce-scatters, (\d+) weight all-gathers \(L = (\d+), (\d+) outer rounds\); "
                       r"gradients per rank: (\d+) of (\d+) floats, pack (\d+)$", re.M)
ZERO3_LINE = re.compile(r"^ZeRO-3: weights per rank: shard (\d+) of (\d+) floats \(.*\), working copy (\d+)$", re.M)


# a model whose outer blocks (wte's V rows) outweigh a layer's, so that its outer slices go in several rounds
# through the pack
VOCAB = dict(L=2, C=32, V=500, maxT=32)
e2e.write_model(f"{FIX}/model_vocab.bin", L=VOCAB["L"], C=VOCAB["C"], NH=2, V=VOCAB["V"], Vp=512, maxT=VOCAB["maxT"], seed=5)


def ceil_div(a, b):
    return (a + b - 1) // b


def outer_rounds(m, n):
    """the outer slices' rounds through the pack (cuda/zero.cuh): a rank's outer blocks over a rank's blocks
    of one layer, each slice's block ceil(units / n) rows (a vector: elements)"""
    C = m["C"]
    outer = ceil_div(m["V"], n) * C + ceil_div(m["maxT"], n) * C + 2 * ceil_div(C, n)
    layer = (ceil_div(3 * C, n) * C + ceil_div(C, n) * C + ceil_div(4 * C, n) * C + ceil_div(C, n) * 4 * C
             + 6 * ceil_div(C, n) + ceil_div(3 * C, n) + ceil_div(4 * C, n))
    return ceil_div(outer, layer)


def zero_counts(name, r, zero, ranks, micro, m, recomputed=0):
    """step 1's line: a reduce-scatter per group and (ZeRO-2, 3) micro-step, an all-gather per group, the
    groups L layers and the outer slices' rounds; ZeRO-2's shard at most 1/N of the gradients and padding.
    ZeRO-3: no all-gather after the update, but the head's rounds once a step and each layer before its
    forward and its backward (and each recompute: RECOMPUTED layers a backward), every micro-step, at
    most, and at least once each; its weight shard at most 1/N of the weights and padding"""
    found = ZERO_LINE.search(r.out) if r else None
    if not found:
        return s.fail(f"{name}: the ZeRO line", "no 'ZeRO-N: step 1:' line")
    z, rs, ag, L, rounds, grads, P, pack = map(int, found.groups())
    groups = L + rounds
    want_rs = groups * (micro if zero >= 2 else 1)
    old = ranks * (4 + 12 * L) * 2  # a reduce and a broadcast per (slice, rank) before
    if zero == 3:
        most = rounds + micro * (2 * L + recomputed)
        s.check(f"{name}: step 1: {rs} reduce-scatters = {want_rs}; {ag} weight all-gathers within [{groups}, {most}] (the head's "
                f"{rounds} round(s) once, each of the L = {L} layers at least once and at most before each forward, recompute and "
                f"backward of {micro} micro-step(s))",
                z == zero and L == m["L"] and rounds == outer_rounds(m, ranks) and rs == want_rs and groups <= ag <= most, found.group(0))
        w = ZERO3_LINE.search(r.out)
        if not w:
            return s.fail(f"{name}: the ZeRO-3 weights line", "no 'ZeRO-3: weights per rank' line")
        shard, wP, working = map(int, w.groups())
        gone = 1 - shard / wP
        s.check(f"{name}: the weights kept: a shard of {shard} of {wP} floats ({gone:.1%} gone, >= (N-1)/N less the padding; "
                f"besides a working copy of {working}: the head and two layer buffers)",
                wP == P and shard * ranks <= P * 1.02 and gone >= (ranks - 1) / ranks - 0.02, w.group(0))
    else:
        s.check(f"{name}: step 1: {rs} reduce-scatters, {ag} all-gathers = {want_rs} and {groups} (L = {L} layers + {rounds} head "
                f"round(s); the per-block exchange made {old} calls)",
                z == zero and L == m["L"] and rounds == outer_rounds(m, ranks) and rs == want_rs and ag == groups, found.group(0))
    if zero >= 2:
        gone = 1 - grads / P
        s.check(f"{name}: the reduced gradients kept: {grads} of {P} floats ({gone:.1%} gone, >= (N-1)/N less the padding; "
                f"besides a one-layer working buffer and the pack of {pack})",
                grads * ranks <= P * 1.02 and gone >= (ranks - 1) / ranks - 0.02, "more than 1/N")


def models_close(name, a, b, rtol):
    r = s.run([TESTER, "--compare-models", a, b, str(rtol)])
    s.check(name, r.rc == 0, (r.out + r.err).strip()[:300])
    print(f"     {r.out.strip()}")


def same_model(name, a, b, step=STEPS):
    s.check(f"{name}: bit for bit", same_bytes(ckpt(a, "model", step, ".bin"), ckpt(b, "model", step, ".bin")), "models differ")


def same_state_floats(name, a, b, ranks, step=STEPS):
    """every rank's state file holds the same floats (the headers differ: the run identity, the stage)"""
    def floats(d, k):
        with open(ckpt(d, "state", step, f"_{k:05d}.bin"), "rb") as f:
            return f.read()[HEADER_BYTES:]
    try:
        ok = all(floats(a, k) == floats(b, k) for k in range(ranks))
    except OSError as e:
        return s.fail(name, repr(e))
    s.check(name, ok, "state floats differ")


def copy_step(src, step, dst):
    os.makedirs(dst)
    for f in glob.glob(f"{src}/*_{step:08d}*") + glob.glob(f"{src}/DONE_{step:08d}"):
        shutil.copy(f, dst)


mpirun, why_not = e2e.mpi_launcher(CUDA)


def run(name, ranks, out, flags, model="model_deep.bin", late=False, trainer=None, emu_env=()):
    """mpirun -np RANKS of the trainer (the CUDA one unless given) on FLAGS; checks planned = measured.
    late: the emulator's late stream order; emu_env: more of its variables ("CUDA_EMU_THREAD_ORDER=shuffle")"""
    env = ["-x", "CUDA_EMU_STREAMS=late"] if late else []
    for v in emu_env:
        env += ["-x", v]
    r = s.expect_ok(name, mpirun + [str(ranks)] + env + [trainer or CUDA, "-e", f"{FIX}/{model}"] + FLAGS + flags + ["-o", out])
    if r:
        s.check_memory(f"{name}: measured memory equals the plan", out)
    run_of[out] = r
    return r


run_of = {}  # each run's result by its folder


def run_nompi(name, tag, flags, env=None):
    """2 processes of the emulated build without MPI, started by scripts/launch_local.sh (torchrun-style
    variables, NCCL's id through a folder), one micro-step a rank, with FLAGS (and ENV); the run's folder,
    or None if it failed"""
    meet, out = f"{W}/meet_{tag}", f"{W}/nompi_{tag}"
    os.makedirs(meet)
    r = s.expect_ok(name, ["bash", LAUNCH, "2", NOMPI, "--dist-init", f"file:{meet}", "-e", f"{FIX}/model_deep.bin"] + FLAGS
                    + ["-d", "64"] + flags + ["-o", out], env={"CUDA_EMU_DEVICES": "2", **(env or {})})
    return out if r else None


if mpirun is None:
    s.skip("CUDA ZeRO on 2 and 3 ranks", why_not)
else:
    # ------------------------------------------------------------------------
    # 1. 2 ranks, one micro-step a rank (-d 64): every optimizer, --zero 0, 1, 2
    for opt, oflags in OPTIMIZERS.items():
        d = {z: f"{W}/{opt}_z{z}" for z in (0, 1, 2)}
        runs = {z: run(f"{opt}: mpirun -np 2 --zero {z}", 2, d[z], ["-d", "64", "--zero", str(z)] + oflags) for z in (0, 1, 2)}
        for z in (1, 2):
            if runs[0] and runs[z]:
                same_model(f"{opt}: --zero {z} = --zero 0", d[0], d[z])
                zero_counts(f"{opt} --zero {z}", runs[z], z, 2, 1, DEEP)
        if runs[1] and runs[2]:
            same_state_floats(f"{opt}: --zero 2's state files hold --zero 1's floats", d[1], d[2], 2)

    # ------------------------------------------------------------------------
    # 2. 3 ranks, CAME (rows and columns of every slice cut unevenly: the last block padded)
    d = {z: f"{W}/came3_z{z}" for z in (0, 1, 2)}
    runs = {z: run(f"came: mpirun -np 3 --zero {z}", 3, d[z], ["-d", "96", "--zero", str(z)] + OPTIMIZERS["came"]) for z in (0, 1, 2)}
    for z in (1, 2):
        if runs[0] and runs[z]:
            models_close(f"came, 3 ranks: --zero {z} within {RTOL:g} of --zero 0 (three sums: a real ring may add them in "
                         "another order; the emulated NCCL adds in rank order, so here the distance is 0)",
                         ckpt(d[z], "model", STEPS, ".bin"), ckpt(d[0], "model", STEPS, ".bin"), RTOL)
            zero_counts(f"came, 3 ranks --zero {z}", runs[z], z, 3, 1, DEEP)

    # ------------------------------------------------------------------------
    # 3. 2 micro-steps a rank (-d 128): ZeRO-1 reduces the summed micro-steps once (bit for bit);
    # ZeRO-2 reduce-scatters each micro-step and adds the sums in its shard (another order: RTOL)
    d = {z: f"{W}/accum_z{z}" for z in (0, 1, 2)}
    runs = {z: run(f"adamw, 2 micro-steps: mpirun -np 2 --zero {z}", 2, d[z], ["-d", "128", "--zero", str(z)]) for z in (0, 1, 2)}
    if runs[0] and runs[1]:
        same_model("adamw, 2 micro-steps: --zero 1 = --zero 0", d[0], d[1])
    if runs[0] and runs[2]:
        models_close(f"adamw, 2 micro-steps: --zero 2 within {RTOL:g} of --zero 0 (the micro-steps' sums added in another order)",
                     ckpt(d[2], "model", STEPS, ".bin"), ckpt(d[0], "model", STEPS, ".bin"), RTOL)
        zero_counts("adamw, 2 micro-steps --zero 2", runs[2], 2, 2, 2, DEEP)
    # with the chunked loss (the next micro-step's forward adds wte's gradient into the working buffer the
    # last one's head exchange read), recompute and activation offload, in the late stream order
    ACCUM_FLAGS = ["-d", "128", "--loss-chunk", "12", "--recompute", "2,gelu", "--offload", "activations"] + OPTIMIZERS["came"]
    d = {z: f"{W}/accum_flags_z{z}" for z in (0, 2)}
    runs = {z: run(f"came, 2 micro-steps, --loss-chunk, recompute, offload: mpirun -np 2 --zero {z}, late streams", 2, d[z],
                   ACCUM_FLAGS + ["--zero", str(z)], late=True) for z in (0, 2)}
    if runs[0] and runs[2]:
        models_close(f"came, 2 micro-steps with the memory flags, late streams: --zero 2 within {RTOL:g} of --zero 0",
                     ckpt(d[2], "model", STEPS, ".bin"), ckpt(d[0], "model", STEPS, ".bin"), RTOL)

    # ------------------------------------------------------------------------
    # 4. the memory flags, and the late stream order: the comm stream packs what the compute stream
    # has not yet written, or the update reads a shard the comm stream has not yet added to, unless
    # each waits for the other
    for z in (1, 2):
        late = f"{W}/late_z{z}"
        if run(f"adamw: mpirun -np 2 --zero {z}, late streams", 2, late, ["-d", "64", "--zero", str(z)], late=True):
            same_model(f"adamw --zero {z}, late streams: the model of --zero 0 in order", f"{W}/adamw_z0", late)
    MEMORY_FLAGS = {"recompute, activation offload, --loss-chunk": ["--recompute", "2,gelu,attn", "--offload", "activations",
                                                                    "--loss-chunk", "12"] + OPTIMIZERS["adafactor"],
                    "bf16, --attention matmul, --recompute attn": ["--precision", "bf16", "--attention", "matmul",
                                                                   "--recompute", "attn"] + OPTIMIZERS["came"]}
    for i, (what, mflags) in enumerate(MEMORY_FLAGS.items()):
        d = {z: f"{W}/flags{i}_z{z}" for z in (0, 2)}
        runs = {z: run(f"{what}: mpirun -np 2 --zero {z}, late streams", 2, d[z], ["-d", "64", "--zero", str(z)] + mflags, late=True)
                for z in (0, 2)}
        if runs[0] and runs[2]:
            same_model(f"{what}, late streams: --zero 2 = --zero 0", d[0], d[2])

    # ------------------------------------------------------------------------
    # 5. a head heavier than a layer (V = 500, Vp = 512: wte's padded rows too): the head's blocks
    # go through the pack in rounds, on 2 and 3 ranks
    for ranks, zeros in ((2, (0, 2)), (3, (0, 1, 2))):
        d = {z: f"{W}/vocab{ranks}_z{z}" for z in zeros}
        runs = {z: run(f"V = 500: mpirun -np {ranks} --zero {z}", ranks, d[z], ["-d", str(32 * ranks), "--zero", str(z)],
                       model="model_vocab.bin") for z in zeros}
        for z in zeros[1:]:
            if runs[0] and runs[z]:
                models_close(f"V = 500, {ranks} ranks: --zero {z} within {RTOL:g} of --zero 0 (bit for bit on 2 ranks)",
                             ckpt(d[z], "model", STEPS, ".bin"), ckpt(d[0], "model", STEPS, ".bin"), RTOL)
                if ranks == 2:
                    same_model(f"V = 500, 2 ranks: --zero {z} = --zero 0", d[0], d[z])
                zero_counts(f"V = 500, {ranks} ranks --zero {z}", runs[z], z, ranks, 1, VOCAB)

    # ------------------------------------------------------------------------
    # 6. the CPU trainer's --zero 2 (MPI) against the GPU's, and checkpoints across stages and backends
    cpu_mpirun, cpu_why_not = e2e.mpi_launcher(TRAIN)
    z1, z2, cpu = f"{W}/adamw_z1", f"{W}/adamw_z2", f"{W}/cpu_z2"
    cpu_ok = None
    if cpu_mpirun is None:
        s.skip("the CPU trainer's --zero 2 against the GPU's", cpu_why_not)
    else:
        cpu_ok = run("CPU: mpirun -np 2 ./train_gpt --zero 2", 2, cpu, ["-d", "64", "--zero", "2"], trainer=TRAIN)
        if cpu_ok and os.path.isdir(z2):
            models_close(f"--zero 2: the GPU's model within {MODEL_RTOL:g} of the CPU's",
                         ckpt(z2, "model", STEPS, ".bin"), ckpt(cpu, "model", STEPS, ".bin"), MODEL_RTOL)
    def resume_case(src, src_desc, z, trainer, want, how, tag, extra=()):
        """checkpoint 2 of the run in SRC (SRC_DESC: whose, which stage) resumed by TRAINER with --zero Z
        (and EXTRA flags) to the end: bit for bit the run WANT (HOW "bit": the model and the state floats)
        or within MODEL_RTOL of it ("close": another backend's)"""
        name = f"a {src_desc} checkpoint resumed by the {'CPU' if trainer == TRAIN else 'GPU'} with --zero {z} {' '.join(extra)}".rstrip()
        if not os.path.isfile(ckpt(src, "DONE", 2)) or (trainer == TRAIN and cpu_mpirun is None):
            s.fail(name, f"no checkpoint 2 in {src}, or no CPU trainer with MPI")
            return
        r = f"{W}/{tag}_{os.path.basename(src)}_{'cpu' if trainer == TRAIN else 'gpu'}_z{z}{'_'.join(extra).replace('-', '')}"
        copy_step(src, 2, r)
        ran = s.expect_ok(name, (cpu_mpirun if trainer == TRAIN else mpirun) + ["2", trainer, "-e", f"{FIX}/model_deep.bin"] + FLAGS
                          + ["-d", "64", "--zero", str(z), *extra, "-o", r, "-y", "1"])
        if not ran:
            return
        s.check(f"{name}: starts at step 2", "at step 2" in ran.out, ran.out[-300:])
        if how == "bit":
            same_model(f"{name}: ends as the straight --zero {z} run", want, r)
            same_state_floats(f"{name}: the same state floats at the end", want, r, 2)
        else:
            models_close(f"{name}: ends within {MODEL_RTOL:g} of that backend's straight run",
                         ckpt(r, "model", STEPS, ".bin"), ckpt(want, "model", STEPS, ".bin"), MODEL_RTOL)

    for src, desc, z, trainer, want, how in ((z1, "GPU --zero 1", 2, CUDA, z2, "bit"), (z2, "GPU --zero 2", 1, CUDA, z1, "bit"),
                                             (z2, "GPU --zero 2", 2, TRAIN, z2, "close"), (cpu, "CPU --zero 2", 2, CUDA, cpu, "close")):
        resume_case(src, desc, z, trainer, want, how, "resume")

    # ------------------------------------------------------------------------
    # 6b. ZeRO-3: the weights sharded too (fp32 master and working shards); the head gathered once a step,
    # each layer into one of two buffers before its forward, backward and recompute, the next layer's
    # gather prefetched on the comm stream. Its sums are ZeRO-2's additions: bit for bit against --zero 2
    # everywhere, and against --zero 0 where ZeRO-2 is (one micro-step a rank on 2 ranks)
    for opt, oflags in OPTIMIZERS.items():
        d3 = f"{W}/{opt}_z3"
        if run(f"{opt}: mpirun -np 2 --zero 3", 2, d3, ["-d", "64", "--zero", "3"] + oflags):
            same_model(f"{opt}: --zero 3 = --zero 2 (the checkpoint's model file byte for byte)", f"{W}/{opt}_z2", d3)
            same_model(f"{opt}: --zero 3 = --zero 0", f"{W}/{opt}_z0", d3)
            same_state_floats(f"{opt}: --zero 3's state files hold --zero 2's floats", f"{W}/{opt}_z2", d3, 2)
            zero_counts(f"{opt} --zero 3", run_of[d3], 3, 2, 1, DEEP)
    d3 = f"{W}/came3_z3"
    if run("came: mpirun -np 3 --zero 3", 3, d3, ["-d", "96", "--zero", "3"] + OPTIMIZERS["came"]):
        same_model("came, 3 ranks: --zero 3 = --zero 2", f"{W}/came3_z2", d3)
        models_close(f"came, 3 ranks: --zero 3 within {RTOL:g} of --zero 0 (three sums: a real ring may add them in another "
                     "order; the emulated NCCL adds in rank order, so here the distance is 0)",
                     ckpt(d3, "model", STEPS, ".bin"), ckpt(f"{W}/came3_z0", "model", STEPS, ".bin"), RTOL)
        zero_counts("came, 3 ranks --zero 3", run_of[d3], 3, 3, 1, DEEP)
    # 2 micro-steps with the memory flags (recompute 2 layers a segment: 3 layers of 5 recomputed), late streams
    d3 = f"{W}/accum_flags_z3"
    if run("came, 2 micro-steps, --loss-chunk, recompute, offload: mpirun -np 2 --zero 3, late streams", 2, d3,
           ACCUM_FLAGS + ["--zero", "3"], late=True):
        same_model("came, 2 micro-steps with the memory flags, late streams: --zero 3 = --zero 2", f"{W}/accum_flags_z2", d3)
        models_close(f"came, 2 micro-steps with the memory flags, late streams: --zero 3 within {RTOL:g} of --zero 0",
                     ckpt(d3, "model", STEPS, ".bin"), ckpt(f"{W}/accum_flags_z0", "model", STEPS, ".bin"), RTOL)
        zero_counts("came, 2 micro-steps, recompute --zero 3", run_of[d3], 3, 2, 2, DEEP, recomputed=3)
    for i, (what, mflags) in enumerate(MEMORY_FLAGS.items()):
        d3 = f"{W}/flags{i}_z3"
        if run(f"{what}: mpirun -np 2 --zero 3, late streams", 2, d3, ["-d", "64", "--zero", "3"] + mflags, late=True):
            same_model(f"{what}, late streams: --zero 3 = --zero 2", f"{W}/flags{i}_z2", d3)
            same_model(f"{what}, late streams: --zero 3 = --zero 0", f"{W}/flags{i}_z0", d3)
    # the emulator's other orders: streams run early, threads shuffled or reversed (with late streams)
    for order in (["CUDA_EMU_STREAMS=early"], ["CUDA_EMU_THREAD_ORDER=shuffle", "CUDA_EMU_SEED=7"], ["CUDA_EMU_THREAD_ORDER=reverse"]):
        d3 = f"{W}/order_{order[0].split('=')[1]}_z3"
        if run(f"adamw: mpirun -np 2 --zero 3, {', '.join(order)}", 2, d3, ["-d", "64", "--zero", "3"],
               late="STREAMS" not in order[0], emu_env=order):
            same_model(f"adamw --zero 3 under {', '.join(order)}: the model of --zero 0 in order", f"{W}/adamw_z0", d3)
    # a head heavier than a layer: the head's gather in rounds, wte's padded rows (kept zero in the working copy)
    for ranks in (2, 3):
        d3 = f"{W}/vocab{ranks}_z3"
        if run(f"V = 500: mpirun -np {ranks} --zero 3", ranks, d3, ["-d", str(32 * ranks), "--zero", "3"], model="model_vocab.bin"):
            same_model(f"V = 500, {ranks} ranks: --zero 3 = --zero 2", f"{W}/vocab{ranks}_z2", d3)
            zero_counts(f"V = 500, {ranks} ranks --zero 3", run_of[d3], 3, ranks, 1, VOCAB)
    # checkpoints across the stages and the backends: a --zero 2 checkpoint resumed with --zero 3, a
    # --zero 3 one with --zero 1; the CPU's --zero 3 and the GPU's, each resumed by the other
    z3, cpu3 = f"{W}/adamw_z3", f"{W}/cpu_z3"
    if cpu_mpirun is not None:
        if run("CPU: mpirun -np 2 ./train_gpt --zero 3", 2, cpu3, ["-d", "64", "--zero", "3"], trainer=TRAIN) and os.path.isdir(z3):
            models_close(f"--zero 3: the GPU's model within {MODEL_RTOL:g} of the CPU's",
                         ckpt(z3, "model", STEPS, ".bin"), ckpt(cpu3, "model", STEPS, ".bin"), MODEL_RTOL)
    for src, desc, z, trainer, want, how in ((z2, "GPU --zero 2", 3, CUDA, z3, "bit"), (z3, "GPU --zero 3", 1, CUDA, z1, "bit"),
                                             (z3, "GPU --zero 3", 3, TRAIN, cpu3, "close"), (cpu3, "CPU --zero 3", 3, CUDA, z3, "close")):
        resume_case(src, desc, z, trainer, want, how, "resume3")

    # ------------------------------------------------------------------------
    # 6c. the offloaded shard (--offload optimizer under --zero 2 and 3): a rank's shards of the fp32
    # master weights and of the step's gradients, and its optimizer state, in host memory; the step on
    # the CPU (the same arithmetic as the GPU's kernels: tests/test_cuda_matrix.py), the new weights up
    # into a floatX shard that the GPU gathers from. Bit for bit the run of the same stage without it:
    # every optimizer, 3 ranks, a head in rounds, 2 micro-steps with the memory flags under the late
    # stream order, bf16; its checkpoints resume without it, and on the CPU
    OFFLOAD = ["--offload", "optimizer"]
    for z in (2, 3):
        for opt, oflags in OPTIMIZERS.items():
            d = f"{W}/{opt}_z{z}_offload"
            if run(f"{opt}: mpirun -np 2 --zero {z} --offload optimizer", 2, d, ["-d", "64", "--zero", str(z)] + OFFLOAD + oflags):
                same_model(f"{opt}: --zero {z} --offload optimizer = --zero {z}", f"{W}/{opt}_z{z}", d)
                same_state_floats(f"{opt}: --zero {z} --offload optimizer's state files hold --zero {z}'s floats", f"{W}/{opt}_z{z}", d, 2)
                zero_counts(f"{opt} --zero {z} --offload optimizer", run_of[d], z, 2, 1, DEEP)
        d = f"{W}/came3_z{z}_offload"
        if run(f"came: mpirun -np 3 --zero {z} --offload optimizer", 3, d, ["-d", "96", "--zero", str(z)] + OFFLOAD + OPTIMIZERS["came"]):
            same_model(f"came, 3 ranks: --zero {z} --offload optimizer = --zero {z}", f"{W}/came3_z{z}", d)
        accum = [f if f != "activations" else "activations,optimizer" for f in ACCUM_FLAGS]
        d = f"{W}/accum_flags_z{z}_offload"
        if run(f"came, 2 micro-steps, --loss-chunk, recompute, offload activations,optimizer: mpirun -np 2 --zero {z}, late streams",
               2, d, accum + ["--zero", str(z)], late=True):
            same_model(f"came, 2 micro-steps with the memory flags, late streams: --zero {z} --offload optimizer = --zero {z}",
                       f"{W}/accum_flags_z{z}", d)
        d = f"{W}/vocab3_z{z}_offload"  # the head in rounds, wte's padded rows (zero in the gathered copy)
        if run(f"V = 500: mpirun -np 3 --zero {z} --offload optimizer", 3, d, ["-d", "96", "--zero", str(z)] + OFFLOAD,
               model="model_vocab.bin"):
            same_model(f"V = 500, 3 ranks: --zero {z} --offload optimizer = --zero {z}", f"{W}/vocab3_z{z}", d)
            zero_counts(f"V = 500, 3 ranks --zero {z} --offload optimizer", run_of[d], z, 3, 1, VOCAB)
        what, mflags = list(MEMORY_FLAGS.items())[1]  # bf16: the host rounds the new weights as the GPU does
        d = f"{W}/flags1_z{z}_offload"
        if run(f"{what}, --offload optimizer: mpirun -np 2 --zero {z}, late streams", 2, d,
               ["-d", "64", "--zero", str(z)] + OFFLOAD + mflags, late=True):
            same_model(f"{what}, late streams: --zero {z} --offload optimizer = --zero {z}", f"{W}/flags1_z{z}", d)
    z2o, z3o = f"{W}/adamw_z2_offload", f"{W}/adamw_z3_offload"
    for src, desc, z, trainer, want, how, extra in ((z3o, "GPU --zero 3 --offload optimizer", 3, CUDA, z3, "bit", ()),
                                                    (z2, "GPU --zero 2", 2, CUDA, z2o, "bit", OFFLOAD),
                                                    (z3o, "GPU --zero 3 --offload optimizer", 3, TRAIN, cpu3, "close", ())):
        resume_case(src, desc, z, trainer, want, how, "resume_offload", extra)

    # ------------------------------------------------------------------------
    # 7. without MPI: torchrun-style variables, NCCL's id through a folder, the host's sums over NCCL
    if NOMPI is None:
        s.skip("--zero 2 started without MPI", "no emulated build without MPI given")
    else:
        for tag, flags, why in (("z2", ["--zero", "2"], ""), ("z3", ["--zero", "3"], ""),
                                ("z3_offload", ["--zero", "3", "--offload", "optimizer"],
                                 " (the host's norm, update and checkpoints over NCCL)")):
            d = run_nompi(f"{' '.join(flags)} on 2 processes started by scripts/launch_local.sh (no MPI){why}", tag, flags)
            if d:
                same_model(f"{' '.join(flags)} without MPI: the model of mpirun's --zero 0", f"{W}/adamw_z0", d)

# ----------------------------------------------------------------------------
# 8. without ranks: what is refused, and what --plan prices

for z in (2, 3):
    s.expect_fail(f"--zero {z} with --offload optimizer,gradients: refused, saying why and naming --offload optimizer",
                  f"--zero {z} with --offload optimizer,gradients: under ZeRO-2 and 3 the GPU keeps only its 1/N shard",
                  [CUDA, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--zero", str(z), "--offload", "optimizer,gradients",
                   "--plan-ranks", "2"])
s.expect_fail("--check-replicas with --zero 2 --offload optimizer: refused (the ranks' hosts keep blocks of the master weights, "
              "no replicas)", "--check-replicas with --zero 2 --offload optimizer: the ranks hold no replicas",
              [CUDA, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--zero", "2", "--offload", "optimizer", "--check-replicas", "1",
               "--plan-ranks", "2"])


def planned_gradients(flags):
    r = s.run([CUDA, "--plan", "-e", "d12", "-b", "4", "-t", "64"] + flags)
    m = re.search(r"^\| gradients +\| +([0-9.]+) MiB +\| +\S+ +\| (.*?) +\|$", r.out, re.M)
    return (float(m.group(1)), m.group(2)) if m else (None, r.out[-800:] + r.err)


g0, f0 = planned_gradients([])
g1, f1 = planned_gradients(["--zero", "1", "--plan-ranks", "8"])
g2, f2 = planned_gradients(["--zero", "2", "--plan-ranks", "8"])
print(f"     d12 gradients per GPU: {g0} MiB ({f0}); 8 ranks --zero 1: {g1} MiB ({f1}); --zero 2: {g2} MiB ({f2})")
s.check("--plan d12, 8 ranks --zero 1: the model's gradients and the pack of one layer (5.7% of a 124M model's)",
        None not in (g0, g1) and "the pack" in f1 and g0 < g1 < 1.06 * g0, f"{g1} vs {g0}: {f1}")
s.check("--plan d12, 8 ranks --zero 2: the shard, a one-layer working buffer and the pack, below 0.6x of the whole gradients",
        None not in (g0, g2) and "ZeRO-2" in f2 and g2 < 0.6 * g0, f"{g2} vs {g0}: {f2}")


def planned_row(flags, row):
    r = s.run([CUDA, "--plan", "-e", "d12", "-b", "4", "-t", "64"] + flags)
    m = re.search(rf"^\| {row} +\| +([0-9.]+) MiB +\| +\S+ +\| (.*?) +\|$", r.out, re.M)
    return (float(m.group(1)), m.group(2)) if m else (None, r.out[-800:] + r.err)


p0, pf0 = planned_row([], "parameters")
p3, pf3 = planned_row(["--zero", "3", "--plan-ranks", "8"], "parameters")
h0, hf0 = planned_row([], "host copies")
h3, hf3 = planned_row(["--zero", "3", "--plan-ranks", "8"], "host copies")
print(f"     d12 weights per GPU: {p0} MiB ({pf0}); 8 ranks --zero 3: {p3} MiB ({pf3}); host copies {h0} -> {h3} MiB ({hf3})")
s.check("--plan d12, 8 ranks --zero 3: the weight shards, a one-layer working copy and a second layer buffer, below 0.4x of "
        "the whole weights; the host copy of the weights is one slice", None not in (p0, p3, h0, h3) and "ZeRO-3" in pf3
        and p3 < 0.4 * p0 and "largest slice" in hf3 and h3 < 0.5 * h0, f"{p3} vs {p0}: {pf3}; {h3} vs {h0}: {hf3}")
# the offloaded shard: a rank's host memory holds 1/N of the master weights and of the gradients (--zero 1's
# offload holds them whole: 2 x 4P), and the GPU keeps no fp32 master (2 bytes a weight of the shard, not 6)
o1, of1 = planned_row(["--zero", "1", "--offload", "optimizer", "--plan-ranks", "8"], "optimizer \\(host\\)")
o3, of3 = planned_row(["--zero", "3", "--offload", "optimizer", "--plan-ranks", "8"], "optimizer \\(host\\)")
p3o, pf3o = planned_row(["--zero", "3", "--offload", "optimizer", "--plan-ranks", "8"], "parameters")
print(f"     d12 host optimizer memory a rank, 8 ranks: --zero 1 --offload optimizer {o1} MiB ({of1}); --zero 3: {o3} MiB ({of3}); "
      f"GPU weights --zero 3 {p3} MiB, with --offload optimizer {p3o} MiB ({pf3o})")
s.check("--plan d12, 8 ranks --zero 3 --offload optimizer: the host keeps each rank's shard (below 0.3x of --zero 1's offload), "
        "the GPU no fp32 master", None not in (o1, o3, p3, p3o) and "2E" in of3 and o3 < 0.3 * o1 and p3o < 0.75 * p3,
        f"{o3} vs {o1}: {of3}; {p3o} vs {p3}: {pf3o}")

# ----------------------------------------------------------------------------
# 9. CUDA_EMU_STREAMS=late-nccl (dev/cuda_emu/README.md): the late stream order, and the NCCL
# collectives wait in their streams too instead of running at the call (under late, a collective runs
# its stream's earlier work before the next operation of any stream is even queued). Only here does a
# compute stream that clears ZeRO-2's working gradients without waiting for the comm stream's pack
# (zero2_reduce: working_taken), or runs the encoder without waiting for ZeRO-3's head gather
# (zero3_gather_outer: outer_ready), train another model; the runs must still equal --zero 0 and 2

LATE_NCCL = ["CUDA_EMU_STREAMS=late-nccl"]
if mpirun is None:
    s.skip("CUDA ZeRO under CUDA_EMU_STREAMS=late-nccl", why_not)
else:
    for z in (1, 2, 3):
        d = f"{W}/late_nccl_z{z}"
        if run(f"adamw: mpirun -np 2 --zero {z}, late-nccl streams", 2, d, ["-d", "64", "--zero", str(z)], emu_env=LATE_NCCL):
            same_model(f"adamw --zero {z}, late-nccl streams: the model of --zero 0 in order", f"{W}/adamw_z0", d)
    for i, (what, mflags) in enumerate(MEMORY_FLAGS.items()):
        for z in (2, 3):
            d = f"{W}/late_nccl_flags{i}_z{z}"
            if run(f"{what}: mpirun -np 2 --zero {z}, late-nccl streams", 2, d, ["-d", "64", "--zero", str(z)] + mflags,
                   emu_env=LATE_NCCL):
                same_model(f"{what}, late-nccl streams: --zero {z} = --zero 0", f"{W}/flags{i}_z0", d)
    # 2 micro-steps with the chunked loss, recompute and activation offload: ZeRO-2's sums added in
    # its order (RTOL of --zero 0), ZeRO-3 bit for bit ZeRO-2's
    d = {z: f"{W}/late_nccl_accum_flags_z{z}" for z in (2, 3)}
    runs = {z: run(f"came, 2 micro-steps, --loss-chunk, recompute, offload: mpirun -np 2 --zero {z}, late-nccl streams", 2, d[z],
                   ACCUM_FLAGS + ["--zero", str(z)], emu_env=LATE_NCCL) for z in (2, 3)}
    if runs[2]:
        models_close(f"came, 2 micro-steps with the memory flags, late-nccl streams: --zero 2 within {RTOL:g} of --zero 0",
                     ckpt(d[2], "model", STEPS, ".bin"), ckpt(f"{W}/accum_flags_z0", "model", STEPS, ".bin"), RTOL)
    if runs[2] and runs[3]:
        same_model("came, 2 micro-steps with the memory flags, late-nccl streams: --zero 3 = --zero 2", d[2], d[3])
    # the offloaded shard: each layer's gradients go down to the host behind its reduce-scatter on the comm stream
    for z in (2, 3):
        d = f"{W}/late_nccl_adamw_z{z}_offload"
        if run(f"adamw: mpirun -np 2 --zero {z} --offload optimizer, late-nccl streams", 2, d,
               ["-d", "64", "--zero", str(z), "--offload", "optimizer"], emu_env=LATE_NCCL):
            same_model(f"adamw, late-nccl streams: --zero {z} --offload optimizer = --zero {z}", f"{W}/adamw_z{z}", d)
        accum = [f if f != "activations" else "activations,optimizer" for f in ACCUM_FLAGS]
        d = f"{W}/late_nccl_accum_flags_z{z}_offload"
        if run(f"came, 2 micro-steps, --loss-chunk, recompute, offload activations,optimizer: mpirun -np 2 --zero {z}, late-nccl "
               "streams", 2, d, accum + ["--zero", str(z)], emu_env=LATE_NCCL):
            same_model(f"came, 2 micro-steps with the memory flags, late-nccl streams: --zero {z} --offload optimizer = --zero {z}",
                       f"{W}/accum_flags_z{z}", d)
    # without MPI: the collectives of both communicators (the model's, the host's sums) queued, over sockets
    if NOMPI is None:
        s.skip("--zero 3 started without MPI, late-nccl streams", "no emulated build without MPI given")
    else:
        d = run_nompi("--zero 3 on 2 processes started by scripts/launch_local.sh (no MPI), late-nccl streams", "late_nccl_z3",
                      ["--zero", "3"], env={"CUDA_EMU_STREAMS": "late-nccl"})
        if d:
            same_model("--zero 3 without MPI, late-nccl streams: the model of mpirun's --zero 0", f"{W}/adamw_z0", d)
s.finish()
