"""plot_trace.py: a picture of a Chrome trace of the emulated device's timeline (trace.json, written
beside profile.json under CUDA_EMU_TIMELINE; doc/timeline.md): one row a stream, a bar per operation,
coloured by what it is (compute, copies to and from the host, collectives, the host's own work).
ui.perfetto.dev shows the same trace interactively; this is for a page.

    python3 scripts/plot_trace.py OUT/trace.json picture.png [--title "d12 B=16 --offload 1"] [--ms FROM TO]

Needs matplotlib (pip install matplotlib).
"""

import argparse
import json
import sys

COLOURS = {"kernel": "#4c72b0", "gemm": "#2a4d8f", "memset": "#8da0cb", "memcpy DtoD": "#8da0cb",
           "memcpy DtoH": "#dd8452", "memcpy HtoD": "#55a868", "collective": "#c44e52", "host": "#937860"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    ap.add_argument("--ms", nargs=2, type=float, metavar=("FROM", "TO"), help="only this window, ms from the trace's start")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: plot_trace.py needs matplotlib\n  hint: python3 -m pip install matplotlib")
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    bars = [e for e in events if e.get("ph") == "X" and e.get("dur", 0) > 0]
    if not bars:
        sys.exit(f"error: {a.trace} has no operation that takes time")
    t0 = min(e["ts"] for e in bars)
    used = sorted({e["tid"] for e in bars})
    row = {tid: i for i, tid in enumerate(reversed(used))}
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(used) + 1.4))
    for e in bars:
        start, end = (e["ts"] - t0) / 1e3, (e["ts"] + e["dur"] - t0) / 1e3
        if a.ms and (end < a.ms[0] or start > a.ms[1]):
            continue
        ax.broken_barh([(start, end - start)], (row[e["tid"]] - 0.4, 0.8), color=COLOURS.get(e.get("cat"), "#999999"))
    ax.set_yticks(list(row.values()))
    ax.set_yticklabels([names.get(tid, f"tid {tid}") for tid in row])
    ax.set_xlabel("ms (predicted: the emulated device's timeline, not a measurement)")
    if a.ms:
        ax.set_xlim(*a.ms)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#937860")]
    ax.legend(handles, ["kernels, GEMMs", "to the host", "from the host", "collectives", "host work"], loc="upper center",
              bbox_to_anchor=(0.5, -0.35), fontsize=8, ncol=5, frameon=False)
    ax.set_title(a.title)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
