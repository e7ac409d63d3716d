"""test_compare_flags.py: scripts/compare_flags.py and scripts/plot_log.py on the tiny fixture model.

    python3 tests/test_compare_flags.py ./train_gpt ./test_gpt

compare_flags.py runs the trainer for 3 steps under 4 flag sets (plain; Adafactor with
--recompute 1; --offload 1; and --offload 1 --recompute 2, which the trainer refuses for L=2),
with a --budget between the AdamW and the Adafactor runs' device totals. Checks: it exits 0,
shows which run it is at, and writes a markdown table with a row per flag set, in order, whose
numbers are numbers and agree with each run's log.jsonl (final loss, device total, the median
step time, "fits" against the budget), the plain run at 1.00x, the refused set a row that says
why; the two PNGs exist and parse (signature, IHDR with a size, chunk CRCs, IEND). A flag-set
file (comments, "plain") gives the same sets. plot_log.py writes a PNG that parses from two run
folders, and a missing log is an error with a hint. Without matplotlib the plots are skipped
(counted, with a "skipped:" line) and the table is still checked. What a user trips over: a
one-word --flags value ("--relative-step", not only "--flags=--relative-step"), a decimal --budget
(12GB: refused as the trainer refuses it), -x 1 (one step timed, not "steps 2..1"), a rerun into
the same --out (no stale runs/ folders), and -o in a folder that does not exist for plot_log.py and
dev/convert_hf_gpt2.py (an error, not a traceback).
"""

import os
import re
import statistics
import struct
import sys
import zlib

import e2e

TRAIN, TESTER = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt"])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
COMPARE = [sys.executable, os.path.join(ROOT, "scripts", "compare_flags.py")]
PLOT_LOG = [sys.executable, os.path.join(ROOT, "scripts", "plot_log.py")]
MIB = 1024.0 * 1024.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

s = e2e.Suite("test_compare_flags", tester=TESTER, run_limit=120)
FIX, W = s.fix, s.root
try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:
    HAVE_MPL = False

SETS = ["", "--optimizer adafactor --recompute 1", "--offload 1", "--offload 1 --recompute 2"]
REFUSED = "--offload 1 --recompute 2"
SHAPE = ["--trainer", TRAIN, "-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-b", "2", "-t", "16", "-x", "3",
         "--extra", "-k ''"]
BUDGET = 0.5 * MIB  # the fixture model at B=2 T=16: AdamW 0.68 MiB of device memory, Adafactor with recompute 0.40


def png_problem(path):
    """None if PATH is a PNG that parses (signature, IHDR with a size, every chunk's CRC, IEND), else why not"""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return f"cannot read: {e.strerror}"
    if data[:8] != PNG_SIGNATURE:
        return "no PNG signature"
    pos, chunks = 8, []
    while pos + 12 <= len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(kind + body) != crc:
            return f"chunk {kind!r} at byte {pos}: bad CRC"
        chunks.append((kind, body))
        pos += 12 + n
    if not chunks or chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        return f"chunks {[k for k, _ in chunks][:3]}...: want IHDR first and IEND last"
    width, height = struct.unpack(">II", chunks[0][1][:8])
    if width == 0 or height == 0:
        return f"image of {width}x{height}"
    return None


def check_png(name, path):
    problem = png_problem(path)
    s.check(name, problem is None, f"{path}: {problem}")


def table_rows(path):
    """the markdown table: (header cells, [row cells], bytes per memory unit)"""
    with open(path) as f:
        text = f.read()
    lines = [l for l in text.splitlines() if l.startswith("|")]
    cells = [[c.strip() for c in l.strip("|").split("|")] for l in lines]
    unit = re.search(r"^Memory in (KiB|MiB)\.$", text, re.M)
    return cells[0], cells[2:], {"KiB": 1024.0, "MiB": MIB}[unit.group(1)] if unit else None  # cells[1]: |---|


def number(text):
    try:
        return float(text.rstrip("x"))
    except ValueError:
        return None


def run_compare(name, out, extra):
    r = s.expect_ok(name, COMPARE + SHAPE + ["--out", out] + extra)
    return r


# ----------------------------------------------------------------------------
# compare_flags.py with --flags and a budget

out = s.path("compare")
flags_args = [a for f in SETS for a in ("--flags", f)]
r = run_compare("compare_flags: 4 flag sets, 3 steps each, exits 0", out, flags_args + ["--budget", str(int(BUDGET))])
if r:
    shown = re.findall(r"^\[(\d)/4\] ", r.out, re.M)
    s.check("compare_flags: shows which run it is at", shown == ["1", "2", "3", "4"], f"progress lines: {r.out[:400]}")
    table = os.path.join(out, "compare_flags.md")
    head, rows, unit = table_rows(table) if os.path.isfile(table) else ([], [], None)
    s.check("compare_flags: a table row per flag set, in order", len(rows) == len(SETS) and all(
        row[0] == (f"`{f}`" if f else "(plain)") for row, f in zip(rows, SETS)),
        f"first cells {[row[0] for row in rows]}")
    col = {h: i for i, h in enumerate(head)}
    want_cols = ["flags", "ms/step", "tok/s", "vs plain", "final loss", "parameters", "optimizer state",
                 "activations", "device total", "host total", "fits"]
    if s.check("compare_flags: the columns", all(c in col for c in want_cols), f"header {head}"):
        runs_dir = os.path.join(out, "runs")
        dirs = sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []
        for row, flags, d in zip(rows, SETS, dirs):
            name = f"compare_flags: row '{flags or 'plain'}'"
            if flags == REFUSED:
                s.check(f"{name} says the trainer refused it, and why",
                        row[1].startswith("failed:") and "nothing would move" in row[1], f"row {row}")
                continue
            nums = [number(row[col[c]]) for c in want_cols[1:-1]]
            if not s.check(f"{name}: every cell a number", None not in nums, f"row {row}"):
                continue
            log = e2e.read_log(os.path.join(runs_dir, d))
            steps = [x for x in log if "loss" in x]
            device = [x["memory"]["measured"]["device_total"] for x in log if "memory" in x][0]
            ms = statistics.median(x["ms"] for x in steps[1:])
            s.check(f"{name}: final loss, device total and ms/step are the log's",
                    unit and row[col["final loss"]] == f"{steps[-1]['loss']:.6f}" and row[col["device total"]] ==
                    f"{device / unit:.2f}" and row[col["ms/step"]] == f"{ms:.1f}",
                    f"row {row}; log: loss {steps[-1]['loss']}, device {device} B, median ms {ms:.1f}; unit {unit}")
            s.check(f"{name}: fits the budget as its device total says", row[col["fits"]] ==
                    ("yes" if device <= BUDGET else "no"), f"fits '{row[col['fits']]}', device {device} B")
        s.check("compare_flags: the plain run is the 1.00x", rows and rows[0][col["vs plain"]] == "1.00x",
                f"row {rows[0] if rows else None}")
        fits = [row[col["fits"]] for row in rows if not row[1].startswith("failed")]
        s.check("compare_flags: the budget splits the runs (a test of 'fits' both ways)", "yes" in fits and "no" in fits,
                f"fits column {fits}: move BUDGET between the runs' device totals")
        s.check("compare_flags: the runs' checkpoints are removed", not any(
            f.startswith(("model_", "state_", "DONE_")) for d in dirs for f in os.listdir(os.path.join(runs_dir, d))),
            "checkpoint files left in runs/")
    if HAVE_MPL:
        check_png("compare_flags: memory_vs_throughput.png parses", os.path.join(out, "memory_vs_throughput.png"))
        check_png("compare_flags: memory_by_category.png parses", os.path.join(out, "memory_by_category.png"))
    else:
        s.skip("compare_flags: the two PNGs", "matplotlib not installed: python3 -m pip install matplotlib")
        s.check("compare_flags: without matplotlib it says so", "no plots: matplotlib" in r.out, r.out[-300:])

# the same sets from a file
sets_file = s.path("sets.txt")
with open(sets_file, "w") as f:
    f.write("# flag sets\nplain\n\n--offload 1   # offload only\n")
out2 = s.path("compare_file")
if run_compare("compare_flags: --flags-file", out2, ["--flags-file", sets_file]):
    _, rows, _ = table_rows(os.path.join(out2, "compare_flags.md"))
    s.check("compare_flags: the file's sets, 'plain' and comments understood",
            [row[0] for row in rows] == ["(plain)", "`--offload 1`"], f"first cells {[row[0] for row in rows]}")

# ----------------------------------------------------------------------------
# plot_log.py

runs = [os.path.join(out, "runs", d) for d in sorted(os.listdir(os.path.join(out, "runs")))[:2]] \
    if os.path.isdir(os.path.join(out, "runs")) else []
if not HAVE_MPL:
    s.skip("plot_log: a PNG from two runs", "matplotlib not installed: python3 -m pip install matplotlib")
elif len(runs) == 2:
    png = s.path("loss.png")
    if s.expect_ok("plot_log: two run folders", PLOT_LOG + [runs[0], os.path.join(runs[1], "log.jsonl"), "-o", png]):
        check_png("plot_log: the PNG parses", png)
else:
    s.fail("plot_log: a PNG from two runs", "no runs from compare_flags to plot")
r = s.run(PLOT_LOG + [s.path("nowhere")])
s.check("plot_log: a missing log is an error with a hint", r.rc == 1 and "hint:" in r.err and "nowhere" in r.err,
        f"exit {r.rc}: {r.err[:300]}")


# ----------------------------------------------------------------------------
# what a user trips over (issue 21): a one-word --flags, a decimal --budget, -x 1, a rerun into
# the same --out, and -o in a folder that does not exist (plot_log.py, dev/convert_hf_gpt2.py)

out3 = s.path("compare_one_word")
r = s.run(COMPARE + SHAPE[:-2] + ["-x", "2", "--out", out3, "--flags", "", "--flags", "--relative-step", "--flags", "--check-replicas"])
s.check("compare_flags: --flags with a one-word value (not --flags=...) is read", r.rc == 0 and "usage:" not in r.err,
        f"exit {r.rc}: {r.err[:300]}")
if r.rc == 0:
    _, rows, _ = table_rows(os.path.join(out3, "compare_flags.md"))
    s.check("compare_flags: ... its rows: the trainer's refusal of --relative-step (AdamW) and --check-replicas run",
            [row[0] for row in rows] == ["(plain)", "`--relative-step`", "`--check-replicas`"]
            and "read by --optimizer adafactor only" in rows[1][1] and not rows[2][1].startswith("failed"),
            f"rows {rows}")
for size in ("12GB", "500MB", "1.5e9"):
    r = s.run(COMPARE + SHAPE + ["--out", s.path("compare_budget"), "--budget", size])
    s.check(f"compare_flags: --budget {size} is refused as the trainer refuses it", r.rc == 2 and "GB and MB are not taken" in r.err,
            f"exit {r.rc}: {r.err[-300:]}")
r = s.run(COMPARE + SHAPE + ["--out", s.path("compare_budget"), "--budget", "1.5GiB", "--flags", ""])
s.check("compare_flags: --budget 1.5GiB is read", r.rc == 0, f"exit {r.rc}: {r.err[-300:]}")
out4 = s.path("compare_x1")
r = run_compare("compare_flags: -x 1", out4, ["-x", "1", "--flags", ""])
if r:
    with open(os.path.join(out4, "compare_flags.md")) as f:
        text = f.read()
    s.check("compare_flags: -x 1 says its one step is timed, not 'steps 2..1'", "2..1" not in text and "of its one step" in text,
            text[:500])
if os.path.isdir(out2):
    r = run_compare("compare_flags: a rerun with fewer sets into the same --out", out2, ["--flags", ""])
    left = sorted(os.listdir(os.path.join(out2, "runs")))
    s.check("compare_flags: ... leaves only its own run folders", left == ["01_plain"], f"runs/: {left}")
if HAVE_MPL and runs:
    r = s.run(PLOT_LOG + [runs[0], "-o", s.path("no", "such", "dir", "x.png")])
    s.check("plot_log: -o in a folder that does not exist: an error, not a traceback",
            r.rc == 1 and "cannot write" in r.err and "Traceback" not in r.err, f"exit {r.rc}: {r.err[-300:]}")
else:
    s.skip("plot_log: -o in a folder that does not exist", "matplotlib not installed: python3 -m pip install matplotlib")
REF = os.path.join(ROOT, "dev", "reference", "tiny_hf_gpt2")
r = s.run([sys.executable, os.path.join(ROOT, "dev", "convert_hf_gpt2.py"), REF, "--reader", "stdlib",
           "-o", s.path("no", "such", "dir", "t.bin")])
s.check("convert_hf_gpt2: -o in a folder that does not exist: an error, not a traceback",
        r.rc == 1 and "cannot write" in r.err and "Traceback" not in r.err, f"exit {r.rc}: {r.err[-300:]}")

s.finish()
