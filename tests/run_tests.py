"""run_tests.py: runs every test suite of the project and adds up their results (`make test`).

    python3 tests/run_tests.py          (from anywhere; the binaries must be built: make test does)

Each suite's output is shown as it runs; the suites that mostly wait (BESIDE) run in a second
lane beside the others, each one's output shown whole when it ends. A suite ends with a result line "N passed, N failed"
(", N skipped" when part of it could not run here) and exits non-zero on failure; its last such
line is counted. A suite that dies without that line counts as one failure, and so does a suite
that exits non-zero with 0 failed. A suite that prints lines starting with "skipped:" (the
emulator's run_tests.sh when mpirun is missing) has at least that many skipped. Every skipped part
is listed in a "skipped:" line before the total, and a suite that cannot run at all is counted
skipped with its reason. The last line is the total: "N passed, N failed", with ", N skipped"
when anything was skipped; the exit status is 1 if anything failed.
"""

import os
import re
import subprocess
import sys
import threading
import time

RESULT_RE = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?")
PY = sys.executable
EMU_TESTS = "dev/cuda_emu/run_tests.sh"

SUITES = [  # name, command, and for an optional suite the file without which it is skipped
    ("CPU trainer (test_gpt.c)", ["./test_gpt", "./train_gpt"], None),
    ("matmul", ["./build/test_matmul"], None),
    ("optimizer state in 8 bits and bf16 (llmc/quant_state.h, cpu/optimizers_lowp.h)", ["./build/test_quant_state"], None),
    ("pipeline schedules, 1F1B and GPipe (llmc/pipeline.h, llmc/pipeline_sim.h)", ["./build/test_pipeline"], None),
    ("CLI and files", [PY, "tests/test_cli.py", "./train_gpt", "./test_gpt"], None),
    ("data parallel (MPI, --zero)",
     [PY, "tests/test_zero.py", "./train_gpt", "./test_gpt", "./build/train_gpt_nompi"], None),
    ("tensor parallelism (MPI, --tp)",
     [PY, "tests/test_tensor_parallel.py", "./train_gpt", "./test_gpt", "./build/emu/train_gpt"], None),
    ("pipeline parallelism (MPI, --pp)",
     [PY, "tests/test_pipeline_parallel.py", "./train_gpt", "./test_gpt", "./build/emu/train_gpt"], None),
    ("resume onto another layout (MPI, -y 1 across --tp, --pp and --zero)",
     [PY, "tests/test_relayout.py", "./train_gpt", "./test_gpt", "./build/emu/train_gpt"], None),
    ("checkpoints of several ranks: kill -9 mid-write, damaged files (MPI)",
     [PY, "tests/test_checkpoint_ranks.py", "./train_gpt", "./test_gpt", "./build/fault_inject.so", "./build/emu/train_gpt"], None),
    ("memory flags, every combination", [PY, "tests/test_matrix.py", "./train_gpt", "./test_gpt"], None),
    ("memory budgets (--plan --max-memory)",
     [PY, "tests/test_plan_budget.py", "./train_gpt", "./test_gpt", "./build/emu/train_gpt"], None),
    ("optimizer state in bf16 and 8 bits, end to end (--optimizer-state)",
     [PY, "tests/test_optimizer_state.py", "./train_gpt", "./test_gpt", "./build/emu/train_gpt"], None),
    ("golden checkpoints", [PY, "tests/test_golden.py", "./train_gpt", "./test_gpt", "./build/train_gpt_nompi"], None),
    # 2,800 cases a target: ten targets in about the time seven took at 4,000 (make bench-fuzz: 100,000 each)
    ("fuzzer of the readers and flags (ASan+UBSan)", ["./build/fuzz", "./test_gpt", "2800"], None),
    # one OpenMP thread: two spinning threads under ASan on a busy two-core machine take minutes
    # (the thread-count checks still run 1 and 3 threads)
    ("CPU trainer under ASan+UBSan (test_gpt.c)", ["env", "OMP_NUM_THREADS=1", "./build/test_gpt_asan"], None),
    ("GPT-2 BPE data prep", [PY, "dev/data/test_gpt2_bpe.py"], None),
    ("GPT-2 BPE in C (llmc/bpe.h) against python and tiktoken", [PY, "tests/test_bpe.py", "./test_gpt"], None),
    ("text into token shards (build/prepare_tokens)",
     [PY, "tests/test_prepare.py", "./build/prepare_tokens", "./test_gpt", "./train_gpt", "./build/prepare_tokens_asan"], None),
    ("Hugging Face GPT-2 converter", [PY, "tests/test_convert.py", "./train_gpt", "./test_gpt"], None),
    ("Hugging Face GPT-2 export", [PY, "tests/test_export.py", "./train_gpt", "./test_gpt"], None),
    ("compare flags and plots", [PY, "tests/test_compare_flags.py", "./train_gpt", "./test_gpt"], None),
    ("README and doc/: generated parts against the program, the path through the code, links",
     [PY, "scripts/readme_gen.py", "--check"], None),
    ("emulated CUDA device", ["bash", EMU_TESTS], EMU_TESTS),
    ("CUDA trainer (emulated device) against the CPU",
     [PY, "tests/test_cuda.py", "./build/emu/train_gpt", "./train_gpt", "./test_gpt"], None),
    ("--profile: the step's time by kind of work (CPU and emulated device)",
     [PY, "tests/test_profile.py", "./train_gpt", "./build/emu/train_gpt", "./test_gpt"], None),
    ("the emulated device's timeline (CUDA_EMU_TIMELINE): bitwise the same, trace.json's streams and waits, a d12 step modelled only",
     [PY, "tests/test_timeline.py", "./build/emu/train_gpt", "./test_gpt"], None),
    ("the rendezvous of --dist-init against hostile and mistaken peers (build/rendezvous_peer)",
     [PY, "tests/test_rendezvous.py", "./build/rendezvous_peer", "./test_gpt"], None),
    ("launching without MPI: srun, torchrun-style, --dist-init (emulated device)",
     [PY, "tests/test_launch.py", "./build/emu/train_gpt", "./build/emu_nompi/train_gpt", "./train_gpt",
      "./build/train_gpt_nompi", "./test_gpt"], None),
    ("CUDA ZeRO-1, 2 and 3: a collective per layer, ZeRO-3 layer gathers prefetched, each rank offloading its shard (emulated NCCL)",
     [PY, "tests/test_zero_cuda.py", "./build/emu/train_gpt", "./train_gpt", "./test_gpt", "./build/emu_nompi/train_gpt"], None),
    ("CUDA tensor parallelism (--tp, --sp): the group's NCCL communicator, against one process and the CPU (emulated NCCL)",
     [PY, "tests/test_tensor_parallel_cuda.py", "./build/emu/train_gpt", "./train_gpt", "./test_gpt", "./build/emu_nompi/train_gpt"], None),
    ("CUDA pipeline parallelism (--pp): the stages' messages over NCCL, against one process (emulated NCCL)",
     [PY, "tests/test_pipeline_parallel_cuda.py", "./build/emu/train_gpt", "./train_gpt", "./test_gpt"], None),
    ("CUDA memory flags, every combination (emulated device)",
     [PY, "tests/test_cuda_matrix.py", "./build/emu/train_gpt", "./train_gpt", "./test_gpt"], None),
]


# The suites that leave a core idle most of the time (sockets, deadlines, watchdogs, several ranks'
# start-up and waits: on the 2-core machine the rendezvous used 4 s of CPU in 73 s, the launchers 39 s
# in 163 s, the checkpoints of several ranks 22 s in 71 s, the MPI ranks of --zero 20 s in 49 s, the
# emulated NCCL's ranks 136 s in 172 s) run one after another in a second lane beside the others,
# their output shown whole when each ends; every other suite runs alone, in order
BESIDE = ("the rendezvous of --dist-init", "launching without MPI", "checkpoints of several ranks", "data parallel (MPI",
          "CUDA ZeRO-1, 2 and 3", "tensor parallelism (MPI", "CUDA tensor parallelism", "pipeline parallelism (MPI",
          "resume onto another layout (MPI", "CUDA pipeline parallelism")


def run_suite(name, cmd, show=None):
    """runs one suite, its output to show (print as it comes, by default); returns (passed, failed,
    skipped lines)"""
    show = show or (lambda text: print(text, end="", flush=True))
    shown = [os.path.basename(a) if a == PY else a for a in cmd]
    show(f"=== {name}: {' '.join(shown)}\n")
    start = time.monotonic()
    lines = []
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as e:
        show(f"=== {name}: cannot start ({e}): counted as 1 failure\n")
        return 0, 1, []
    for line in p.stdout:
        show(line)
        lines.append(line.rstrip("\n"))
    rc = p.wait()
    results = [m for m in map(RESULT_RE.match, lines) if m]
    skipped = [f"skipped: {name}: {line[len('skipped:'):].strip()}" for line in lines if line.startswith("skipped:")]
    if not results:
        show(f"=== {name}: no result line (exit code {rc}): counted as 1 failure\n")
        return 0, 1, skipped
    npass, nfail, nskip = (int(g or 0) for g in results[-1].groups())
    if rc != 0 and nfail == 0:
        show(f"=== {name}: exit code {rc} with 0 failed: counted as 1 failure\n")
        nfail = 1
    # a count in the result line without as many "skipped:" lines: the rest, unnamed
    skipped += [f"skipped: {name}: (counted in its result line)"] * (nskip - len(skipped))
    show(f"=== {name}: {time.monotonic() - start:.1f} s\n")
    return npass, nfail, skipped


def locked_print(lock, text):
    with lock:
        print(text, end="", flush=True)


def run_beside(suites, results, lock):
    """the second lane: each suite's output held, then printed whole (under lock) when it ends"""
    for name, cmd in suites:
        held = []
        try:
            r = run_suite(name, cmd, held.append)
        except Exception as e:  # noqa: BLE001 (a lane that dies must still count)
            held.append(f"=== {name}: the second lane failed ({e}): counted as 1 failure\n")
            r = (0, 1, [])
        with lock:
            print("".join(held), end="", flush=True)
        results.append(r)


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    total_pass = total_fail = 0
    skipped = []
    beside, alone = [], []
    for name, cmd, needs in SUITES:
        if needs and not os.path.isfile(needs):
            skipped.append(f"skipped: {name}: {needs} not found")
        elif name.startswith(BESIDE):
            beside.append((name, cmd))
        else:
            alone.append((name, cmd))
    lock, beside_results = threading.Lock(), []
    lane = threading.Thread(target=run_beside, args=(beside, beside_results, lock))
    lane.start()
    for name, cmd in alone:  # streamed line by line; the lane's whole blocks come between lines
        p, f, s = run_suite(name, cmd, lambda text: locked_print(lock, text))
        total_pass, total_fail, skipped = total_pass + p, total_fail + f, skipped + s
    lane.join()
    for p, f, s in beside_results:
        total_pass, total_fail, skipped = total_pass + p, total_fail + f, skipped + s
    print()
    for line in skipped:
        print(line)
    print(f"{total_pass} passed, {total_fail} failed" + (f", {len(skipped)} skipped" if skipped else ""))
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
