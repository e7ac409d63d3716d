"""test_timeline.py: the emulated device's timeline (CUDA_EMU_TIMELINE, dev/cuda_emu/emu_timeline.cpp)
under the CUDA trainer, on the tiny fixture models (L=2 C=32 NH=2 V=64; L=5 for --offload 1, so that
blocks come back from the host) and on d12 at B=16 T=1024:
  - it changes nothing the run computes: with CUDA_EMU_TIMELINE=h100 the losses and the final model
    are bitwise those of the same run without it (one rank with --offload 1; two ranks with --zero 2);
  - --profile N prints the predicted step time and tokens/s, each stream's busy time and each
    technique's exposed time; profile.json holds "timeline" with the keys the issue names, its step
    the table's step; the exposed times are at most the totals;
  - trace.json (beside profile.json) is a Chrome trace: its streams are the program's (compute, copy
    under --offload 1; the NCCL stream with 2 ranks), every operation starts after the operations it
    waited for (its "after" list: the stream before it and the events it waited on) and a stream's
    operations never overlap; each offload copy to the host waits for the compute stream's work, and
    each of the compute stream's copy waits waits for the copy stream: the program's events;
  - the exposed offload time of profile.json is the one computed here from the trace (the offload
    copies' time outside the compute stream's kernels);
  - CUDA_EMU_EXECUTE=0 plays a d12 step at B=16 T=1024 in well under a second of host time, the
    trainer reading zeros back (loss 0) and running through its steps.

    python3 tests/test_timeline.py ./build/emu/train_gpt ./test_gpt
"""

import json
import os
import random
import re
import sys

import e2e
from e2e import ckpt, same_bytes, train_rows

CUDA, TESTER = e2e.usage(sys.argv, ["./build/emu/train_gpt", "./test_gpt"])
s = e2e.Suite("test_timeline", tester=TESTER, run_limit=300)
FIX = s.fix
L, B, T = 2, 2, 16
BASE = ["-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", str(B), "-t", str(T),
        "-x", "3", "-u", "2", "-v", "0", "-s", "0"]
TIMELINE = {"CUDA_EMU_TIMELINE": "h100"}
EPS_US = 2e-3   # the trace's times and durations are each rounded to a nanosecond
PREDICTED_RE = re.compile(r"^timeline \(CUDA_EMU_TIMELINE=h100: .*predicted step ([0-9.]+) ms, ([0-9]+) tokens/s", re.M)


def load_json(name, path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        s.fail(f"{name}: {path} parses", str(e))
        return None


def same_as_without(name, flags, out, launcher=None, model="model.bin"):
    """the run with the timeline and without: the same losses, the same final model"""
    runs = {}
    for tag, env in (("timeline", TIMELINE), ("plain", {})):
        cmd = (launcher or []) + [CUDA, *BASE, "-e", f"{FIX}/{model}", *flags, "--profile", "2", "-o", s.path(f"{out}_{tag}")]
        r = s.expect_ok(f"{name}: runs {'with' if env else 'without'} CUDA_EMU_TIMELINE", cmd, env=env)
        if r is None:
            return None
        runs[tag] = r
    a, b = train_rows(s.path(f"{out}_timeline")), train_rows(s.path(f"{out}_plain"))
    s.check(f"{name}: the same losses with the timeline as without, bitwise", a and a == b, f"{a} vs {b}")
    s.check(f"{name}: the same final model, bitwise",
            same_bytes(ckpt(s.path(f"{out}_timeline"), "model", 3, ".bin"), ckpt(s.path(f"{out}_plain"), "model", 3, ".bin")), "differ")
    return runs["timeline"]


def check_report(name, r, out):
    """the printed prediction, profile.json's "timeline"; returns (profile.json, trace.json)"""
    m = PREDICTED_RE.search(r.out)
    s.check(f"{name}: --profile prints the predicted step time and tokens/s", m is not None, r.out[-1500:])
    s.check(f"{name}: ... each stream's busy time and each technique's exposed time",
            "busy in the step:" in r.out and all(f"| {t}" in r.out for t in ("offload", "exchange", "optimizer_host")),
            r.out[-1500:])
    js = load_json(name, s.path(out, "profile.json"))
    trace = load_json(name, s.path(out, "trace.json"))
    if js is None or trace is None:
        return None, None
    tl = js.get("timeline", {})
    keys = {"gpu", "step_s", "streams", "exposed_s", "total_s"}
    techniques = {"offload", "exchange", "optimizer_host"}
    s.check(f"{name}: profile.json's timeline has gpu, step_s, streams, exposed_s and total_s by technique",
            keys <= set(tl) and tl["gpu"] == "h100" and techniques == set(tl["exposed_s"]) == set(tl["total_s"]), str(tl))
    if not keys <= set(tl):
        return js, trace
    s.check(f"{name}: the timeline's step is the table's", abs(tl["step_s"] * 1e3 - js["step_ms"]) < 1e-3,
            f"{tl['step_s']} s against {js['step_ms']} ms")
    if m:
        s.check(f"{name}: the printed step is profile.json's", abs(float(m.group(1)) - tl["step_s"] * 1e3) < 1e-3, m.group(1))
    s.check(f"{name}: no technique is exposed longer than it ran",
            all(0.0 <= tl["exposed_s"][t] <= tl["total_s"][t] + 1e-12 for t in techniques), str(tl))
    s.check(f"{name}: the compute stream is busy, and no longer than the step",
            0.0 < tl["streams"].get("compute", 0.0) <= tl["step_s"] + 1e-12, str(tl["streams"]))
    return js, trace


def union(intervals):
    """[(a, b)] merged"""
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def length(intervals):
    return sum(b - a for a, b in union(intervals))


def check_trace(name, trace, streams, tl=None):
    """streams and dependencies; returns the X events by seq"""
    events = trace.get("traceEvents", [])
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    ops = [e for e in events if e.get("ph") == "X" and "seq" in e.get("args", {})]
    s.check(f"{name}: trace.json's streams are the program's ({', '.join(streams)})",
            set(streams) <= set(names.values()) and all("pid" in e and "tid" in e for e in ops), str(names))
    by_seq = {e["args"]["seq"]: e for e in ops}
    late = [(e["args"]["seq"], d) for e in ops for d in e["args"]["after"]
            if d in by_seq and e["ts"] + EPS_US < by_seq[d]["ts"] + by_seq[d]["dur"]]
    s.check(f"{name}: every operation starts after those it waited for ({sum(len(e['args']['after']) for e in ops)} dependencies)",
            ops and not late, f"{len(late)} start early, e.g. {late[:3]}")
    overlap = []
    for tid in names:
        mine = sorted((e for e in ops if e["tid"] == tid and e["dur"] > 0), key=lambda e: e["ts"])
        overlap += [(a["args"]["seq"], b["args"]["seq"]) for a, b in zip(mine, mine[1:]) if b["ts"] + EPS_US < a["ts"] + a["dur"]]
    s.check(f"{name}: a stream's operations never overlap", not overlap, str(overlap[:3]))
    return names, ops, by_seq


def overlapping(a, b):
    """the operations of a that run (for part of their time) while some operation of b runs"""
    return [x for x in a if any(x["ts"] < y["ts"] + y["dur"] - EPS_US and y["ts"] < x["ts"] + x["dur"] - EPS_US for y in b)]


def compute_kernels(ops, tid):
    return [e for e in ops if e["tid"] == tid and e["cat"] in ("kernel", "gemm", "memset", "memcpy DtoD") and e["dur"] > 0]


def reaches(by_seq, op, tid, hops):
    """whether op waited for an operation on stream tid within `hops` dependencies"""
    frontier = [op]
    for _ in range(hops):
        frontier = [by_seq[d] for e in frontier for d in e["args"]["after"] if d in by_seq]
        if any(e["tid"] == tid for e in frontier):
            return True
    return False


# ----------------------------------------------------------------------------
# doc/timeline.md's table of the constants is the code's

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
with open(os.path.join(ROOT, "dev", "cuda_emu", "emu_timeline.cpp")) as f:
    code = [(m.group(1), [float(x) for x in m.group(2).split(",")], m.group(3))
            for m in re.finditer(r'\{TL_\w+, "(\w+)", \{([^}]*)\}, "((?:[^"\\]|\\.)*)"\},', f.read())]
with open(os.path.join(ROOT, "doc", "timeline.md")) as f:
    doc = [(m.group(1), [float(m.group(i)) for i in (2, 3, 4)], m.group(5))
           for m in re.finditer(r"^\| `(\w+)` \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| (.*) \|$", f.read(), re.M)]
s.check("doc/timeline.md's constants are emu_timeline.cpp's (names, values, sources)", code and code == doc,
        f"code {len(code)} rows, doc {len(doc)}: first difference "
        f"{next(((c, d) for c, d in zip(code, doc) if c != d), None)}")

# ----------------------------------------------------------------------------
# one rank, --offload 1: copies on the copy stream, the compute stream waiting for them

name, out = "--offload 1", "off"
r = same_as_without(name, ["--offload", "1"], out, model="model_deep.bin")
if r:
    js, trace = check_report(name, r, f"{out}_timeline")
    if trace:
        names, ops, by_seq = check_trace(name, trace, ["compute", "copy", "host"])
        tid = {v: k for k, v in names.items()}
        down = [e for e in ops if e["cat"] == "memcpy DtoH" and e["tid"] == tid["copy"]]
        to_host = next((e for e in js["entries"] if e["kind"] == "offload copy" and e["name"] == "to the host"), None)
        up = [e for e in ops if e["cat"] == "memcpy HtoD" and e["tid"] == tid["copy"]]
        from_host = next((e for e in js["entries"] if e["kind"] == "offload copy" and e["name"] == "from the host"), None)
        s.check(f"{name}: the trace's copies to and from the host are the profile's",
                to_host and from_host and len(down) == to_host["calls"] and len(up) == from_host["calls"] > 0,
                f"{len(down)} and {len(up)} in the trace, profile: {to_host}, {from_host}")
        s.check(f"{name}: each copy to the host waits for the compute stream's work (compute_done)",
                down and all(reaches(by_seq, e, tid["compute"], 4) for e in down), str(down[:2]))
        # act_policy.h: three slots, the last three of the five layers never move; a block comes back
        # into the slot the backward is done with while the layer after it computes (prefetch)
        s.check(f"{name}: two blocks of five go to the host (the last three stay in their slots)",
                to_host is not None and to_host["calls"] == 2, str(to_host))

        waits = [e for e in ops if e["args"]["call"] == "cudaStreamWaitEvent" and e["tid"] == tid["compute"]
                 and e["name"].startswith("copy wait")]
        # (after_tids: a wait in the first layer's forward may wait for a copy of the step before)
        s.check(f"{name}: each of the compute stream's copy waits waits for the copy stream",
                waits and all(tid["copy"] in e["args"]["after_tids"] for e in waits),
                str([(e["args"]["seq"], e["args"]["after"], e["args"]["after_tids"]) for e in waits if tid["copy"] not in e["args"]["after_tids"]]))
        # the exposed offload time, again from the trace: the offload copies outside the compute kernels
        lo = min(e["ts"] for e in ops)
        compute = [(e["ts"], e["ts"] + e["dur"]) for e in ops if e["tid"] == tid["compute"]
                   and e["cat"] in ("kernel", "gemm", "memset", "memcpy DtoD")]
        offload = [(e["ts"], e["ts"] + e["dur"]) for e in ops if e["args"].get("technique") == "offload"]
        exposed = (length(offload + compute) - length(compute)) * 1e-6
        tl = js["timeline"]
        s.check(f"{name}: profile.json's exposed offload time is the trace's",
                abs(exposed - tl["exposed_s"]["offload"]) < 1e-8 and abs(length(offload) * 1e-6 - tl["total_s"]["offload"]) < 1e-8,
                f"trace: {exposed} of {length(offload) * 1e-6} s; profile.json: {tl['exposed_s']['offload']} of {tl['total_s']['offload']}")

# ----------------------------------------------------------------------------
# one rank, --offload optimizer: the host's update, counted at the host's bandwidth

name, out = "--offload optimizer", "optoff"
r = same_as_without(name, ["--offload", "optimizer"], out)
if r:
    js, trace = check_report(name, r, f"{out}_timeline")
    if trace:
        names, ops, by_seq = check_trace(name, trace, ["compute", "host"])
        host = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "host"
                and e["args"].get("technique") == "optimizer_host"]
        tl = js["timeline"]
        s.check(f"{name}: the host's update is on the host's track, its time the optimizer_host total",
                host and abs(sum(e["dur"] for e in host) * 1e-6 - tl["total_s"]["optimizer_host"]) < 1e-8
                and tl["total_s"]["optimizer_host"] > 0.0, f"{host[:2]}; {tl}")
        updates = [e for e in js["entries"] if e["kind"] == "optimizer" and "on the host" in e["name"]]
        # its bytes at the H100 machine's host bandwidth (87 GB/s), and the CUDA calls the host makes
        # meanwhile (host_call_us, 2 us each): what is left after the bytes is a whole number of calls
        calls = (tl["total_s"]["optimizer_host"] - sum(e["bytes"] for e in updates) / 87e9) / 2e-6 if updates else -1.0
        s.check(f"{name}: ... which is its bytes at the host's 87 GB/s and the 2 us of each CUDA call it makes meanwhile",
                calls > -1e-3 and abs(calls - round(calls)) < 1e-3,
                f"{tl['total_s']['optimizer_host']} s for {[e['bytes'] for e in updates]} bytes: {calls} calls")
        # the update is deferred to the next forward and made a group at a time (wte, wpe, lnf; then
        # each layer), each group's weights going up before the next group's update: an upload starts
        # before the last group's update does (all after it: the update made at once, then uploaded)
        host.sort(key=lambda e: e["ts"])
        ups = sorted(e["ts"] for e in ops if e["cat"] == "memcpy HtoD" and e["ts"] >= host[0]["ts"] - EPS_US) if host else []
        s.check(f"{name}: the update is made a group at a time, each group's weights sent up before the next is updated",
                len(host) == L + 1 and ups and ups[0] < host[-1]["ts"],
                f"{len(host)} host update ranges, uploads at {ups[:4]}, the last update at {host[-1]['ts'] if host else None}")

# ----------------------------------------------------------------------------
# two ranks, --zero 2: the reduce-scatters on the NCCL stream, counted as the exchange

launcher, why = e2e.mpi_launcher(CUDA)
if launcher is None:
    s.skip("2 ranks --zero 2 under the timeline", why)
else:
    name, out = "2 ranks --zero 2", "z2"
    r = same_as_without(name, ["--zero", "2"], out, launcher=launcher + ["2"])
    if r:
        js, trace = check_report(name, r, f"{out}_timeline")
        if trace:
            names, ops, by_seq = check_trace(name, trace, ["compute", "nccl"])
            coll = [e for e in ops if e["cat"] == "collective"]
            s.check(f"{name}: the collectives are in the trace, as the exchange", coll and all(
                e["args"].get("technique") == "exchange" for e in coll), str(coll[:2]))
            s.check(f"{name}: profile.json counts their time", js["timeline"]["total_s"]["exchange"] > 0.0, str(js["timeline"]))
# the offloaded shard under --zero 2 and 3: its host update deferred to the next forward, a group at a
# time, each group's blocks up and gathered (--zero 2; --zero 3: the layer's prefetch) before the next
# group's update
for z in ("2", "3") if launcher else ():
    name, out = f"2 ranks --zero {z} --offload optimizer", f"z{z}opt"
    cmd = launcher + ["2", CUDA, *BASE, "-e", f"{FIX}/model.bin", "--zero", z, "--offload", "optimizer", "--profile", "2",
                      "-o", s.path(out)]
    if s.expect_ok(f"{name}: runs with CUDA_EMU_TIMELINE", cmd, env=TIMELINE):
        trace = load_json(name, s.path(out, "trace.json"))
        host = sorted((e for e in (trace or {}).get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "host"
                       and e.get("args", {}).get("technique") == "optimizer_host"), key=lambda e: e["ts"])
        # (a collective is named by the range it was queued in: the gathers by the forward's, the
        # reduce-scatters by their own)
        gathers = sorted(e["ts"] for e in (trace or {}).get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "collective"
                         and "reduce" not in e.get("name", "") and host and e["ts"] >= host[0]["ts"])
        s.check(f"{name}: the host's update is made a group at a time, a group's gather before the last group's update",
                len(host) == L + 1 and gathers and gathers[0] < host[-1]["ts"],
                f"{len(host)} host update ranges, gathers at {gathers[:3]}, the last update at {host[-1]['ts'] if host else None}")

# ----------------------------------------------------------------------------
# scripts/compare_flags.py --predict: the predicted step beside each flag set's memory

cf = s.path("compare")
cmd = [sys.executable, os.path.join(ROOT, "scripts", "compare_flags.py"), "--trainer", CUDA, "--predict", "h100",
       "-e", f"{FIX}/model_deep.bin", "-i", f"{FIX}/train.bin", "-b", str(B), "-t", str(T), "-x", "2",
       "--extra", "-k ''", "--flags", "", "--flags", "--offload 1", "--out", cf]
r = s.expect_ok("compare_flags.py --predict h100: runs", cmd)
if r:
    with open(os.path.join(cf, "compare_flags.md")) as f:
        md = f.read()
    rows = [line.split(" | ") for line in md.splitlines() if line.startswith("| (plain)") or line.startswith("| `--offload 1`")]
    head = next((line.split(" | ") for line in md.splitlines() if line.startswith("| flags")), [])
    col = next((i for i, h in enumerate(head) if h.startswith("predicted ms/step (h100)")), None)
    s.check("compare_flags.py --predict h100: a predicted ms/step column, named as predicted, for every flag set",
            col is not None and len(rows) == 2 and all(float(x[col]) > 0.0 for x in rows) and "PREDICTED" in md, md[-1500:])
    s.check("compare_flags.py --predict h100: --offload 1's predicted step is longer than the plain one's",
            col is not None and len(rows) == 2 and float(rows[1][col]) > float(rows[0][col]), str(rows))
r = s.run([sys.executable, os.path.join(ROOT, "scripts", "compare_flags.py"), "--trainer", CUDA, "--modelled",
           "-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "--out", s.path("compare2")])
s.check("compare_flags.py --modelled without --predict stops, saying it needs a GPU to model",
        r.rc == 1 and "--modelled needs --predict" in r.err, f"exit {r.rc}: {r.err[-300:]}")

# ----------------------------------------------------------------------------
# timing only: a d12 step at B=16 T=1024, modelled, not run

D12_B, D12_T = 16, 1024
rng = random.Random(33)
e2e.write_shard(s.path("d12_train.bin"), [rng.randrange(50257) for _ in range(9 * D12_B * D12_T)], 50257)  # a step of 8 ranks
cmd = [CUDA, "-e", "d12", "-i", s.path("d12_train.bin"), "-j", "", "-k", "", "-b", str(D12_B), "-t", str(D12_T),
       "-x", "2", "-v", "0", "-s", "0", "--profile", "2", "-o", ""]
name = "CUDA_EMU_EXECUTE=0, d12 B=16 T=1024"
r = s.expect_ok(f"{name}: runs through its steps", cmd, env=dict(TIMELINE, CUDA_EMU_EXECUTE="0"))
if r:
    steps = [line for line in r.out.splitlines() if line.startswith("step ")]
    ms = [float(re.search(r"\| +([0-9.]+) ms \|", line).group(1)) for line in steps]
    s.check(f"{name}: each step plays in under a second of host time", len(ms) == 2 and max(ms) < 1000.0, str(steps))
    s.check(f"{name}: what the trainer reads back is zeros (loss 0)", steps and all("loss 0.000000" in x for x in steps),
            str(steps))
    m = PREDICTED_RE.search(r.out)
    s.check(f"{name}: the prediction is printed, its step longer than a millisecond", m and float(m.group(1)) > 1.0,
            r.out[-1500:])

# a d48 step at B=8 T=1024 with --offload 1, modelled: the trainer skips the host work nothing reads
# (gpt2_device_is_modelled: no weight initialization, digest or state memset, no check of this
# machine's host memory, which the plan's 37 GB of host store would fail here)
name = "CUDA_EMU_EXECUTE=0, d48 B=8 T=1024 --offload 1"
cmd = [CUDA, "-e", "d48", "-i", s.path("d12_train.bin"), "-j", "", "-k", "", "-b", "8", "-t", "1024",
       "--offload", "1", "-x", "2", "-v", "0", "-s", "0", "--profile", "2", "-o", ""]
r = s.expect_ok(f"{name}: runs through its steps", cmd, env=dict(TIMELINE, CUDA_EMU_EXECUTE="0"))
if r:
    s.check(f"{name}: says the weights are left uninitialized (nothing computes on them)",
            "the weights are left uninitialized" in r.out, r.out[:1500])
    m = PREDICTED_RE.search(r.out)
    s.check(f"{name}: the prediction is printed", m is not None and float(m.group(1)) > 1.0, r.out[-1500:])

# ----------------------------------------------------------------------------
# the overlaps, on d12 at B=16 T=1024 modelled (the fixtures' steps are too short: the host's calls
# set their pace). A copy waited for at once, or a gather queued where it is needed, fails these

def modelled_d12(name, flags, out, launcher=None):
    """(profile.json, trace.json, {stream name: tid}, its operations) of a modelled d12 step, or Nones"""
    cmd = [CUDA, "-e", "d12", "-i", s.path("d12_train.bin"), "-j", "", "-k", "", "-b", str(D12_B), "-t", str(D12_T),
           "-x", "2", "-v", "0", "-s", "0", "--profile", "2", "-o", s.path(out), *flags]
    r = s.expect_ok(f"{name}: runs", (launcher or []) + cmd, env=dict(TIMELINE, CUDA_EMU_EXECUTE="0"))
    js = load_json(name, s.path(out, "profile.json")) if r else None
    trace = load_json(name, s.path(out, "trace.json")) if r else None
    if js is None or trace is None:
        return None, None, None, None
    events = trace.get("traceEvents", [])
    tid = {e["args"]["name"]: e["tid"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return js, trace, tid, [e for e in events if e.get("ph") == "X" and "seq" in e.get("args", {})]


def exposed_share(js, technique):
    tl = js["timeline"]
    return tl["exposed_s"][technique] / tl["total_s"][technique] if tl["total_s"][technique] > 0 else 1.0


name = "modelled d12 --offload 1"
js, trace, tid, ops = modelled_d12(name, ["--offload", "1"], "d12_off")
if js:
    up = [e for e in ops if e["cat"] == "memcpy HtoD" and e["tid"] == tid["copy"]]
    down = [e for e in ops if e["cat"] == "memcpy DtoH" and e["tid"] == tid["copy"]]
    beside = overlapping(up, compute_kernels(ops, tid["compute"]))
    s.check(f"{name}: nine blocks of twelve go to the host and come back (the last three stay in their slots)",
            len(down) == 9 and len(up) == 9, f"{len(down)} down, {len(up)} up")
    s.check(f"{name}: the blocks come back while the compute stream runs the backward (prefetched into the third slot)",
            len(beside) >= 8, f"{len(beside)} of {len(up)} copies from the host beside kernels")

name = "modelled d12 --offload 1 --recompute sqrt"
js, trace, tid, ops = modelled_d12(name, ["--offload", "1", "--recompute", "sqrt"], "d12_offseg")
if js:
    s.check(f"{name}: at least 90% of the offload copies hidden behind compute (the segment inputs' copies are shorter than it)",
            exposed_share(js, "offload") <= 0.10, str(js["timeline"]))

name = "modelled d12 --offload optimizer"
js, trace, tid, ops = modelled_d12(name, ["--offload", "optimizer"], "d12_offopt")
if js:
    updates = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "host"
               and e.get("args", {}).get("technique") == "optimizer_host"]
    beside = overlapping(updates, compute_kernels(ops, tid["compute"]))
    s.check(f"{name}: the host's update is made a group at a time (wte, wpe, lnf, then each of the 12 layers)",
            len(updates) == 13, f"{len(updates)} host update ranges")
    s.check(f"{name}: the layers' updates run while the compute stream runs the forward of the layers before them",
            len(beside) >= 11, f"{len(beside)} of {len(updates)} beside kernels")
    s.check(f"{name}: the forward hides part of the host's update (it was 100% exposed when made at once)",
            exposed_share(js, "optimizer_host") <= 0.92, str(js["timeline"]))

launcher, why = e2e.mpi_launcher(CUDA)
if launcher is None:
    s.skip("modelled d12 --zero 1, 2 and 3 on 8 ranks", why)
else:
    for z in ("1", "2", "3"):
        name = f"modelled d12 --zero {z}, 8 ranks"
        js, trace, tid, ops = modelled_d12(name, ["--zero", z], f"d12_z{z}", launcher=launcher + ["8"])
        if js:
            gathers = [e for e in ops if e["cat"] == "collective" and e["tid"] == tid["nccl"]
                       and "all-gather" in e["name"]]
            beside = overlapping(gathers, compute_kernels(ops, tid["compute"]))
            s.check(f"{name}: the weights' all-gathers run on the NCCL stream beside the kernels (the next forward's, "
                    f"wte's and layer 0's beside the other layers' update)", gathers and len(beside) >= len(gathers) - 1,
                    f"{len(beside)} of {len(gathers)} beside kernels")
            s.check(f"{name}: at least 80% of the exchange hidden behind compute", exposed_share(js, "exchange") <= 0.20,
                    str(js["timeline"]))

s.finish()
