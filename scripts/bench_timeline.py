"""bench_timeline.py: how much of each memory technique's copies and collectives the CUDA trainer
hides behind compute, on the emulated device's timeline of an H100 (CUDA_EMU_TIMELINE=h100,
CUDA_EMU_EXECUTE=0: modelled, not run; dev/cuda_emu/emu_timeline.cpp, doc/timeline.md). `make
bench-timeline` runs it: d12 at B=16 T=1024 and d48 at B=8 T=1024, with --offload 1 (alone and with
--recompute sqrt) and (d12) --offload optimizer on one rank and --zero 1, 2, 3 on 8 ranks (8 processes, each
modelling its GPU), step 2 profiled, and prints for each
the predicted step, tokens/s and every technique's time and exposed share (its time while the
compute stream runs no kernel). Predicted, not measured: the shares say what overlaps and what
waits; the milliseconds are estimates until a GPU measures them.

    python3 scripts/bench_timeline.py [--trainer ./build/emu/train_gpt] [--only d12] [--ranks 8]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "data", "tinyshakespeare", "tiny_shakespeare_train.bin")
MODELS = [("d12", 16), ("d48", 8)]   # (preset, B) at T=1024
T = 1024
STEP_RE = re.compile(r"^timeline \(CUDA_EMU_TIMELINE=(\S+): .*predicted step ([0-9.]+) ms(?:, ([0-9]+) tokens/s)?"
                     r"(?: a rank \(([0-9]+) for (\d+) ranks\))?", re.M)
ROW_RE = re.compile(r"^  \| (offload|exchange|optimizer_host) +\| +([0-9.]+) \| +([0-9.]+) \|", re.M)
BLOCKED_RE = re.compile(r"^error: (this run needs .* is available|--offload 1: the host store .* is available)", re.M)


def mpirun(ranks):
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def run(trainer, preset, b, flags, ranks, limit):
    """one modelled run; (parsed report, wall seconds) or (None, why)"""
    cmd = [trainer, "-e", preset, "-i", DATA, "-j", "", "-k", "", "-b", str(b), "-t", str(T), "-x", "2", "-v", "0",
           "-s", "0", "--profile", "2", "-o", "", *flags]
    if ranks > 1:
        cmd = mpirun(ranks) + cmd
    env = dict(os.environ, CUDA_EMU_TIMELINE="h100", CUDA_EMU_EXECUTE="0", OMP_NUM_THREADS="1")
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"over {limit} s"
    wall = time.monotonic() - start
    out = p.stdout + p.stderr
    blocked = BLOCKED_RE.search(out)
    if blocked:
        return None, (f"the trainer refuses: '{blocked.group(1)}' (this machine's host memory; the modelled run "
                      f"touches none of it: see doc/timeline.md, the trainer change it needs)")
    m = STEP_RE.search(out)
    if p.returncode != 0 or m is None:
        tail = " | ".join(out.strip().splitlines()[-3:])
        return None, f"exit {p.returncode}: {tail[:300]}"
    rows = {name: (float(total), float(exposed)) for name, total, exposed in ROW_RE.findall(out)}
    tokens = float(m.group(4) or m.group(3) or 0)
    return {"step_ms": float(m.group(2)), "tokens_s": tokens, "rows": rows}, wall


def share(rows, name):
    total, exposed = rows.get(name, (0.0, 0.0))
    return f"{exposed:8.2f} / {total:8.2f} ms ({100 * exposed / total:5.1f}%)" if total > 0 else f"{'-':>27}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "emu", "train_gpt"))
    ap.add_argument("--only", default="", help="d12 or d48: that model only")
    ap.add_argument("--ranks", type=int, default=8, help="ranks of the --zero runs")
    ap.add_argument("--limit", type=int, default=1800, help="seconds a run may take")
    a = ap.parse_args()
    if not os.path.isfile(DATA):
        sys.exit(f"error: {DATA} is missing\n  hint: make data")
    if shutil.which("mpirun") is None:
        print("note: no mpirun: the --zero runs on several ranks are skipped")
    print(f"predicted on the timeline of an H100 (CUDA_EMU_TIMELINE=h100, CUDA_EMU_EXECUTE=0), step 2 of 2, T={T}; "
          f"exposed / total: a technique's time while the compute stream runs no kernel")
    print(f"| {'model':<10} | {'flags':<28} | {'ranks':>5} | {'step ms':>9} | {'tokens/s':>9} | "
          f"{'offload exposed / total':>27} | {'exchange exposed / total':>27} | {'host update exposed / total':>27} | {'run s':>5} |")
    for preset, b in MODELS:
        if a.only and a.only != preset:
            continue
        configs = [(["--offload", "1"], 1), (["--offload", "1", "--recompute", "sqrt"], 1)]
        if preset == "d12":  # the host's update runs for real on host arrays (d48's: 25 GB, more than this machine has)
            configs.append((["--offload", "optimizer"], 1))
        if shutil.which("mpirun"):
            configs += [(["--zero", str(z)], a.ranks) for z in (1, 2, 3)]
        for flags, ranks in configs:
            res, wall = run(a.trainer, preset, b, flags, ranks, a.limit)
            label = f"{preset} B={b}"
            if res is None:
                print(f"| {label:<10} | {' '.join(flags):<28} | {ranks:>5} | not run: {wall}", flush=True)
                continue
            rows = res["rows"]
            print(f"| {label:<10} | {' '.join(flags):<28} | {ranks:>5} | {res['step_ms']:9.2f} | {res['tokens_s']:9.0f} | "
                  f"{share(rows, 'offload')} | {share(rows, 'exchange')} | {share(rows, 'optimizer_host')} | {wall:5.0f} |",
                  flush=True)
    print("tokens/s: all ranks'. Predicted scheduling, not kernel speed (doc/timeline.md)")


if __name__ == "__main__":
    main()
