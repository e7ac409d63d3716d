"""runlog.py: a training run's log.jsonl, read for scripts/plot_log.py and scripts/compare_flags.py.

    run = runlog.read_run("out")             # a run folder, or the log.jsonl itself
    run.label, run.steps[-1]["loss"], run.vals, run.memory["measured"]["device_total"]
    plt = runlog.pyplot()                    # matplotlib without a display, or exit with a hint

log.jsonl (written by llmc/trainer.h with -o DIR) holds one JSON object a line: each step
{"step", "loss", "grad_norm", "lr", "ms", "tokens_per_s"}, each validation {"step", "val_loss"},
and after the first step {"step", "memory": {"planned": {...}, "measured": {...}}} with bytes by
category (parameters, gradients, ..., offloaded_host, optimizer_host, host_copies) and device_total, host_total,
total. Standard library only; pyplot() imports matplotlib when a script draws.
"""

import json
import os
import sys
from collections import namedtuple

TOTALS = ("device_total", "host_total", "total")
HOST_CATEGORIES = ("offloaded_host", "optimizer_host", "host_copies")  # llmc/memory.h's mem_category_on_host
MIB = 1024.0 * 1024.0

Run = namedtuple("Run", "label path steps vals memory")


def log_path(path):
    """PATH itself if a file, else PATH/log.jsonl"""
    return os.path.join(path, "log.jsonl") if os.path.isdir(path) else path


def run_label(path):
    """the run's folder name: out/d12_sqrt/log.jsonl -> d12_sqrt"""
    folder = os.path.dirname(os.path.abspath(log_path(path)))
    return os.path.basename(folder) or folder


def read_run(path):
    """the Run of PATH (a run folder or its log.jsonl); raises OSError or ValueError with the file named"""
    p = log_path(path)
    steps, vals, memory = [], [], None
    with open(p) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{p}:{n}: not JSON ({e})")
            if "loss" in rec:
                steps.append(rec)
            elif "val_loss" in rec:
                vals.append((rec["step"], rec["val_loss"]))
            elif "memory" in rec:
                memory = rec["memory"]
    # a resumed run appends: keep the last record of each step
    steps = list({r["step"]: r for r in steps}.values())
    vals = sorted(dict(vals).items())
    return Run(run_label(path), p, steps, vals, memory)


def memory_categories(record):
    """the category keys of a memory record ({"parameters": bytes, ...}) in its order, totals aside"""
    return [k for k in record if k not in TOTALS]


def is_host(category):
    return category in HOST_CATEGORIES or category.endswith("_host") or category.startswith("host_")


def category_label(category):
    return {"optimizer_state": "optimizer state", "activation_grads": "activation grads",
            "offloaded_host": "offloaded (host)", "optimizer_host": "optimizer (host)"}.get(category, category.replace("_", " "))


def pyplot():
    """matplotlib.pyplot with the file-only backend, or exit 2 with how to install it"""
    try:
        import matplotlib
    except ImportError:
        print("error: plots need matplotlib\n  hint: python3 -m pip install matplotlib (or apt-get install "
              "python3-matplotlib for the system python)", file=sys.stderr)
        sys.exit(2)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
