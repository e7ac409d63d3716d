"""compare_flags.py: which memory flags, at what cost in speed? Trains a few steps under each of
several flag sets, then writes a markdown table and two plots from the runs' log.jsonl.

    python3 scripts/compare_flags.py                                   # tiny, B=4 T=64, 6 steps, the default sets
    python3 scripts/compare_flags.py -e d12 -x 4 --budget 2GiB
    python3 scripts/compare_flags.py --flags "" --flags "--recompute sqrt" --flags "--offload 1"
    python3 scripts/compare_flags.py --flags-file my_sets.txt --trainer ./train_gpt_cu
    python3 scripts/compare_flags.py --trainer "mpirun -np 2 --allow-run-as-root ./train_gpt" --flags "--zero 1"
    python3 scripts/compare_flags.py --trainer build/emu/train_gpt --predict h100 --modelled -e d12 -b 16 -t 1024 -x 2

Each flag set is one run of the trainer (--trainer, ./train_gpt by default; any program with its
flags: build/emu/train_gpt, ./train_gpt_cu) with the shape (-e, -b, -t, -x), the data (-i) and
--extra, no validation and no samples, its log in OUT/runs/NN_name/ (the checkpoint the run writes
at its end is deleted unless --keep-checkpoints). Progress: which run, which step. A run the
trainer refuses (a combination it cannot do for this model) becomes a row saying why.

Writes to --out (default out/compare_flags):
  compare_flags.md          per flag set: ms/step (median of the steps after the first), tokens/s
                            (likewise), slowdown against the plain run (the first set without
                            flags, else the first set), final loss, and memory by category (MiB):
                            the measured high-water marks, with the plan where it differs
  memory_vs_throughput.png  device total against tokens/s, one point per flag set; with --budget,
                            a line at the budget and the sets under it marked
  memory_by_category.png    stacked bars of the measured memory by category (host ones hatched)
The plots need matplotlib (pip install matplotlib); without it the table is still written.
Timings are comparable only on a quiet machine, and only between runs of one invocation.

--predict GPU (h100, a100, h200 or a constants file; the emulated trainer, build/emu/train_gpt): each
run also plays on the emulated device's timeline of that GPU (CUDA_EMU_TIMELINE, doc/timeline.md) and
profiles its last step: the table adds the PREDICTED ms/step and tokens/s (all ranks') on that GPU and
the time each technique's copies, collectives and host update leave exposed. --modelled runs the device
work as a model only (CUDA_EMU_EXECUTE=0: d12 at T=1024 in seconds; the losses are then 0, the memory
the same plan). Predicted scheduling, not measured speed: the absolute times are estimates.
"""

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import runlog

DEFAULT_SETS = [
    "",
    "--recompute sqrt",
    "--recompute gelu,attn",
    "--recompute sqrt,gelu,attn",
    "--attention flash",
    "--offload 1",
    "--loss-chunk 64",
    "--optimizer adafactor",
    "--optimizer came",
    "--optimizer adafactor --recompute 1,gelu,attn --offload 1",
]
DEFAULT_DATA = "data/tinyshakespeare/tiny_shakespeare_train.bin"
STEP_RE = re.compile(r"^step +(\d+)/(\d+) \| loss ([0-9.naif+-]+) .*\| +([0-9.]+) ms")
UNITS = {"": 0, "b": 0, "kib": 10, "mib": 20, "gib": 30, "tib": 40}  # 2^shift bytes: the trainer's (llmc/flags.h)


def parse_bytes(text):
    """'24GiB', '1.5GiB', '4096' -> bytes, as the trainer's --max-memory reads a size (GB and MB are
    refused there, for they mean powers of 1000 to some and of 1024 to others)"""
    m = re.fullmatch(r"([0-9]+)(\.[0-9]+)?([a-zA-Z]*)", text)
    unit = m.group(3).lower() if m else None
    if not m or unit not in UNITS or (m.group(2) and UNITS[unit] == 0):
        raise argparse.ArgumentTypeError(f"'{text}': a size as the trainer's --max-memory takes it: bytes (4096), or a "
                                         "number and B, KiB, MiB, GiB or TiB (24GiB, 1.5GiB); GB and MB are not taken")
    return int(float(m.group(1) + (m.group(2) or "")) * 2 ** UNITS[unit])


def flag_sets(args):
    """the flag sets to run: --flags, then --flags-file's lines, else the defaults"""
    sets = list(args.flags or [])
    if args.flags_file:
        with open(args.flags_file) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    sets.append("" if line == "plain" else line)
    return sets or DEFAULT_SETS


def set_name(flags):
    return flags if flags else "plain"


def short_name(flags):
    """a plot label: "--optimizer adafactor --recompute 1,gelu,attn --offload 1" -> "adafactor + rc 1,gelu,attn + offload" """
    words, parts = shlex.split(flags), []
    while words:
        w = words.pop(0)
        value = words.pop(0) if words and not words[0].startswith("-") else ""
        name = {"--optimizer": value, "--recompute": f"rc {value}", "--offload": "offload" if value == "1" else ""}.get(w)
        parts.append(name if name is not None else f"{w} {value}".strip())
    return " + ".join(p for p in parts if p) or "plain"


def slug(flags):
    return re.sub(r"[^A-Za-z0-9]+", "_", set_name(flags)).strip("_")


def machine():
    """CPU model, SIMD level and cores: what every timing here depends on"""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model} ({simd}), {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"


# ----------------------------------------------------------------------------
# the runs

class Progress:
    """one line per run; on a terminal, the step count updates in place"""

    def __init__(self, total):
        self.total, self.tty = total, sys.stdout.isatty()

    def start(self, i, name):
        self.prefix = f"[{i}/{self.total}] {name}"
        if self.tty:
            print(f"{self.prefix}: starting", end="", flush=True)

    def step(self, step, steps, ms):
        if self.tty:
            print(f"\r\033[K{self.prefix}: step {step}/{steps}, {ms:.0f} ms", end="", flush=True)

    def done(self, text):
        print(f"\r\033[K{self.prefix}: {text}" if self.tty else f"{self.prefix}: {text}", flush=True)


def run_one(cmd, run_dir, progress):
    """runs CMD with its output in RUN_DIR/stdout.txt and stderr.txt; returns (exit code, error line)"""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "stdout.txt"), "w") as out, open(os.path.join(run_dir, "stderr.txt"), "w") as err:
        out.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        out.flush()
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, errors="replace")
        except OSError as e:
            return 127, f"cannot run {cmd[0]}: {e.strerror}"
        for line in p.stdout:
            out.write(line)
            m = STEP_RE.match(line)
            if m:
                progress.step(int(m.group(1)), int(m.group(2)), float(m.group(4)))
        rc = p.wait()
    with open(os.path.join(run_dir, "stderr.txt"), errors="replace") as f:
        lines = [l.strip() for l in f if l.strip()]
    error = next((l for l in lines if l.startswith("error")), lines[0] if lines else f"exit code {rc}")
    return rc, error


def remove_checkpoints(run_dir):
    for pattern in ("model_*.bin", "state_*.bin", "DONE_*"):
        for path in glob.glob(os.path.join(run_dir, pattern)):
            os.remove(path)


def predicted(run_dir):
    """the timeline of the run's profile.json (--predict): {"step_s", "tok_s", "exposed_s"}, or None"""
    try:
        with open(os.path.join(run_dir, "profile.json")) as f:
            tl = json.load(f).get("timeline")
    except (OSError, ValueError):
        return None
    if not tl:
        return None
    return {"step_s": tl["step_s"], "tok_s": tl["tokens_per_s"] * tl.get("ranks", 1), "exposed_s": tl["exposed_s"]}


def summarize(flags, run_dir, rc, error):
    """a row's numbers from the run's log.jsonl: {"flags", "ms", "tok_s", "loss", "memory"} (and
    "predicted" with --predict) or "error" """
    row = {"flags": flags, "dir": run_dir}
    if rc != 0:
        row["error"] = error
        return row
    try:
        run = runlog.read_run(run_dir)
    except (OSError, ValueError) as e:
        row["error"] = f"no log: {e}"
        return row
    if not run.steps or run.memory is None:
        row["error"] = "the log has no steps or no memory record"
        return row
    timed = run.steps[1:] if len(run.steps) > 1 else run.steps  # the first step pays for warm-up
    row.update(ms=statistics.median(r["ms"] for r in timed), tok_s=statistics.median(r["tokens_per_s"] for r in timed),
               loss=run.steps[-1]["loss"], steps=len(run.steps), memory=run.memory, predicted=predicted(run_dir))
    return row


# ----------------------------------------------------------------------------
# the table

def mib(b):
    return f"{b / runlog.MIB:.2f}"


def table_unit(rows):
    """KiB for tiny models (whose categories would read 0.00 MiB), else MiB"""
    largest = max((r["memory"]["measured"]["total"] for r in rows), default=0)
    return ("KiB", 1024.0) if largest < 16 * runlog.MIB else ("MiB", runlog.MIB)


def memory_cell(row, key, unit):
    planned, measured = row["memory"]["planned"].get(key), row["memory"]["measured"].get(key)
    if measured is None:
        return "-"
    if planned is None or planned == measured:
        return f"{measured / unit:.2f}"
    return f"{measured / unit:.2f} (plan {planned / unit:.2f})"


def markdown(rows, base, args, header):
    ok = [r for r in rows if "error" not in r]
    cats = []
    for r in ok:
        cats += [c for c in runlog.memory_categories(r["memory"]["measured"]) if c not in cats]
    cats = [c for c in cats if any(r["memory"]["measured"].get(c, 0) or r["memory"]["planned"].get(c, 0) for r in ok)]
    cols = cats + ["device_total", "host_total"]
    unit_name, unit = table_unit(ok)
    fits = args.budget is not None
    head = ["flags", "ms/step", "tok/s", f"vs {set_name(base['flags'])}" if base else "vs plain", "final loss"]
    if args.predict:
        head += [f"predicted ms/step ({args.predict})", "predicted tok/s", "predicted exposed ms: offload / exchange / host update"]
    head += [runlog.category_label(c) for c in cols] + (["fits"] if fits else [])
    lines = header + ["", f"Memory in {unit_name}.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = f"`{r['flags']}`" if r["flags"] else "(plain)"
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'].replace('|', '/')} |" + " |" * (len(head) - 2))
            continue
        ratio = f"{r['ms'] / base['ms']:.2f}x" if base else "-"
        cells = [name, f"{r['ms']:.1f}", f"{r['tok_s']:.0f}", ratio, f"{r['loss']:.6f}"]
        if args.predict:
            p = r.get("predicted")
            ex = p["exposed_s"] if p else {}
            cells += [f"{p['step_s'] * 1e3:.2f}", f"{p['tok_s']:.0f}",
                      " / ".join(f"{ex[k] * 1e3:.2f}" for k in ("offload", "exchange", "optimizer_host"))] if p else ["-"] * 3
        cells += [memory_cell(r, c, unit) for c in cols]
        if fits:
            cells.append("yes" if r["memory"]["measured"]["device_total"] <= args.budget else "no")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# the plots

def plot_memory_vs_throughput(plt, rows, args, path, title):
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for n, r in enumerate(rows, 1):  # points numbered as the legend lists them
        dev = r["memory"]["measured"]["device_total"] / runlog.MIB
        fits = args.budget is None or dev * runlog.MIB <= args.budget
        style = dict(marker="o", color="C0") if args.budget is None else \
            dict(marker="o", color="C2") if fits else dict(marker="x", color="C3")
        ax.scatter(r["tok_s"], dev, s=60, zorder=3, label=f"{n}: {short_name(r['flags'])}", **style)
        ax.annotate(str(n), (r["tok_s"], dev), textcoords="offset points", xytext=(5, 4), fontsize=8)
    if args.budget is not None:
        ax.axhline(args.budget / runlog.MIB, color="C3", ls="--", lw=1)
        ax.text(ax.get_xlim()[0], args.budget / runlog.MIB, f" budget {args.budget / runlog.MIB:.0f} MiB: "
                f"o fits, x does not", va="bottom", fontsize=8, color="C3")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("tokens/s (median after the first step)")
    ax.set_ylabel("peak device memory, measured (MiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory_by_category(plt, rows, args, path, title):
    cats = []
    for r in rows:
        cats += [c for c in runlog.memory_categories(r["memory"]["measured"]) if c not in cats]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 3), 5.5))
    xs = range(len(rows))
    bottom = [0.0] * len(rows)
    for i, c in enumerate(cats):
        vals = [r["memory"]["measured"].get(c, 0) / runlog.MIB for r in rows]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottom, color=f"C{i % 10}", hatch="//" if runlog.is_host(c) else None,
               edgecolor="white", label=runlog.category_label(c))
        bottom = [b + v for b, v in zip(bottom, vals)]
    if args.budget is not None:
        ax.axhline(args.budget / runlog.MIB, color="C3", ls="--", lw=1, label="budget (device)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([short_name(r["flags"]) for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("measured high-water mark (MiB)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------

def join_values(argv, names):
    """["--flags", "--relative-step"] -> ["--flags=--relative-step"]: a value of --flags or --extra is
    trainer flags, which argparse would take for this script's own options"""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in names and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description="train a few steps under each flag set; a markdown table and plots "
                                             "of speed and memory")
    ap.add_argument("--trainer", default="./train_gpt", help="the trainer command (split like a shell would), "
                                                             "e.g. build/emu/train_gpt or \"mpirun -np 2 ./train_gpt\"")
    ap.add_argument("-e", "--model", default="tiny", help="preset or model file (default tiny)")
    ap.add_argument("-b", "--batch", type=int, default=4)
    ap.add_argument("-t", "--seq", type=int, default=64)
    ap.add_argument("-x", "--steps", type=int, default=6, help="steps per run (default 6; the first is not timed)")
    ap.add_argument("-i", "--train", default=DEFAULT_DATA, help=f"training shards (default {DEFAULT_DATA})")
    ap.add_argument("--extra", default="", help="more trainer flags for every run, e.g. \"-d 1024 -k ''\"")
    ap.add_argument("--flags", action="append", help="one flag set (repeat; \"\" is the plain run)")
    ap.add_argument("--flags-file", help="flag sets, one a line (# comments; 'plain' for none)")
    ap.add_argument("--budget", type=parse_bytes, help="device memory budget, e.g. 24GiB: marks the sets that fit")
    ap.add_argument("--out", default="out/compare_flags", help="output folder (default out/compare_flags)")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep each run's final checkpoint")
    ap.add_argument("--predict", metavar="GPU", help="the emulated trainer only: also the PREDICTED step on this GPU's "
                    "timeline (h100, a100, h200 or a constants file: CUDA_EMU_TIMELINE, doc/timeline.md)")
    ap.add_argument("--modelled", action="store_true", help="with --predict: the device's work modelled, not run "
                    "(CUDA_EMU_EXECUTE=0): large models in seconds, losses 0")
    return ap.parse_args(join_values(sys.argv[1:] if argv is None else argv, ("--flags", "--extra")))


def remove_earlier_runs(out):
    """the run folders an earlier comparison left in OUT/runs (NN_name, with its stdout.txt): a
    rerun's table and plots must not sit beside runs it did not make; returns how many"""
    removed = 0
    for d in glob.glob(os.path.join(out, "runs", "[0-9][0-9]_*")):
        if os.path.isfile(os.path.join(d, "stdout.txt")):
            shutil.rmtree(d)
            removed += 1
    return removed


def timed_steps_text(steps):
    """which steps ms/step and tok/s are of (the first pays for warm-up and is left out when there are more)"""
    if steps == 1:
        return "of its one step (with the warm-up: -x 2 or more times the steps after it)"
    return "medians of step 2" if steps == 2 else f"medians of steps 2..{steps}" if steps > 2 else "medians of the steps after the first"


def main(argv=None):
    args = parse_args(argv)
    trainer = shlex.split(args.trainer)
    if len(trainer) == 1 and shutil.which(trainer[0]) is None:  # a launcher (mpirun ...) checks its own
        print(f"error: trainer '{trainer[0]}' not found\n  hint: make train_gpt, or --trainer PATH", file=sys.stderr)
        return 1
    if not glob.glob(args.train):
        print(f"error: no training data '{args.train}'\n  hint: make data (TinyShakespeare), or -i SHARDS",
              file=sys.stderr)
        return 1
    if args.modelled and not args.predict:
        print("error: --modelled needs --predict GPU (a model of which GPU)\n  hint: --predict h100", file=sys.stderr)
        return 1
    sets = flag_sets(args)
    base_cmd = trainer + ["-e", args.model, "-b", str(args.batch), "-t", str(args.seq), "-x", str(args.steps),
                          "-i", args.train, "-j", "", "-v", "0", "-s", "0"] + shlex.split(args.extra)
    if args.predict:   # the timeline's report comes with --profile: the last step (not the first, if there are more)
        base_cmd += ["--profile", str(min(2, args.steps) if args.steps > 1 else 1)]
        os.environ["CUDA_EMU_TIMELINE"] = args.predict
        if args.modelled:
            os.environ["CUDA_EMU_EXECUTE"] = "0"
    os.makedirs(args.out, exist_ok=True)
    earlier = remove_earlier_runs(args.out)
    if earlier:
        print(f"removed {earlier} run folder(s) of an earlier comparison from {os.path.join(args.out, 'runs')}")
    progress = Progress(len(sets))
    rows = []
    started = time.monotonic()
    for i, flags in enumerate(sets, 1):
        run_dir = os.path.join(args.out, "runs", f"{i:02d}_{slug(flags)}")
        if os.path.exists(os.path.join(run_dir, "log.jsonl")):
            os.remove(os.path.join(run_dir, "log.jsonl"))
        progress.start(i, set_name(flags))
        rc, error = run_one(base_cmd + shlex.split(flags) + ["-o", run_dir], run_dir, progress)
        if not args.keep_checkpoints:
            remove_checkpoints(run_dir)
        row = summarize(flags, run_dir, rc, error)
        rows.append(row)
        progress.done(f"failed: {row['error']}" if "error" in row else
                      f"{row['ms']:.1f} ms/step, {row['tok_s']:.0f} tok/s, device "
                      f"{mib(row['memory']['measured']['device_total'])} MiB, loss {row['loss']:.4f}"
                      + (f", predicted {row['predicted']['step_s'] * 1e3:.2f} ms/step on {args.predict}"
                         if row.get("predicted") else ""))
        if args.predict and "error" not in row and not row.get("predicted"):
            row["error"] = ("no timeline in its profile.json: --predict needs the emulated trainer "
                            "(--trainer build/emu/train_gpt)")
    ok = [r for r in rows if "error" not in r]
    base = next((r for r in ok if not r["flags"]), ok[0] if ok else None)

    shape = f"-e {args.model} -b {args.batch} -t {args.seq}, {args.steps} steps"
    header = [f"# Flags compared: {shape}", "",
              f"{time.strftime('%Y-%m-%d')}, {machine()}. Trainer `{args.trainer}`, data `{args.train}`"
              + (f", `{args.extra}`" if args.extra else "") + f". ms/step and tok/s are {timed_steps_text(args.steps)}; memory is the measured high-water mark of each category (log.jsonl's memory "
              "record), with the plan in parentheses where it differs; \"device total\" is every category but the "
              "host ones." + (f" PREDICTED columns: the step on the emulated device's timeline of {args.predict} (doc/timeline.md): "
                              "a model of scheduling, not a measurement; exposed: a technique's time while the compute stream "
                              "runs no kernel." if args.predict else "")
              + (" Device work modelled, not run (CUDA_EMU_EXECUTE=0): losses are 0." if args.modelled else "")
              + " Command: `python3 scripts/" + os.path.basename(__file__) + " " +
              " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])) + "`."]
    table = os.path.join(args.out, "compare_flags.md")
    with open(table, "w") as f:
        f.write(markdown(rows, base, args, header))
    written = [table]
    if ok:
        try:
            import matplotlib  # noqa: F401
            plt = runlog.pyplot()
        except ImportError:
            plt = None
            print("note: no plots: matplotlib is not installed (python3 -m pip install matplotlib)")
        if plt:
            title = f"{shape} ({args.trainer})"
            for name, draw in (("memory_vs_throughput.png", plot_memory_vs_throughput),
                               ("memory_by_category.png", plot_memory_by_category)):
                draw(plt, ok, args, os.path.join(args.out, name), title)
                written.append(os.path.join(args.out, name))
    print(f"{len(ok)} of {len(rows)} runs in {time.monotonic() - started:.0f} s; wrote {', '.join(written)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
