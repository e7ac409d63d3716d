"""test_matrix.py: every combination of the memory flags on the tiny fixture model, and the
invariants the flags promise:
  - each optimizer (adamw, adafactor, adafactor + beta1, came) with each activation policy
    (--recompute 1, gelu,attn, --offload 1, all three together) trains to the bitwise same model
    as the same optimizer without it, on 1 rank and on 2 ranks with --zero 0 and 1;
  - the memory measured after the first step equals the plan in every run (the record in the
    run's log.jsonl, byte for byte in every category);
  - --loss-chunk 12 (the head 12 of B*T = 32 tokens at a time: 12, 12, 8) with each optimizer and
    launch: within 1e-6 of the whole head (wte's gradient is summed chunk by chunk, in another
    order; Adafactor and CAME with --eps1 1e-12), and with every other policy on top bitwise the
    chunked run alone.
(N ranks against 1 rank, replicas and resume of sharded state: tests/test_zero.py.)

    python3 tests/test_matrix.py ./train_gpt ./test_gpt

Prints "ok   name" or "FAIL name: detail" per check and, last, "N passed, N failed"; without
mpirun (or with a train_gpt built without MPI) each 2-rank launch is skipped and counted:
"N passed, N failed, 2 skipped". Tolerances: none; a policy changes where activations live or
when they are computed, never the arithmetic, so models compare with cmp.
"""

import re
import sys

import e2e
from e2e import ckpt, same_bytes

TRAIN, TESTER = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt"])
s = e2e.Suite("test_matrix", tester=TESTER, run_limit=60)
FIX, W = s.fix, s.root
STEPS = 4

# 4 steps of 64 tokens: two micro-batches of B*T = 32 on one rank, one on each of two
BASE = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
        "-d", "64", "-x", str(STEPS), "-u", "1", "-v", "0", "-s", "0", "-n", "0"]
OPTIMIZERS = ["adamw", "adafactor", "adafactor --adafactor-beta1 0.9", "came"]
POLICIES = ["--recompute 1", "--recompute gelu,attn", "--offload 1", "--recompute 1,gelu,attn --offload 1"]

mpirun, why_not = e2e.mpi_launcher(TRAIN)
LAUNCHES = [("1 rank", [], [])]  # name, launcher, flags
for zero in ("0", "1"):
    if mpirun:
        LAUNCHES.append((f"2 ranks --zero {zero}", mpirun + ["2"], ["--zero", zero]))
    else:
        s.skip(f"2 ranks --zero {zero}: {len(OPTIMIZERS)} optimizers x {len(POLICIES) + 1} runs", why_not)


def train(name, run_dir, launcher, flags):
    """trains into RUN_DIR with the launcher and flags; checks the run and its memory record"""
    if not s.expect_ok(name, launcher + [TRAIN] + BASE + flags + ["-o", run_dir]):
        return False
    s.check_memory(f"{name}: measured memory equals the plan", run_dir)
    return True


def slug(text):
    return re.sub(r"[ ,-]+", "_", text)


CHUNK = ["--loss-chunk", "12"]
CHUNK_RTOL = 1e-6


def models_close(name, a, b, rtol):
    r = s.run([TESTER, "--compare-models", a, b, str(rtol)])
    s.check(name, r.rc == 0, (r.out + r.err).strip()[:300])
    print(f"     {r.out.strip()}")


for lname, launcher, zero in LAUNCHES:
    for opt in OPTIMIZERS:
        ref = f"{W}/ref_{slug(lname)}_{slug(opt)}"
        if not train(f"{lname}, {opt}", ref, launcher, ["--optimizer", *opt.split(), *zero]):
            continue
        # against a reference with --eps1 1e-12 for Adafactor and CAME: with the papers' 1e-30 a
        # gradient that rounding alone makes nonzero (the key biases') is an update of the full step
        # (tests/test_cuda.py), which no tolerance on the sums can bound
        eps = [] if opt == "adamw" else ["--eps1", "1e-12"]
        close_ref = ref
        if eps:
            close_ref = f"{W}/ref_{slug(lname)}_{slug(opt)}_eps"
            if not train(f"{lname}, {opt} --eps1 1e-12", close_ref, launcher, ["--optimizer", *opt.split(), *zero, *eps]):
                continue
        chunked = f"{W}/chunk_{slug(lname)}_{slug(opt)}"
        if train(f"{lname}, {opt}, --loss-chunk 12", chunked, launcher, ["--optimizer", *opt.split(), *zero, *eps, *CHUNK]):
            models_close(f"{lname}, {opt} {' '.join(eps)}, --loss-chunk 12: within {CHUNK_RTOL:g} of the whole head",
                         ckpt(chunked, "model", STEPS, ".bin"), ckpt(close_ref, "model", STEPS, ".bin"), CHUNK_RTOL)
            d = f"{W}/chunk_{slug(lname)}_{slug(opt)}_all"
            if train(f"{lname}, {opt}, --loss-chunk 12 {POLICIES[-1]}", d, launcher,
                     ["--optimizer", *opt.split(), *zero, *eps, *CHUNK, *POLICIES[-1].split()]):
                s.check(f"{lname}, {opt}, --loss-chunk 12 {POLICIES[-1]}: model bitwise equal to --loss-chunk 12 alone",
                        same_bytes(ckpt(chunked, "model", STEPS, ".bin"), ckpt(d, "model", STEPS, ".bin")), "cmp differs")
        for pol in POLICIES:
            d = f"{W}/run_{slug(lname)}_{slug(opt)}_{slug(pol)}"
            if not train(f"{lname}, {opt}, {pol}", d, launcher, ["--optimizer", *opt.split(), *zero, *pol.split()]):
                continue
            s.check(f"{lname}, {opt}, {pol}: model bitwise equal to the run without it",
                    same_bytes(ckpt(ref, "model", STEPS, ".bin"), ckpt(d, "model", STEPS, ".bin")), "cmp differs")

s.finish()
