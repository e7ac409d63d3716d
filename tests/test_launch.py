"""test_launch.py: the CUDA trainer started as clusters start it, without MPI (issue 24), on the
emulated device, whose NCCL then carries its collectives over loopback sockets:
  - the place of each process from torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK) or slurm's
    (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID), printed in the configuration table; partly
    set, contradicting or impossible variables stop, naming them; sbatch's one shell is one process;
  - NCCL's id handed over by --dist-init file:DIR (stale files of a killed run in the folder are not
    taken) and tcp:127.0.0.1:PORT (which needs the job's secret, LLMC_DIST_SECRET: launch_local.sh
    makes one; a port outside 1..65535 is refused); a rank whose partner never comes stops after
    LLMC_DIST_TIMEOUT, naming it (the hostile peers: tests/test_rendezvous.py);
  - 2 and 3 processes started by scripts/launch_local.sh (torchrun-style and --slurm, each init
    method, the build without MPI and the MPI build alike) train the bitwise same losses, gradient
    norms and model as `mpirun -np N` of the MPI build; --zero 1 and --offload optimizer too (their
    host sums go over NCCL; 3 ranks' host sums of floats within DP_RTOL: MPI adds in its own order);
  - kill -9 of one rank mid-run: the others stop within DEAD_RANK_LIMIT_S seconds, the emulated NCCL
    naming the rank they lost and the trainer's watchdog (ncclCommGetAsyncError) stopping them, and the
    last complete checkpoint resumes;
  - the CPU trainer, which has no NCCL, stops under such variables, naming why.

    python3 tests/test_launch.py ./build/emu/train_gpt ./build/emu_nompi/train_gpt ./train_gpt ./build/train_gpt_nompi ./test_gpt
"""

import os
import signal
import socket
import subprocess
import sys
import time

import e2e
from e2e import ckpt, same_bytes, train_rows

EMU, EMU_NOMPI, CPU, CPU_NOMPI, TESTER = e2e.usage(
    sys.argv, ["./build/emu/train_gpt", "./build/emu_nompi/train_gpt", "./train_gpt", "./build/train_gpt_nompi", "./test_gpt"])
s = e2e.Suite("test_launch", tester=TESTER, run_limit=300)
FIX, W = s.fix, s.root
LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "launch_local.sh")
TRAIN = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
         "-x", "4", "-n", "2", "--precision", "fp32"]
TORCH = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
SLURM = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0"}
DEAD_RANK_LIMIT_S = 5   # the survivors of a kill -9 stop within this (the socket closes at once; the watchdog looks every 0.2 s)
os.environ["LLMC_DIST_TIMEOUT"] = "60"   # a rendezvous that fails in a check below fails fast
os.environ["CUDA_EMU_NCCL_TIMEOUT"] = "120"
os.environ.pop("LLMC_DIST_SECRET", None)   # launch_local.sh makes one; the runs started here pass SECRET
os.environ.pop("LLMC_DIST_SECRET_FILE", None)
SECRET = {"LLMC_DIST_SECRET": "test-launch-secret-0123"}


def free_port():
    with socket.socket() as k:
        k.bind(("127.0.0.1", 0))
        return k.getsockname()[1]


def meet(kind, name):
    """a --dist-init value of KIND (file or tcp), fresh for the run NAME"""
    if kind == "file":
        d = s.path(f"meet_{name}")
        os.makedirs(d, exist_ok=True)
        return f"file:{d}"
    return f"tcp:127.0.0.1:{free_port()}"


def same_run(name, got, want):
    """GOT's losses, gradient norms and final model are WANT's, bit for bit"""
    a, b = train_rows(got), train_rows(want)
    s.check(f"{name}: every step's loss and gradient norm equal the mpirun run's", a == b and len(a) == 4,
            f"{a} vs {b}")
    s.check(f"{name}: the same model as the mpirun run, bit for bit", same_bytes(ckpt(got, "model", 4, ".bin"), ckpt(want, "model", 4, ".bin")),
            "models differ")


# ----------------------------------------------------------------------------
# where a process learns its place: the variables, checked before anything else

ONE = TRAIN + ["-x", "1", "-o", ""]
for env, phrase, what in (
        ({"RANK": "1"}, "but WORLD_SIZE, LOCAL_RANK is not set", "RANK alone"),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "but RANK is not set", "WORLD_SIZE and LOCAL_RANK without RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "the rank must be below the number of processes", "RANK=WORLD_SIZE"),
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK=x: not a number", "RANK=x"),
        ({"SLURM_PROCID": "1"}, "SLURM_PROCID=1 without SLURM_STEP_NUM_TASKS", "SLURM_PROCID=1 alone"),
        ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}, "but SLURM_LOCALID is not set", "srun's variables without SLURM_LOCALID"),
        (dict(TORCH, SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="2", SLURM_LOCALID="1"), "the launchers' variables disagree",
         "RANK=0 but SLURM_PROCID=1 of as many"),
        (dict(TORCH, OMPI_COMM_WORLD_SIZE="3"), "the launchers' variables disagree", "WORLD_SIZE=2 under mpirun -np 3"),
        (TORCH, "--dist-init is needed", "torchrun-style variables without --dist-init")):
    s.expect_fail(f"without MPI, {what}: stops, naming the variables", phrase, [EMU_NOMPI] + ONE, env=env)
# torchrun started by srun with a PMI (one per machine): srun's PMIX_RANK counts machines, not ranks
s.expect_fail("torchrun-style WORLD_SIZE=4 under srun's PMIX_RANK=1: taken (it stops only for want of --dist-init)",
              "--dist-init is needed", [EMU_NOMPI] + ONE, env=dict(TORCH, WORLD_SIZE="4", PMIX_RANK="1"))
s.expect_fail("--dist-init with one process: refused (it would do nothing)", "which needs no meeting",
              [EMU_NOMPI] + ONE + ["--dist-init", "tcp:127.0.0.1:1"])
s.expect_fail("--dist-init of an unknown kind: refused, naming the two", "unknown; choose file:DIR",
              [EMU_NOMPI] + ONE + ["--dist-init", "nfs:/x"], env=TORCH)
s.expect_fail("--dist-init file: of a folder that does not exist", "no such folder",
              [EMU_NOMPI] + ONE + ["--dist-init", f"file:{s.path('nowhere')}"], env=TORCH)
# sbatch's (and salloc's) one shell: SLURM_NTASKS of the job, SLURM_PROCID=0, no step: one process
r = s.expect_ok("sbatch's shell (SLURM_NTASKS=4, SLURM_PROCID=0, no step count): one process trains",
                [EMU_NOMPI] + ONE, env={"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
if r:
    s.check("the configuration table says: 1 rank from one process", "| data parallel         | 1 rank(s) from one process" in r.out, r.out[:1500])
# the CPU trainer has no NCCL: such processes stop, saying why
s.expect_fail("the CPU trainer without MPI under srun's variables: stops", "built without MPI: each would train alone",
              [CPU_NOMPI] + ONE, env=dict(SLURM, SLURM_PROCID="1", SLURM_LOCALID="1"))
MPIRUN, why_not = e2e.mpi_launcher(EMU)
if MPIRUN is not None:
    s.expect_fail("the CPU trainer with MPI under torchrun-style variables: stops", "more processes than the 1 that MPI joined",
                  [CPU] + ONE, env=TORCH)

# a rank whose partner never comes says whom it waits for and stops
quick = {"LLMC_DIST_TIMEOUT": "3"}
s.expect_fail("file: rank 1 alone: stops after LLMC_DIST_TIMEOUT, waiting for rank 0", "rank 1 waited 3 s for rank 0",
              [EMU_NOMPI] + ONE + ["--dist-init", meet("file", "alone1")], env=dict(TORCH, RANK="1", LOCAL_RANK="1", **quick))
s.expect_fail("file: rank 0 of 3 alone: stops, naming ranks 1 and 2", "rank 0 waited 3 s for rank(s) 1, 2 of 3",
              [EMU_NOMPI] + ONE + ["--dist-init", meet("file", "alone0")], env=dict(TORCH, WORLD_SIZE="3", **quick))
s.expect_fail("tcp: rank 0 alone: stops, naming rank 1", "rank 0 waited 3 s for rank(s) 1 of 2 to arrive",
              [EMU_NOMPI] + ONE + ["--dist-init", meet("tcp", "alone")], env=dict(TORCH, **quick, **SECRET))
s.expect_fail("tcp: rank 1 alone: stops, waiting for rank 0", "rank 1 waited 3 s for rank 0 to listen",
              [EMU_NOMPI] + ONE + ["--dist-init", meet("tcp", "alone")], env=dict(TORCH, RANK="1", LOCAL_RANK="1", **quick, **SECRET))
s.expect_fail("tcp: without the job's secret: stops at once, showing how to make one", "head -c 16 /dev/urandom",
              [EMU_NOMPI] + ONE + ["--dist-init", meet("tcp", "nosecret")], env=TORCH)
s.expect_fail("tcp: port 99999: refused (not 1..65535)", "port '99999' is not a number in 1..65535",
              [EMU_NOMPI] + ONE + ["--dist-init", "tcp:127.0.0.1:99999"], env=dict(TORCH, **SECRET))

# ----------------------------------------------------------------------------
# 2 and 3 processes: the mpirun run's losses, bit for bit

if MPIRUN is None:
    s.skip("the runs against mpirun (2 and 3 ranks)", why_not)
    s.finish()

for n in (2, 3):
    want = s.path(f"mpirun{n}")
    if not s.expect_ok(f"mpirun -np {n} (the MPI build): the reference", MPIRUN + [str(n), EMU] + TRAIN + ["-o", want]):
        continue
    runs = [("torchrun-style", "file", EMU_NOMPI), ("slurm", "tcp", EMU_NOMPI)]
    if n == 2:
        runs += [("torchrun-style", "tcp", EMU_NOMPI), ("slurm", "file", EMU_NOMPI), ("torchrun-style", "file", EMU)]
    for launcher, kind, prog in runs:
        build = "the MPI build" if prog == EMU else "without MPI"
        name = f"{n} ranks, {launcher}, --dist-init {kind}, {build}"
        d = s.path(f"run{n}_{launcher[:5]}_{kind}_{os.path.basename(os.path.dirname(prog))}")
        stale = []
        if kind == "file" and n == 2 and launcher == "slurm":
            # the files of an earlier run that died in the folder (srun's job key is that of no launch here:
            # 0): a secret, a request, an answer and an acknowledgement, and the old protocol's; none is taken
            m = meet("file", "stale")
            job0 = "llmc_dist.0000000000000000"
            for f, data in ((f"{job0}.secret", b"s" * 32), (f"{job0}.hello.1.{'ab' * 16}", os.urandom(84)),
                            (f"{job0}.answer.{'cd' * 16}", os.urandom(216)), (f"{job0}.ack.{'ef' * 16}", os.urandom(48)),
                            ("llmc_dist.want.1", (12345).to_bytes(8, "little")), ("llmc_dist.id.3039", bytes(128))):
                with open(os.path.join(m[5:], f), "wb") as out:
                    out.write(data)
                os.chmod(os.path.join(m[5:], f), 0o600)
                stale.append(f)
            name += " (stale files of a killed run in the folder)"
        else:
            m = meet(kind, f"{n}_{launcher[:5]}_{kind}")
        cmd = ["bash", LAUNCH] + (["--slurm"] if launcher == "slurm" else []) + [str(n), prog] + TRAIN + ["--dist-init", m, "-o", d]
        r = s.expect_ok(name, cmd)
        if r is None:
            continue
        source = "torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK)" if launcher != "slurm" else "slurm (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID)"
        s.check(f"{name}: the configuration table says where the ranks came from", f"{n} rank(s) from {source}" in r.out, r.out[:1500])
        same_run(name, d, want)
        if kind == "file":
            # rank 0 claims (and removes) the stale request; the rest is left as it was
            left = sorted(os.listdir(m[5:]))
            want_left = sorted(f for f in stale if ".hello." not in f)
            s.check(f"{name}: the folder is left as it was found", left == want_left, f"{left} vs {want_left}")

# the host's sums over NCCL: ZeRO-1 (its all-gathers on the device) and the optimizer step on the
# host (--offload optimizer: the gradients summed and sharded on the host). Bitwise where the sums
# are the same: 2 ranks (a + b = b + a), and on the device; 3 ranks' host sums of floats over MPI
# follow MPI's order, which need not be rank order (NCCL's emulation): the model within DP_RTOL
DP_RTOL = 1e-6
for n, extra, bitwise in ((3, ["--zero", "1"], True), (2, ["--offload", "optimizer"], True),
                          (2, ["--offload", "optimizer", "--zero", "1"], True), (3, ["--offload", "optimizer", "--zero", "1"], False)):
    what = " ".join(extra)
    want = s.path(f"mpirun{n}_{what.replace(' ', '_')}")
    if not s.expect_ok(f"mpirun -np {n} {what}: the reference", MPIRUN + [str(n), EMU] + TRAIN + extra + ["-o", want]):
        continue
    d = s.path(f"torch{n}_{what.replace(' ', '_')}")
    name = f"{n} ranks, torchrun-style, without MPI, {what}"
    if not s.expect_ok(name, ["bash", LAUNCH, str(n), EMU_NOMPI] + TRAIN + extra + ["--dist-init", meet("tcp", "z"), "-o", d]):
        continue
    if bitwise:
        same_run(name, d, want)
        continue
    a, b = train_rows(d), train_rows(want)
    s.check(f"{name}: every step's loss within {DP_RTOL:g} of the mpirun run's", len(a) == len(b) == 4 and
            all(abs(x[1] - y[1]) <= DP_RTOL * abs(y[1]) for x, y in zip(a, b)), f"{a} vs {b}")
    r = s.run([TESTER, "--compare-models", ckpt(d, "model", 4, ".bin"), ckpt(want, "model", 4, ".bin"), str(DP_RTOL)])
    s.check(f"{name}: the model within {DP_RTOL:g} of the mpirun run's", r.rc == 0, (r.out + r.err).strip()[:300])

# ----------------------------------------------------------------------------
# a rank killed mid-run: the others stop, naming it, and the last checkpoint resumes

d = s.path("dead")
m = meet("tcp", "dead")
LONG = TRAIN + ["-x", "200", "-n", "1", "--dist-init", m, "-o", d]
procs = []
for r in range(3):
    env = dict(os.environ, RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), **SECRET)
    procs.append(subprocess.Popen([EMU_NOMPI] + LONG, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True))
t0 = time.monotonic()
while e2e.latest_done(d) < 2 and time.monotonic() - t0 < 240 and all(p.poll() is None for p in procs):
    time.sleep(0.2)
if e2e.latest_done(d) < 2:
    s.fail("kill -9 mid-run", f"the run did not reach its step-2 checkpoint: {[p.poll() for p in procs]}")
    for p in procs:
        e2e.kill_group(p)
else:
    os.kill(procs[2].pid, signal.SIGKILL)
    killed = time.monotonic()
    errs, late = [], []
    for r in (0, 1):
        try:
            _, err = procs[r].communicate(timeout=DEAD_RANK_LIMIT_S)
        except subprocess.TimeoutExpired:
            late.append(r)
            e2e.kill_group(procs[r])
            _, err = procs[r].communicate()
        errs.append(err)
    procs[2].wait()
    s.check(f"kill -9 of rank 2: ranks 0 and 1 stop within {DEAD_RANK_LIMIT_S} s", not late,
            f"still running after {DEAD_RANK_LIMIT_S} s: ranks {late}")
    # the emulated NCCL names the rank (as NCCL_DEBUG=WARN does) and answers ncclRemoteError, which the
    # trainer's watchdog (cuda/nccl.cuh) polls: it stops the rank, not the emulator's fallback
    s.check("kill -9 of rank 2: both stop, the emulated NCCL naming the rank they lost, the trainer's watchdog stopping them",
            all(p.returncode not in (0, None) for p in procs[:2]) and all("lost rank 2 of 3" in e and "NCCL reports" in e for e in errs)
            and not any("did not stop in" in e for e in errs), " | ".join(e[-400:] for e in errs))
    print(f"  (the survivors stopped {time.monotonic() - killed:.1f} s after the kill)")
    last = e2e.latest_done(d)
    s.expect_ok(f"the last complete checkpoint (step {last}) resumes on 3 ranks",
                ["bash", LAUNCH, "3", EMU_NOMPI] + TRAIN + ["-x", str(last + 1), "-n", "1", "-y", "1", "--dist-init", meet("tcp", "resume"), "-o", d])

s.finish()
