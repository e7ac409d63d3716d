"""plot_pipeline.py: the two pipeline schedules, GPipe and 1F1B, drawn stage by time from the lists the C
code writes (llmc/pipeline.h, simulated by llmc/pipeline_sim.h): one row a stage, a box a forward or a
backward labelled with its micro-batch, the bubble left blank.

    make build/test_pipeline && python3 scripts/plot_pipeline.py          # doc/pipeline_schedules.png, N=4, m=8
    python3 scripts/plot_pipeline.py --stages 8 --micro 16 -o /tmp/pp.png

The timeline is `build/test_pipeline --print SCHEDULE N M` (a forward and a backward one unit each);
nothing of the schedule is computed here. Needs matplotlib (python3 -m pip install matplotlib): without
it the script says so and exits 2.
"""

import argparse
import os
import subprocess
import sys

import runlog

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BINARY = os.path.join(ROOT, "build", "test_pipeline")
COLOURS = {"F": "#8fb8de", "B": "#f2a65a"}  # forward blue, backward orange
TITLES = {
    "gpipe": "GPipe: all forwards, then all backwards",
    "1f1b": "1F1B: warmup of N - s - 1 forwards, then one forward one backward, then the cooldown",
}


def timeline(schedule, stages, micro):
    """(makespan, bubble, held per stage, [(stage, op, micro, start, end)]) from the C code's --print"""
    if not os.path.isfile(BINARY):
        sys.exit(f"error: {os.path.relpath(BINARY)} is not built\n  hint: make build/test_pipeline")
    p = subprocess.run([BINARY, "--print", schedule, str(stages), str(micro)], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"error: {os.path.relpath(BINARY)} --print {schedule} {stages} {micro} failed:\n{p.stderr}")
    lines = p.stdout.splitlines()
    head, held = lines[0].split(), lines[1].split()
    makespan, bubble = float(head[head.index("makespan") + 1]), float(head[head.index("bubble") + 1])
    boxes = []
    for line in lines[3:]:
        s, op, i, start, end = line.split()
        boxes.append((int(s), op, int(i), float(start), float(end)))
    return makespan, bubble, [int(h) for h in held[2:]], boxes


def draw(plt, ax, schedule, stages, micro):
    makespan, bubble, held, boxes = timeline(schedule, stages, micro)
    for s, op, i, start, end in boxes:
        ax.add_patch(plt.Rectangle((start, s - 0.4), end - start, 0.8, facecolor=COLOURS[op], edgecolor="black", lw=0.6))
        ax.text((start + end) / 2, s, f"{op}{i}", ha="center", va="center", fontsize=8)
    for s in range(stages):
        ax.text(makespan + 0.3, s, f"holds {held[s]}", va="center", fontsize=9)
    ax.set_xlim(0, makespan + 2.2)
    ax.set_ylim(stages - 0.5, -0.5)  # stage 0 on top
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {s}" for s in range(stages)])
    ax.set_xticks(range(0, int(makespan) + 1, 2))
    ax.set_facecolor("#eeeeee")  # the bubble: where no box is
    ax.set_title(f"{TITLES[schedule]}\nN={stages} stages, m={micro} micro-batches: the step takes "
                 f"2(m + N - 1) = {makespan:g} units, bubble (N - 1)/(m + N - 1) = {bubble:.1%} of each stage (grey)",
                 fontsize=10, loc="left")


def main(argv=None):
    ap = argparse.ArgumentParser(description="GPipe and 1F1B drawn stage by time from build/test_pipeline --print")
    ap.add_argument("--stages", type=int, default=4, help="N, the stages (default 4)")
    ap.add_argument("--micro", type=int, default=8, help="m, the micro-batches a step (default 8)")
    ap.add_argument("-o", "--out", default=os.path.join(ROOT, "doc", "pipeline_schedules.png"), help="the PNG to write")
    args = ap.parse_args(argv)
    plt = runlog.pyplot()
    height = 1.2 + 0.45 * args.stages
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.5 * 2 * (args.micro + args.stages) + 2), 2 * height), sharex=True)
    for ax, schedule in zip(axes, ("gpipe", "1f1b")):
        draw(plt, ax, schedule, args.stages, args.micro)
    axes[1].set_xlabel("time (a forward or a backward of one micro-batch on one stage: one unit)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=COLOURS[k], edgecolor="black") for k in ("F", "B")]
    fig.legend(handles, ["Fi: forward of micro-batch i", "Bi: backward of micro-batch i"], loc="lower left", fontsize=9,
               ncol=2, frameon=False)
    fig.text(0.99, 0.01, "holds k: the most micro-batches whose activations the stage keeps at once", ha="right",
             va="bottom", fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(args.out, dpi=110)
    print(f"wrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
