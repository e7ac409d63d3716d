"""e2e.py: the one harness of the end-to-end suites (tests/test_*.py); standard library only.

A suite makes a Suite, runs the trainer through it and ends with finish():

    s = e2e.Suite("test_cli", tester="./test_gpt", run_limit=30)  # scratch dir, fixtures
    if s.expect_ok("run A", [train, *flags, "-o", s.path("a")]):     # exit 0, no *.tmp left
        steps = [row[0] for row in e2e.train_rows(s.path("a"))]      # from a/log.jsonl
        s.check("run A: steps 1..6 in the log", steps == [1, 2, 3, 4, 5, 6], f"steps: {steps}")
        s.check_memory("run A: measured memory equals the plan", s.path("a"))
    s.expect_fail("flags: unknown flag", "unknown flag '--bogus'", [train, "--bogus", "1"])
    s.finish()  # "N passed, N failed" (", N skipped" when a part was skipped); exit 1 on failure

Each check prints "ok   name", "FAIL name: detail" or "skipped: name (reason)". The scratch
directory (s.root) holds the fixtures (s.fix: test_gpt --write-fixtures, the tiny model L=2 C=32
NH=2 maxT=32 V=64, its shards and tokenizer, and broken files) and the runs' output, and is removed
at exit. Numbers come from the trainer's exit code and its JSON log (OUT/log.jsonl: one object a
line, training steps, validation, and the memory record after the first step), not from its
printed tables.

An error check (expect_fail) passes when the run exits non-zero by itself (not killed by a signal
or the time limit), stderr holds the expected phrase and the "(at file:line)" that utils.h's fail()
adds, no *.tmp file is left anywhere, and every file that existed before the run is byte-identical
after it (log.jsonl aside: a resumed run first drops its lines after the checkpoint's step).
"""

import array
import atexit
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "data"))
import gpt2_bpe  # noqa: E402  (GPT-2's BPE in python: where its files are, the ids of a prompt)

STEP_LINE_RE = re.compile(r"^step +\d+/\d+ ", re.M)  # "step    3/6 | loss ..."
FAIL_LOCATION_RE = re.compile(r"\(at [^ ]+:[0-9]+\)")  # what utils.h's fail() appends
MEMORY_KEYS = ("parameters", "gradients", "optimizer_state", "activations", "activation_grads",
               "scratch", "offloaded_host", "optimizer_host", "host_copies", "device_total", "host_total", "total")
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np"]


class Result:
    """one finished run: exit code (negative: killed by that signal), stdout, stderr"""

    def __init__(self, rc, out, err, timed_out):
        self.rc, self.out, self.err, self.timed_out = rc, out, err, timed_out

    def crashed(self):
        # 124: the time limit; >= 125: a shell, timeout or mpirun reporting a signal
        return self.timed_out or self.rc < 0 or self.rc >= 124

    def step_lines(self):
        return [line for line in self.out.splitlines() if STEP_LINE_RE.match(line)]


# ----------------------------------------------------------------------------
# what a run left behind: log.jsonl, checkpoints, files


def read_log(run_dir):
    """the objects of RUN_DIR/log.jsonl, one a line (raises on a line that is not JSON)"""
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_rows(run_dir, first=1, last=None):
    """(step, loss, grad_norm, lr) of the log's training lines for steps FIRST..LAST ([] without
    a log: the check that reads them then fails)"""
    if not os.path.isfile(os.path.join(run_dir, "log.jsonl")):
        return []
    rows = [r for r in read_log(run_dir) if "loss" in r]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows
            if r["step"] >= first and (last is None or r["step"] <= last)]


def memory_record(run_dir):
    """the log's {"planned": {...}, "measured": {...}} (bytes) written after the first step"""
    recs = [r["memory"] for r in read_log(run_dir) if "memory" in r]
    if len(recs) != 1:
        raise ValueError(f"{len(recs)} memory records in {run_dir}/log.jsonl, want 1")
    return recs[0]


def ckpt(run_dir, kind, step, suffix=""):
    """ckpt(DIR, "model", 6, ".bin") = DIR/model_00000006.bin; kinds model, state, DONE"""
    return os.path.join(run_dir, f"{kind}_{step:08d}{suffix}")


def latest_done(run_dir):
    """the newest DONE_ marker's step in RUN_DIR, or -1"""
    steps = [int(os.path.basename(p)[len("DONE_"):]) for p in glob.glob(os.path.join(run_dir, "DONE_*"))]
    return max(steps, default=-1)


def same_bytes(a, b):
    """cmp: both files exist and hold the same bytes"""
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


STATE_RUN_ID = slice(4 * 18, 4 * 20)  # the bytes of a run's identity in a state file's header (llmc/checkpoint.h)
STATE_CHECKSUM = slice(4 * 22, 4 * 23)  # a state file's CRC-32 (STATE_SLOT_CHECKSUM), of the whole file with this slot 0


MODEL_CHECKSUM = slice(4 * 17, 4 * 18)  # a model file's CRC-32 of its weights (MODEL_SLOT_CHECKSUM), where slot 16 says so


def restamp_model(path):
    """a model file whose weights a test edited on purpose gets their checksum, as the trainer would have written it"""
    with open(path, "r+b") as f:
        data = f.read()
        f.seek(MODEL_CHECKSUM.start)
        f.write(struct.pack("<I", zlib.crc32(data[1024:])))


def restamp_state(path):
    """a state file edited on purpose gets the checksum of what it now holds, as the trainer would have written it:
    a test of what the trainer checks inside a file must not be stopped at the checksum"""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[STATE_CHECKSUM] = bytes(4)
        f.seek(STATE_CHECKSUM.start)
        f.write(struct.pack("<I", zlib.crc32(data)))


def write_model(path, L=4, C=32, NH=2, V=64, Vp=80, maxT=32, seed=36):
    """writes an llm.c model file (fp32, version 3) of the given shape: LayerNorm weights 1, biases 0, the rest N(0, 0.02), wte's padded rows zero"""
    rng = random.Random(seed)
    header = [20240326, 3, maxT, V, L, NH, C, Vp] + [0] * 248
    shapes = [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * 3 * C * C),
              ("qkvb", L * 3 * C), ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C),
              ("fcw", L * 4 * C * C), ("fcb", L * 4 * C), ("fcprojw", L * 4 * C * C), ("fcprojb", L * C), ("lnfw", C), ("lnfb", C)]
    params = []
    for name, n in shapes:
        if name.startswith("ln") and name.endswith("w"):
            params += [1.0] * n
        elif name.endswith("b"):
            params += [0.0] * n
        else:
            params += [rng.gauss(0.0, 0.02) if name != "wte" or i < V * C else 0.0 for i in range(n)]
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(header)}i", *header))
        f.write(struct.pack(f"<{len(params)}f", *params))


TENSOR_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
                "fcprojb", "lnfw", "lnfb"]  # llm.c's order


def model_tensors(path):
    """an fp32 model file's 16 tensors (llm.c's order) as arrays, by name (TENSOR_NAMES)"""
    with open(path, "rb") as f:
        header = array.array("i")
        header.fromfile(f, 256)
        maxT, V, L, _, C, Vp = header[2], header[3], header[4], header[5], header[6], header[7]
        sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C, L * 4 * C * C,
                 L * 4 * C, L * C * 4 * C, L * C, C, C]
        out = {}
        for name, n in zip(TENSOR_NAMES, sizes):
            a = array.array("f")
            a.fromfile(f, n)
            out[name] = a
        return out


def rel_l2(a, b):
    """the relative L2 distance of two sequences of numbers, |a - b| / |b| (|a - b| when b is 0)"""
    num = sum((x - y) ** 2 for x, y in zip(a, b))
    den = sum(y * y for y in b)
    return (num / den) ** 0.5 if den > 0 else num ** 0.5


def model_differences(a, b, step):
    """the models of step `step` of run directories a and b (fp32 files): the tensors but wte whose bits differ,
    and wte's relative L2 distance (--pp's test: wte's two stages' gradients are added as two sums); OSError
    if a file is missing"""
    ta, tb = model_tensors(ckpt(a, "model", step, ".bin")), model_tensors(ckpt(b, "model", step, ".bin"))
    return [n for n in TENSOR_NAMES[1:] if ta[n].tobytes() != tb[n].tobytes()], rel_l2(ta["wte"], tb["wte"])


def copy_checkpoint(src, dst, step):
    """checkpoint `step` of run directory src (its model file, DONE marker and every rank's state file) into a
    new directory dst, which a run then resumes with -y 1; returns dst"""
    os.makedirs(dst)
    names = [f"model_{step:08d}.bin", f"DONE_{step:08d}"] + sorted(f for f in os.listdir(src) if f.startswith(f"state_{step:08d}_"))
    for f in names:
        shutil.copy(os.path.join(src, f), dst)
    return dst


def same_state(a, b):
    """two state files are the same but for their runs' identities (two separate runs draw two)"""
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            da, db = bytearray(fa.read()), bytearray(fb.read())
    except OSError:
        return False
    da[STATE_RUN_ID] = db[STATE_RUN_ID] = bytes(8)
    da[STATE_CHECKSUM] = db[STATE_CHECKSUM] = bytes(4)
    return da == db


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ----------------------------------------------------------------------------
# --sample's tests: the BPE files, the ids a run printed, and a model whose greedy choice depends on
# its window: the fixture trained for a moment on text made of COPY_PERIOD random tokens repeated
# COPY_REPEATS times, which it continues by copying the token COPY_PERIOD back

COPY_PERIOD, COPY_REPEATS, COPY_TOKENS, COPY_STEPS = 4, 8, 8192, 300
SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256  # llmc/dataloader.h


def shard_sum(data):
    """llmc/manifest.h's checksum of a shard's bytes: their CRC-32 (llmc/crc32.h, zlib's)"""
    return zlib.crc32(data)


def write_shard(path, tokens, vocab):
    """a token shard (llmc/dataloader.h) and beside it its manifest (llmc/manifest.h), a set of one
    shard: DIR/NAME.bin and DIR/NAME_manifest.txt, as the trainer wants them"""
    header = [SHARD_MAGIC, SHARD_VERSION, len(tokens)] + [0] * (HEADER_INTS - 3)
    data = struct.pack(f"<{HEADER_INTS}i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)
    with open(path, "wb") as f:
        f.write(data)
    with open(path[:-len(".bin")] + "_manifest.txt", "w", encoding="utf-8") as f:
        f.write(f"llm.c token shards manifest 1\ntokenizer test vocab {vocab} eot {vocab - 1}\n"
                f"shard train {len(tokens)} 0x{shard_sum(data):08x} {os.path.basename(path)}\nend 1\n")


def bpe_dir():
    """(GPT-2's BPE folder, None) when its files are there, else (None, why not)"""
    d = gpt2_bpe.DEFAULT_BPE_DIR
    if all(os.path.isfile(os.path.join(d, f)) for f in (gpt2_bpe.ENCODER_JSON, gpt2_bpe.VOCAB_BPE)):
        return d, None
    return None, f"no GPT-2 BPE files in {d} (see dev/data/tinyshakespeare.py)"


def sample_ids(r):
    """the ids a --sample run printed with -k "": the line after '---- the prompt ...'"""
    lines = r.out.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("---- the prompt")]
    return [int(x) for x in lines[at[0] + 1].split()] if at and at[0] + 1 < len(lines) else []


def copy_model(suite, train, vocab=64):
    """trains the copy model with TRAIN (a CPU trainer) from the fixture model; its model file,
    or None if the run failed"""
    rng = random.Random(5)
    tokens = []
    while len(tokens) < COPY_TOKENS:
        tokens += [rng.randrange(vocab) for _ in range(COPY_PERIOD)] * COPY_REPEATS
    shard, out = suite.path("copy.bin"), suite.path("copy")
    write_shard(shard, tokens, vocab)
    ok = suite.expect_ok(f"sample: the fixture learns to copy the token {COPY_PERIOD} back",
                         [train, "-e", f"{suite.fix}/model.bin", "-i", shard, "-j", "", "-k", "", "-b", "4", "-t", "32",
                          "-x", str(COPY_STEPS), "-l", "1e-2", "-u", "10", "-v", "0", "-s", "0", "-o", out])
    return ckpt(out, "model", COPY_STEPS, ".bin") if ok else None


def mpi_launcher(train):
    """(["mpirun", ..., "-np"], None) when ranks can be launched, else (None, why not)"""
    if shutil.which("mpirun") is None:
        return None, "mpirun not found; install openmpi-bin and libopenmpi-dev"
    try:
        linked = subprocess.run(["ldd", train], capture_output=True, text=True).stdout
    except OSError:
        linked = ""
    if "libmpi" not in linked:
        return None, f"{train} is built without MPI (rm -f train_gpt && make train_gpt)"
    return MPIRUN, None


def usage(argv, names, optional=0):
    """checks the argument count; returns the paths, resolved (readlink -f)"""
    n = len(argv) - 1
    if not len(names) - optional <= n <= len(names):
        print(f"usage: {argv[0]} {' '.join(names)}", file=sys.stderr)
        sys.exit(2)
    return [os.path.realpath(p) for p in argv[1:]] + [None] * (len(names) - n)


# ----------------------------------------------------------------------------
# the suite: checks, runs and the result line


class Suite:
    def __init__(self, name, tester, run_limit):
        """makes the scratch directory (removed at exit) and the fixtures"""
        self.npass = self.nfail = self.nskip = 0
        self.start = time.monotonic()
        self.run_limit = run_limit  # seconds for any one run: no check can hang
        # the fixture model is tiny: one thread is fastest, and on a busy machine two OpenMP
        # threads that wait for each other make a step ten times slower
        os.environ["OMP_NUM_THREADS"] = "1"
        self.root = tempfile.mkdtemp(prefix=f"{name}_")
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that atexit runs
        self.fix = self.path("fixtures")
        self.logs = self.path("logs")  # outside the snapshot: run logs
        os.makedirs(self.logs)
        r = self.run([tester, "--write-fixtures", self.fix])
        if r.rc != 0:
            self.fail("fixtures", f"{tester} --write-fixtures {self.fix} failed: {r.err[:300]}")
            self.finish()
        self.ok("fixtures: written by test_gpt --write-fixtures")

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    # --- results

    def ok(self, name):
        print(f"ok   {name}", flush=True)
        self.npass += 1
        return True

    def fail(self, name, detail):
        print(f"FAIL {name}: {detail}", flush=True)
        self.nfail += 1
        return False

    def check(self, name, ok, detail):
        """passes if OK, else prints DETAIL; returns OK"""
        return self.ok(name) if ok else self.fail(name, detail)

    def skip(self, name, reason):
        """a part of the suite that cannot run here: counted, and shown in the result line"""
        print(f"skipped: {name} ({reason})", flush=True)
        self.nskip += 1

    def finish(self):
        """the time taken and the result line; exits 1 if any check failed"""
        print(f"({time.monotonic() - self.start:.1f} s)")
        line = f"{self.npass} passed, {self.nfail} failed"
        print(line + (f", {self.nskip} skipped" if self.nskip else ""), flush=True)
        sys.exit(1 if self.nfail else 0)

    # --- runs

    def run(self, cmd, env=None, cwd=None):
        """runs CMD (in the folder CWD, default this one) under the time limit (the whole process
        group is killed at the limit)"""
        full_env = dict(os.environ, **(env or {}))
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 errors="replace", env=full_env, start_new_session=True, cwd=cwd)
        except OSError as e:  # no such program: what a shell would report
            return Result(127, "", f"cannot run {cmd[0]}: {e}", False)
        timed_out = False
        try:
            out, err = p.communicate(timeout=self.run_limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(p)
            out, err = p.communicate()
        finally:
            kill_group(p)  # only if this harness itself was interrupted
        return Result(p.returncode, out, err, timed_out)

    def snapshot(self):
        """a checksum for every file under the scratch directory but the logs and log.jsonl"""
        sums = {}
        for dirpath, _, files in os.walk(self.root):
            if dirpath == self.logs or dirpath.startswith(self.logs + os.sep):
                continue
            for f in files:
                if f != "log.jsonl":
                    sums[os.path.join(dirpath, f)] = sha256(os.path.join(dirpath, f))
        return sums

    def tmp_files(self):
        """leftovers of an atomic write that did not finish"""
        found = glob.glob(os.path.join(self.root, "**", "*.tmp"), recursive=True)
        return [p for p in found if not p.startswith(self.logs + os.sep)]

    def expect_fail(self, name, phrase, cmd, env=None):
        """CMD (with ENV added to the environment) must fail cleanly, saying PHRASE (see the top);
        returns the run"""
        before = self.snapshot()
        r = self.run(cmd, env=env)
        after = self.snapshot()
        changed = sorted(p for p, s in before.items() if after.get(p) != s)
        leftover = self.tmp_files()
        if r.rc == 0:
            self.fail(name, "exit code 0, expected an error")
        elif r.crashed():
            self.fail(name, f"exit code {r.rc}: timed out or killed by a signal (crash?)")
        elif phrase not in r.err:
            self.fail(name, f"stderr lacks '{phrase}': {r.err[:300]}")
        elif not FAIL_LOCATION_RE.search(r.err):
            self.fail(name, "stderr lacks the (at file:line) of fail()")
        elif leftover:
            self.fail(name, f"left temporary files: {' '.join(leftover)}")
        elif changed:
            self.fail(name, f"changed or removed existing files: {' '.join(changed)}")
        else:
            self.ok(name)
        return r

    def expect_script_error(self, name, phrases, cmd, leftovers):
        """a script's run CMD must fail with every one of PHRASES on stderr, no Python traceback,
        and leftovers() (what it must not leave behind, a list) empty after it"""
        r = self.run(cmd)
        left = leftovers()
        missing = [p for p in phrases if p not in r.err]
        if r.rc == 0:
            self.fail(name, "exit code 0, expected an error")
        elif r.crashed() or "Traceback" in r.err:
            self.fail(name, f"exit code {r.rc}, crashed: {r.err[-300:]}")
        elif missing:
            self.fail(name, f"stderr lacks {missing}: {r.err[:400]}")
        elif left:
            self.fail(name, f"left {left}")
        else:
            self.ok(name)

    def expect_ok(self, name, cmd, env=None, cwd=None):
        """CMD must exit 0 and leave no *.tmp; returns the run, or None if it failed"""
        r = self.run(cmd, env, cwd)
        leftover = self.tmp_files()
        if r.rc != 0:
            self.fail(name, f"exit code {r.rc}: {r.err[:300]}")
            return None
        if leftover:
            self.fail(name, f"left temporary files: {' '.join(leftover)}")
            return None
        self.ok(name)
        return r

    def check_memory(self, name, run_dir):
        """the memory record of RUN_DIR/log.jsonl: every measured byte count equals the planned"""
        try:
            rec = memory_record(run_dir)
            bad = [f"{k} planned {rec['planned'][k]} measured {rec['measured'][k]}"
                   for k in MEMORY_KEYS if rec["planned"][k] != rec["measured"][k]]
        except (OSError, ValueError, KeyError) as e:
            return self.fail(name, f"no memory record: {e!r}")
        return self.check(name, not bad, "; ".join(bad))

    def signal_check(self, sig, run_dir, steps, cmd):
        """runs CMD -o RUN_DIR (STEPS steps) and sends SIG (INT, TERM, USR1) to it after its
        first step line; the run must finish its step, write a complete checkpoint, say so and
        exit 0, and CMD -o RUN_DIR -y 1 must then resume there and run to the end"""
        out_path, err_path = os.path.join(self.logs, "signal.stdout"), os.path.join(self.logs, "signal.stderr")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            p = subprocess.Popen(cmd + ["-o", run_dir], stdout=out, stderr=err, start_new_session=True)
        try:
            for _ in range(400):  # up to 20 s for the first step line
                with open(out_path, errors="replace") as f:
                    if STEP_LINE_RE.search(f.read()) or p.poll() is not None:
                        break
                time.sleep(0.05)
            if p.poll() is None:
                p.send_signal(getattr(signal, f"SIG{sig}"))
            try:
                rc = p.wait(timeout=20)
            except subprocess.TimeoutExpired:  # it hung: the check fails on its exit code
                kill_group(p)
                rc = p.wait()
        finally:
            kill_group(p)
        with open(out_path, errors="replace") as f:
            out = f.read()
        with open(err_path, errors="replace") as f:
            err = f.read()
        n = latest_done(run_dir)
        if not self.check(f"signal: {sig} exits 0", rc == 0, f"exit code {rc}: {err[:300]}"):
            return
        self.check(f"signal: {sig} says 'stopped by signal'", f"stopped by signal after step {n};" in out,
                   "no such line")
        name = f"signal: {sig} leaves a complete checkpoint mid-run"
        if not 0 < n < steps:
            self.fail(name, f"latest DONE step {n} (want 0 < n < {steps})")
            return
        self.check(name, os.path.isfile(ckpt(run_dir, "model", n, ".bin"))
                   and os.path.isfile(ckpt(run_dir, "state", n, "_00000.bin")) and not self.tmp_files(),
                   f"step {n} lacks model or state file")
        r = self.expect_ok(f"signal: {sig} then -y 1 runs to the end", cmd + ["-o", run_dir, "-y", "1"])
        if r:
            self.check(f"signal: {sig} resume starts at step {n}",
                       re.search(rf"^resumed from .* at step {n}$", r.out, re.M),
                       f"no 'resumed from ... at step {n}'")
            self.check(f"signal: {sig} resume ends with checkpoint {steps}",
                       os.path.isfile(ckpt(run_dir, "DONE", steps)), f"no DONE marker of step {steps}")
            steps_logged = [s for s, *_ in train_rows(run_dir)]
            self.check(f"signal: {sig} log.jsonl holds steps 1..{steps} once",
                       steps_logged == list(range(1, steps + 1)),
                       f"steps logged: {steps_logged[:3]} ... {steps_logged[-3:]} ({len(steps_logged)})")


def kill_group(p):
    """SIGKILL to P's process group (mpirun and its ranks too), if P still runs"""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
