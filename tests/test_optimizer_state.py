"""test_optimizer_state.py: --optimizer-state fp32|bf16|8bit end to end (issue 35; doc/optimizer_state.md):
the flag accepted and refused, the state's memory planned = measured, ZeRO 1, 2 and 3 on 2 ranks
bit for bit the run of --zero 0, a resume in the same format bit for bit the straight run, a resume
into another format converted with a note, old (version 4) state files read as fp32, a run whose
moments overflow stopped naming them (both backends), and the CUDA
trainer (the emulated build): AdamW's bf16 and 8-bit moments on the GPU near the CPU's, resumed exactly,
bf16 under --zero 2 bit for bit --zero 0, every optimizer's with --offload optimizer, and what it
refuses for now.

    python3 tests/test_optimizer_state.py ./train_gpt ./test_gpt ./build/emu/train_gpt

Every run uses test_gpt's tiny fixture model (L=2 C=32 NH=2 maxT=32 V=64: fcw and fcprojw, 4,096
elements each, are the slices kept in 8 bits, the rest fp32), 6 steps. One micro-step a rank, so
that the ranks' gradients are added in the same order by every --zero (as tests/test_zero.py's
bitwise checks). Prints "ok   name" or "FAIL name: detail" per check and, last, "N passed, N failed"
(", 1 skipped" without mpirun).
"""

import os
import re
import shutil
import struct
import sys

import e2e
from e2e import ckpt, same_bytes

TRAIN, TESTER, EMU = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/emu/train_gpt"])
s = e2e.Suite("test_optimizer_state", tester=TESTER, run_limit=60)
FIX, W = s.fix, s.root

FLAGS = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-x", "6", "-u", "2", "-v", "0", "-s", "0", "-n", "3"]
BASE = [TRAIN] + FLAGS
FORMATS = ("bf16", "8bit")
STATE_SLOT_VERSION, STATE_SLOT_OPT_FORMAT = 1, 23  # llmc/checkpoint.h
FORMAT_CODES = {"fp32": 0, "bf16": 1, "8bit": 2}   # QStateFormat (llmc/quant_state.h)


def header_slot(path, slot):
    with open(path, "rb") as f:
        f.seek(4 * slot)
        return struct.unpack("<i", f.read(4))[0]


# ----------------------------------------------------------------------------
# 1. the flag

s.expect_fail("--optimizer-state fp16: unknown, the choices named", "choose fp32 (the default), bf16", BASE + ["--optimizer-state", "fp16", "-o", ""])
s.expect_fail("--optimizer-state 8bit with Adafactor without a first moment: refused, it would change nothing",
              "keeps no first moment", BASE + ["--optimizer", "adafactor", "--optimizer-state", "8bit", "-o", ""])
r = s.run([TRAIN, "--help"])
s.check("--help lists --optimizer-state", "--optimizer-state" in r.out + r.err, "not in --help")
for opt in (["adafactor", "--adafactor-beta1", "0.9"], ["came"]):
    s.expect_ok(f"--optimizer {' '.join(opt)} --optimizer-state 8bit trains", BASE + ["--optimizer", *opt, "--optimizer-state", "8bit", "-o", ""])

# the CUDA trainer (emulated): AdamW's moments in bf16 and 8 bits on the GPU (cuda/adamw_lowp.cuh), every
# optimizer's on the host with --offload optimizer; what it does not do yet it refuses, saying what does
CUDA_FLAGS = FLAGS + ["--precision", "fp32"]
LOSS_RTOL = 1e-4  # tests/test_cuda.py's: the GPU's GEMMs add in another order than the CPU's
if EMU and os.path.isfile(EMU):
    cpu_runs = {}
    for f in FORMATS:
        C, G = f"{W}/cpu_{f}", f"{W}/emu_{f}"
        if not (s.expect_ok(f"CPU {f}: 6 steps (the reference of the CUDA trainer's)", BASE + ["--precision", "fp32", "--optimizer-state", f, "-o", C])
                and s.expect_ok(f"CUDA trainer (emulated) {f}: 6 steps of AdamW", [EMU] + CUDA_FLAGS + ["--optimizer-state", f, "-o", G])):
            continue
        s.check_memory(f"CUDA trainer (emulated) {f}: memory measured = planned", G)
        lc, lg = [[row[1] for row in e2e.train_rows(d)] for d in (C, G)]
        s.check(f"CUDA trainer (emulated) {f}: the 6 losses within {LOSS_RTOL:g} of the CPU's in {f}",
                len(lc) == len(lg) == 6 and all(abs(x - y) <= LOSS_RTOL * abs(y) for x, y in zip(lg, lc)), f"{lg} vs {lc}")
        st = ckpt(G, "state", 6, "_00000.bin")
        s.check(f"CUDA trainer (emulated) {f}: its state file records the format and is the CPU's size",
                os.path.isfile(st) and header_slot(st, STATE_SLOT_OPT_FORMAT) == FORMAT_CODES[f]
                and os.path.getsize(st) == os.path.getsize(ckpt(C, "state", 6, "_00000.bin")), "format or size differs")
        R = f"{W}/emu_{f}_resume"
        os.makedirs(R)
        for part in (ckpt(G, "model", 3, ".bin"), ckpt(G, "state", 3, "_00000.bin"), ckpt(G, "DONE", 3)):
            shutil.copy(part, R)
        r = s.run([EMU] + CUDA_FLAGS + ["--optimizer-state", f, "-o", R, "-y", "1"])
        s.check(f"CUDA trainer (emulated) {f}: resumed from step 3, model and state at step 6 bit for bit",
                r.rc == 0 and same_bytes(ckpt(G, "model", 6, ".bin"), ckpt(R, "model", 6, ".bin"))
                and e2e.same_state(ckpt(G, "state", 6, "_00000.bin"), ckpt(R, "state", 6, "_00000.bin")), (r.out + r.err)[-300:])
    G = f"{W}/emu_came_offload"
    if s.expect_ok("CUDA trainer (emulated): --optimizer came --offload optimizer --optimizer-state 8bit (the host's update) trains",
                   [EMU] + CUDA_FLAGS + ["--optimizer", "came", "--offload", "optimizer", "--optimizer-state", "8bit", "-o", G]):
        s.check_memory("CUDA trainer (emulated) came 8bit, --offload optimizer: memory measured = planned", G)
    # Adafactor's and CAME's first moment on the GPU (cuda/factored_lowp.cuh: through an fp32 copy of the
    # largest slice part, planned as scratch): the CPU's losses, memory as planned
    for opt in (["adafactor", "--adafactor-beta1", "0.9", "--eps1", "1e-12"], ["came", "--eps1", "1e-12"]):
        for f in FORMATS:
            C, G = f"{W}/cpu_{opt[0]}_{f}", f"{W}/emu_{opt[0]}_{f}"
            flags = ["--optimizer", *opt, "--optimizer-state", f]
            if not (s.expect_ok(f"CPU {opt[0]} {f}: 6 steps", BASE + ["--precision", "fp32", *flags, "-o", C])
                    and s.expect_ok(f"CUDA trainer (emulated) {opt[0]} {f}: 6 steps, M on the GPU", [EMU] + CUDA_FLAGS + flags + ["-o", G])):
                continue
            s.check_memory(f"CUDA trainer (emulated) {opt[0]} {f}: memory measured = planned (M's fp32 staging in the scratch)", G)
            lc, lg = [[row[1] for row in e2e.train_rows(d)] for d in (C, G)]
            s.check(f"CUDA trainer (emulated) {opt[0]} {f}: the 6 losses within {LOSS_RTOL:g} of the CPU's",
                    len(lc) == len(lg) == 6 and all(abs(x - y) <= LOSS_RTOL * abs(y) for x, y in zip(lg, lc)), f"{lg} vs {lc}")
    MPIRUN_EMU, why = e2e.mpi_launcher(EMU)
    if MPIRUN_EMU is not None:
        # 8-bit state on 3 ranks, where its cut moves (the fixture's fcw in parts of 48 rows, not 43;
        # fcprojw of 12, not 11): --zero 1, 2 and 3 the model of --zero 0 bit for bit, memory as planned
        three = ["-d", "96", "--optimizer-state", "8bit"]
        ref = f"{W}/emu_n3_8bit_z0"
        if s.expect_ok("CUDA trainer (emulated): 8bit state, 3 ranks --zero 0", MPIRUN_EMU + ["3", EMU] + CUDA_FLAGS + three + ["-o", ref]):
            for z in ("1", "2", "3"):
                d = f"{W}/emu_n3_8bit_z{z}"
                if s.expect_ok(f"CUDA trainer (emulated): 8bit state, 3 ranks --zero {z} (the shards cut at the 8-bit blocks)",
                               MPIRUN_EMU + ["3", EMU] + CUDA_FLAGS + three + ["--zero", z, "-o", d]):
                    s.check(f"CUDA trainer (emulated): 8bit state, --zero {z} = --zero 0 bit for bit on 3 ranks (model at step 6)",
                            same_bytes(ckpt(ref, "model", 6, ".bin"), ckpt(d, "model", 6, ".bin")), "the models differ")
                    s.check_memory(f"CUDA trainer (emulated): 8bit state, --zero {z} on 3 ranks: memory measured = planned", d)
        # CAME's M in 8 bits under ZeRO-1 on 3 ranks (the factored statistics summed over NCCL, M cut at
        # its blocks): --zero 0's losses within the GPU's tolerance, memory as planned
        came = ["-d", "96", "--optimizer", "came", "--eps1", "1e-12", "--optimizer-state", "8bit"]
        ref, d = f"{W}/emu_n3_came8_z0", f"{W}/emu_n3_came8_z1"
        if (s.expect_ok("CUDA trainer (emulated): came 8bit, 3 ranks --zero 0", MPIRUN_EMU + ["3", EMU] + CUDA_FLAGS + came + ["-o", ref])
                and s.expect_ok("CUDA trainer (emulated): came 8bit, 3 ranks --zero 1", MPIRUN_EMU + ["3", EMU] + CUDA_FLAGS + came + ["--zero", "1", "-o", d])):
            s.check_memory("CUDA trainer (emulated): came 8bit, --zero 1 on 3 ranks: memory measured = planned", d)
            l0, l1 = [[row[1] for row in e2e.train_rows(x)] for x in (ref, d)]
            s.check(f"CUDA trainer (emulated): came 8bit, --zero 1 on 3 ranks: the losses within {LOSS_RTOL:g} of --zero 0's",
                    len(l0) == len(l1) == 6 and all(abs(x - y) <= LOSS_RTOL * abs(y) for x, y in zip(l1, l0)), f"{l1} vs {l0}")
        ref, d = f"{W}/emu_n2_bf16_z0", f"{W}/emu_n2_bf16_z2"
        if (s.expect_ok("CUDA trainer (emulated): bf16 state, 2 ranks --zero 0", MPIRUN_EMU + ["2", EMU] + CUDA_FLAGS + ["-d", "64", "--optimizer-state", "bf16", "-o", ref])
                and s.expect_ok("CUDA trainer (emulated): bf16 state, 2 ranks --zero 2", MPIRUN_EMU + ["2", EMU] + CUDA_FLAGS + ["-d", "64", "--optimizer-state", "bf16", "--zero", "2", "-o", d])):
            s.check("CUDA trainer (emulated): bf16 state, --zero 2 = --zero 0 bit for bit on 2 ranks (each part's rounding stream is the tensor's)",
                    same_bytes(ckpt(ref, "model", 6, ".bin"), ckpt(d, "model", 6, ".bin")), "cmp differs")
    else:
        s.skip("the CUDA trainer's ranks with low-precision state", why)
    r = s.expect_ok("CUDA trainer (emulated): --plan --optimizer-state 8bit plans it",
                    [EMU, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--optimizer-state", "8bit"])
    if r:
        s.check("... its optimizer row is the 8-bit state", "8bit m, v" in r.out, [l for l in r.out.splitlines() if "optimizer" in l])
else:
    s.skip("the CUDA trainer's low-precision state", f"{EMU} not built (make build/emu/train_gpt)")

# the memory targets, planned (the plan of the fixture's runs is checked against their
# measured memory below): d12 AdamW state at most 250 MiB under 8bit; d84 AdamW with --offload
# optimizer on one H100 box (80 GB = 74.5 GiB of GPU, 125 GiB of host) under 8bit, the CUDA build's plan

def planned_mib(out, row):
    m = re.search(rf"^\| {re.escape(row)} +\| +([0-9.]+) MiB", out, re.M)
    return float(m.group(1)) if m else None


r = s.expect_ok("--plan -e d12 --optimizer-state 8bit", [TRAIN, "--plan", "-e", "d12", "-b", "4", "-t", "64", "--optimizer-state", "8bit"])
if r:
    mib = planned_mib(r.out, "optimizer state")
    s.check(f"d12 AdamW state under 8bit: {mib} MiB <= 250 MiB (fp32: 949.4)", mib is not None and mib <= 250, r.out[-400:])
if EMU and os.path.isfile(EMU):
    r = s.expect_ok("CUDA build: --plan -e d84 --offload optimizer --optimizer-state 8bit",
                    [EMU, "--plan", "-e", "d84", "-b", "1", "-t", "1024", "--recompute", "1,gelu,attn", "--offload", "optimizer",
                     "--optimizer-state", "8bit"])
    if r:
        gpu, host = planned_mib(r.out, "device total"), planned_mib(r.out, "host total")
        s.check(f"d84 AdamW --offload optimizer under 8bit: {gpu / 1024:.1f} GiB of GPU <= 74.5, {host / 1024:.1f} GiB of host <= 125",
                gpu is not None and host is not None and gpu <= 74.5 * 1024 and host <= 125 * 1024, r.out[-600:])

# ----------------------------------------------------------------------------
# 2. one rank: memory, resume in the same format, resume into another

runs = {}
for f in ("fp32",) + FORMATS:
    runs[f] = f"{W}/one_{f}"
    if s.expect_ok(f"{f}: 6 steps, checkpoints at 3 and 6", BASE + ["--optimizer-state", f, "-o", runs[f]]):
        s.check_memory(f"{f}: memory measured = planned", runs[f])
        st = ckpt(runs[f], "state", 6, "_00000.bin")
        s.check(f"{f}: the state file records its format (slot {STATE_SLOT_OPT_FORMAT} = {FORMAT_CODES[f]})",
                os.path.isfile(st) and header_slot(st, STATE_SLOT_OPT_FORMAT) == FORMAT_CODES[f], "not recorded")
sizes = {f: os.path.getsize(ckpt(d, "state", 6, "_00000.bin")) for f, d in runs.items() if os.path.isfile(ckpt(d, "state", 6, "_00000.bin"))}
if len(sizes) == 3:
    # (this model's slices but fcw and fcprojw are under 4,096 elements: fp32 under 8bit, so 8bit saves less here than bf16)
    s.check(f"state files: bf16 {sizes['bf16']}, 8bit {sizes['8bit']} < fp32 {sizes['fp32']} bytes",
            sizes["8bit"] < sizes["fp32"] and sizes["bf16"] < sizes["fp32"], "not smaller")


def resume_from_3(src, name, fmt):
    """a copy of src's checkpoint of step 3, resumed to step 6 with --optimizer-state fmt; the run's dir"""
    R = f"{W}/{name}"
    os.makedirs(R)
    for part in (ckpt(src, "model", 3, ".bin"), ckpt(src, "state", 3, "_00000.bin"), ckpt(src, "DONE", 3)):
        shutil.copy(part, R)
    return R, s.run(BASE + ["--optimizer-state", fmt, "-o", R, "-y", "1"])


for f in FORMATS:
    R, r = resume_from_3(runs[f], f"resume_{f}", f)
    s.check(f"{f}: resumed from step 3 in the same format: model and state at step 6 bit for bit",
            r.rc == 0 and same_bytes(ckpt(runs[f], "model", 6, ".bin"), ckpt(R, "model", 6, ".bin"))
            and e2e.same_state(ckpt(runs[f], "state", 6, "_00000.bin"), ckpt(R, "state", 6, "_00000.bin")), r.err[-300:])
for src, to in (("fp32", "8bit"), ("8bit", "bf16"), ("bf16", "fp32")):
    R, r = resume_from_3(runs[src], f"convert_{src}_{to}", to)
    s.check(f"{src} checkpoint resumed with --optimizer-state {to}: converted, with a note, and trains on",
            r.rc == 0 and f"optimizer state is {src}, this run keeps {to}: converted" in r.out
            and header_slot(ckpt(R, "state", 6, "_00000.bin"), STATE_SLOT_OPT_FORMAT) == FORMAT_CODES[to], (r.out + r.err)[-300:])
    first = [e2e.train_rows(d, 4, 4) for d in (R, runs[src])]
    s.check(f"... its step 4 loss is the {src} run's (the checkpoint's weights; the converted state moves them from step 4's update on)",
            r.rc == 0 and all(first) and first[0][0][1] == first[1][0][1], f"{first}")

# an old state file (version 4: no format slot) reads as fp32
OLD = f"{W}/old_v4"
os.makedirs(OLD)
for part in (ckpt(runs["fp32"], "model", 3, ".bin"), ckpt(runs["fp32"], "state", 3, "_00000.bin"), ckpt(runs["fp32"], "DONE", 3)):
    shutil.copy(part, OLD)
with open(ckpt(OLD, "state", 3, "_00000.bin"), "r+b") as fh:
    fh.seek(4 * STATE_SLOT_VERSION)
    fh.write(struct.pack("<i", 4))
e2e.restamp_state(ckpt(OLD, "state", 3, "_00000.bin"))
r = s.run(BASE + ["-o", OLD, "-y", "1"])
s.check("a version 4 state file (before the format slot) resumes as fp32, bit for bit the straight run",
        r.rc == 0 and same_bytes(ckpt(runs["fp32"], "model", 6, ".bin"), ckpt(OLD, "model", 6, ".bin")), (r.out + r.err)[-300:])

# ----------------------------------------------------------------------------
# 3. refused moments: a gradient whose square overflows fp32 makes the new second moment Inf, which
# bf16 and 8-bit state refuse to store. The run stops: the CPU naming the tensor at once, the CUDA
# trainer naming the step at the next point where it waits for the GPU (the next gradient norm)

# the fixture's tensors in its model file, after the 256-int header: (name, elements), in order
MODEL_HEADER_BYTES = 1024
OVERFLOW_GAIN = 1e30  # layer 1's ln2w: LayerNorm's output about 1e30, fc's input


def fixture_tensors(T, V, L, C, Vp):
    return [("wte", Vp * C), ("wpe", T * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C),
            ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C), ("fcw", L * 4 * C * C), ("fcb", L * 4 * C),
            ("fcprojw", L * C * 4 * C), ("fcprojb", L * C), ("lnfw", C), ("lnfb", C)]


def model_with_overflowing_gradient(path):
    """the fixture's model with layer 1's ln2w = OVERFLOW_GAIN and its fcw = 0: the forward stays finite
    (fc's output is its bias, the loss about log V), but fcw's gradient (ln2's output times fc's output
    gradient) is near 1e26, and its square, in v's update, overflows fp32 (past 1.8e19). The gradient norm,
    summed in double, stays finite, so the trainer's check of the loss and the norm lets it through
    (with --grad-clip 0: clipping would scale it down)"""
    with open(f"{FIX}/model.bin", "rb") as f:
        data = bytearray(f.read())
    _, _, T, V, L, _, C, Vp = struct.unpack_from("<8i", data, 0)
    offset, at = {}, 0
    for name, n in fixture_tensors(T, V, L, C, Vp):
        offset[name] = at
        at += n
    assert MODEL_HEADER_BYTES + 4 * at == len(data), "the fixture's layout changed (test_gpt --write-fixtures)"
    layer = 1
    for i in range(C):
        struct.pack_into("<f", data, MODEL_HEADER_BYTES + 4 * (offset["ln2w"] + layer * C + i), OVERFLOW_GAIN)
    struct.pack_into(f"<{4 * C * C}f", data, MODEL_HEADER_BYTES + 4 * (offset["fcw"] + layer * 4 * C * C), *([0.0] * (4 * C * C)))
    with open(path, "wb") as f:
        f.write(data)
    e2e.restamp_model(path)


OVERFLOW_MODEL = f"{W}/model_overflow.bin"
model_with_overflowing_gradient(OVERFLOW_MODEL)
OVERFLOW_FLAGS = ["-e", OVERFLOW_MODEL] + FLAGS[2:] + ["-x", "3", "-u", "0", "--grad-clip", "0", "-o", ""]
REFUSED_HINT = "hint: the run diverged"
s.expect_ok("refused: control: fp32 state runs the overflowing model to the end (fcw's v is Inf, so its steps are 0: no check sees it)",
            [TRAIN] + OVERFLOW_FLAGS + ["--optimizer-state", "fp32"])
for f in FORMATS:
    r = s.expect_fail(f"refused: CPU {f}: v overflows at step 1: the run stops naming the tensor and the count",
                      f"step 1: the optimizer's new moments of fcw of layer 1 hold 4096 non-finite value(s) (NaN or Inf), which {f} state refuses",
                      [TRAIN] + OVERFLOW_FLAGS + ["--optimizer-state", f])
    s.check(f"refused: CPU {f}: ... with the hint (a lower -l, a smaller --grad-clip)",
            REFUSED_HINT in r.err and "a lower -l" in r.err and "--grad-clip" in r.err, r.err[-300:])
if EMU and os.path.isfile(EMU):
    for f in FORMATS:
        r = s.expect_fail(f"refused: CUDA trainer (emulated) {f}: v overflows at step 1: the run stops at step 2's gradient norm, naming step 1",
                          f"step 1: the optimizer's new moments hold 4096 non-finite value(s) (NaN or Inf), which {f} state refuses",
                          [EMU] + OVERFLOW_FLAGS + ["--precision", "fp32", "--optimizer-state", f])
        s.check(f"refused: CUDA trainer (emulated) {f}: ... with the hint (a lower -l, a smaller --grad-clip)",
                REFUSED_HINT in r.err and "a lower -l" in r.err and "--grad-clip" in r.err, r.err[-300:])
        s.expect_fail(f"refused: CUDA trainer (emulated) {f}: in the run's last step, with no checkpoint after it: stops at the end",
                      "step 1: the optimizer's new moments hold 4096 non-finite value(s)",
                      [EMU] + OVERFLOW_FLAGS + ["-x", "1", "--precision", "fp32", "--optimizer-state", f])
else:
    s.skip("refused: the CUDA trainer's refused moments", f"{EMU} not built (make build/emu/train_gpt)")

# ----------------------------------------------------------------------------
# 4. ZeRO: 2 ranks, --zero 1, 2, 3 bit for bit --zero 0 (state, and under ZeRO-2 and 3 the gradients and
# weights, cut at 8-bit block boundaries). (On 3 ranks MPI adds the gradients in another order for each
# --zero, in fp32 too; tests/test_quant_state.c checks the cut itself on 3 ranks, where it moves.)

MPIRUN, why_not = e2e.mpi_launcher(TRAIN)
if MPIRUN is None:
    s.skip("the multi-rank checks (mpirun -np 2 and 3)", why_not)
    s.finish()
for ranks, stages in ((2, ("1", "2", "3")),):
    one_micro = ["-d", str(32 * ranks)]
    for f in FORMATS:
        ref = f"{W}/n{ranks}_{f}_z0"
        if not s.expect_ok(f"{f}: mpirun -np {ranks} --zero 0", MPIRUN + [str(ranks)] + BASE + one_micro + ["--optimizer-state", f, "-o", ref]):
            continue
        for z in stages:
            d = f"{W}/n{ranks}_{f}_z{z}"
            if s.expect_ok(f"{f}: mpirun -np {ranks} --zero {z}", MPIRUN + [str(ranks)] + BASE + one_micro + ["--optimizer-state", f, "--zero", z, "-o", d]):
                s.check(f"{f}: --zero {z} = --zero 0 bit for bit on {ranks} ranks (model at step 6)",
                        same_bytes(ckpt(ref, "model", 6, ".bin"), ckpt(d, "model", 6, ".bin")), "cmp differs")
                s.check_memory(f"{f}: --zero {z} on {ranks} ranks: memory measured = planned", d)
# a sharded 8-bit checkpoint resumes bit for bit
A = f"{W}/n2_8bit_z1"
R = f"{W}/n2_8bit_z1_resume"
if os.path.isfile(ckpt(A, "DONE", 3)):
    os.makedirs(R)
    for part in [ckpt(A, "model", 3, ".bin"), ckpt(A, "DONE", 3), ckpt(A, "state", 3, "_00000.bin"), ckpt(A, "state", 3, "_00001.bin")]:
        shutil.copy(part, R)
    r = s.run(MPIRUN + ["2"] + BASE + ["-d", "64", "--optimizer-state", "8bit", "--zero", "1", "-o", R, "-y", "1"])
    s.check("8bit: mpirun -np 2 --zero 1 resumed from step 3: model and both ranks' states at step 6 bit for bit",
            r.rc == 0 and same_bytes(ckpt(A, "model", 6, ".bin"), ckpt(R, "model", 6, ".bin"))
            and all(e2e.same_state(ckpt(A, "state", 6, f"_{k:05d}.bin"), ckpt(R, "state", 6, f"_{k:05d}.bin")) for k in (0, 1)),
            (r.out + r.err)[-300:])
s.finish()
