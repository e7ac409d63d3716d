"""plot_log.py: training and validation loss against step, and tokens/s, from one or several
runs' log.jsonl, into one PNG: for looking at a run, or comparing runs.

    python3 scripts/plot_log.py out                          # writes out/loss.png
    python3 scripts/plot_log.py out_d6 out_d12/log.jsonl -o compare.png --title "d6 vs d12"

Each argument is a run folder (the trainer's -o) or its log.jsonl; a run is labelled by its
folder's name. The top panel has the training loss of every step (a line) and the validation
loss (dots on a dashed line) in one colour per run; the bottom panel tokens/s per step (the
first step, which pays for warm-up, is left out when there are more). The default output is
loss.png in the first run's folder. Needs matplotlib (pip install matplotlib).
"""

import argparse
import os
import sys

import runlog


def main(argv=None):
    ap = argparse.ArgumentParser(description="loss, validation loss and tokens/s against step from log.jsonl files")
    ap.add_argument("runs", nargs="+", help="run folders (-o of train_gpt) or their log.jsonl files")
    ap.add_argument("-o", "--out", help="the PNG to write (default: loss.png in the first run's folder)")
    ap.add_argument("--title", help="the figure's title (default: the runs' labels)")
    ap.add_argument("--logy", action="store_true", help="loss on a log scale")
    args = ap.parse_args(argv)

    runs = []
    for path in args.runs:
        try:
            runs.append(runlog.read_run(path))
        except (OSError, ValueError) as e:
            print(f"error: {e}\n  hint: pass a run folder written by train_gpt -o DIR, or its log.jsonl",
                  file=sys.stderr)
            return 1
    empty = [r.path for r in runs if not r.steps and not r.vals]
    if empty:
        print(f"error: no training or validation lines in {', '.join(empty)}", file=sys.stderr)
        return 1
    labels = [r.label for r in runs]
    if len(set(labels)) < len(labels):  # two runs in folders of one name: add their parents
        labels = [os.path.relpath(os.path.dirname(os.path.abspath(r.path))) for r in runs]

    plt = runlog.pyplot()
    fig, (ax_loss, ax_speed) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(3, 1.4))
    for i, (run, label) in enumerate(zip(runs, labels)):
        colour = f"C{i % 10}"
        if run.steps:
            ax_loss.plot([r["step"] for r in run.steps], [r["loss"] for r in run.steps], color=colour, lw=1.2,
                         label=f"{label} train")
            speed = run.steps[1:] if len(run.steps) > 1 else run.steps
            ax_speed.plot([r["step"] for r in speed], [r["tokens_per_s"] for r in speed], color=colour, lw=1.0,
                          label=label)
        if run.vals:
            ax_loss.plot([s for s, _ in run.vals], [v for _, v in run.vals], color=colour, ls="--", marker="o",
                         ms=4, label=f"{label} val")
    ax_loss.set_ylabel("loss")
    if args.logy:
        ax_loss.set_yscale("log")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    ax_loss.set_title(args.title or ", ".join(labels))
    ax_speed.set_ylabel("tokens/s")
    ax_speed.set_xlabel("step")
    ax_speed.grid(alpha=0.3)
    fig.tight_layout()
    out = args.out or os.path.join(os.path.dirname(runs[0].path), "loss.png")
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        print(f"error: cannot write '{out}': {e.strerror}\n  hint: -o a path in a folder that exists and is writable",
              file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
