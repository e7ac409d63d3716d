"""test_golden.py: fixed runs write bit for bit the checkpoints that the code wrote before it was
restructured (issue 8), and that later changes are held to: the sha256 of the model and of every
rank's state file after 5 steps, for four runs listed with their flags in
tests/golden_checkpoints.json (plain AdamW; CAME with --recompute sqrt; Adafactor with recompute
and offload; Adafactor under mpirun -np 2 --zero 1).

    python3 tests/test_golden.py ./train_gpt ./test_gpt [./build/train_gpt_nompi]

The runs use `-e tiny` (L=2 C=64 with GPT-2's vocabulary, initialised from the seed) on test_gpt's
fixture shards (their tokens are < 64, so valid) and take about a second each. The one-rank runs are
repeated with the build without MPI (when given) and one with two OpenMP threads: the bytes must not
depend on either. Without mpirun (or with a train_gpt built without MPI) the 2-rank run is skipped
and counted: "N passed, N failed, 1 skipped".

A state file holds its run's identity (slots 18-19 of its header: 64 random bits drawn when the run
starts, the same in every file of one run), which no two runs share: its sha256 is taken with those
two slots zeroed, and the identity is checked to be nonzero and one per run.

Tolerances: none. A checkpoint holds the weights, the optimizer state, the data position and the
RNG; a different bit anywhere means the arithmetic, its order or the file layout changed. If that
was deliberate (new numerics), re-record the hashes in tests/golden_checkpoints.json (a failing
check prints the new one) and say in the commit message what changed and why.
"""

import glob
import hashlib
import json
import os
import shlex
import sys

import e2e
from e2e import STATE_CHECKSUM, STATE_RUN_ID

TRAIN, TESTER, NOMPI = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/train_gpt_nompi"], optional=1)
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden_checkpoints.json")
with open(GOLDEN) as f:
    golden = json.load(f)
s = e2e.Suite("test_golden", tester=TESTER, run_limit=60)
mpirun, why_not = e2e.mpi_launcher(TRAIN)




def checkpoint_sha256(path):
    """sha256 of a checkpoint file; a state file's with its run identity zeroed"""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if os.path.basename(path).startswith("state_"):
        data[STATE_RUN_ID] = bytes(8)
        data[STATE_CHECKSUM] = bytes(4)  # (the checksum covers the identity)
    return hashlib.sha256(data).hexdigest()


def run_ids(out):
    """the run identities of OUT's state files"""
    ids = set()
    for path in glob.glob(os.path.join(out, "state_*.bin")):
        with open(path, "rb") as f:
            ids.add(f.read(1024)[STATE_RUN_ID])
    return ids


def golden_run(name, run, launcher, train, env=None):
    """trains RUN's flags into a fresh directory; checks every file's sha256 against RUN's"""
    out = s.path(name.replace(" ", "_").replace(",", ""))
    flags = [a.replace("{FIX}", s.fix) for a in golden["common_flags"] + run["flags"]]
    if not s.expect_ok(f"{name}: 5 steps", launcher + [train] + flags + ["-o", out], env):
        return
    ids = run_ids(out)
    s.check(f"{name}: one nonzero run identity in its state files", len(ids) == 1 and bytes(8) not in ids,
            f"identities: {[i.hex() for i in ids]}")
    for file, want in run["sha256"].items():
        path = os.path.join(out, file)
        got = checkpoint_sha256(path) if os.path.isfile(path) else "(no such file)"
        when = golden["state_recorded_at"] if file.startswith("state_") else golden["recorded_at"]
        s.check(f"{name}: {file} as recorded at {when}", got == want,
                f"{file} differs from the recorded checkpoint\n"
                f"    expected sha256 {want}\n"
                f"    got             {got}\n"
                f"    run: {shlex.join(launcher + [train] + flags + ['-o', out])}\n"
                f"  The trainer no longer writes what it wrote at {when}. If the numerics (or the\n"
                f"  file layout) changed on purpose, re-record the hashes in tests/golden_checkpoints.json and say\n"
                f"  in the commit message what changed and why; otherwise this change broke bitwise reproducibility.")


for run in golden["runs"]:
    if run["ranks"] == 1:
        golden_run(run["name"], run, [], TRAIN)
        if NOMPI:
            golden_run(f"{run['name']}, build without MPI", run, [], NOMPI)
    elif mpirun:
        golden_run(f"{run['name']}", run, mpirun + [str(run["ranks"])], TRAIN)
    else:
        s.skip(f"{run['name']}: mpirun -np {run['ranks']}", why_not)
first = golden["runs"][0]
golden_run(f"{first['name']}, OMP_NUM_THREADS=2", first, [], TRAIN, env={"OMP_NUM_THREADS": "2"})

s.finish()
