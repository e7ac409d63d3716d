"""test_profile.py: --profile N (llmc/profile.h), the table of where step N's time goes, on the CPU
trainer and on the CUDA trainer's emulated build, on the tiny fixture model (L=2 C=32 NH=2 V=64).
What is checked is the structure and the sums, not the times (the emulated device's mean nothing):
  - the table is printed once, for step N, and OUT/profile.json parses and holds the same rows
    (kind, what, stream, calls, ms, MB, GFLOP) as the table;
  - the compute stream's shares and the "other" row add up to 100% (and their ms to the step's);
  - every kind a step must have is there (matmuls by shape, attention forward and backward,
    LayerNorm, GELU, residual, classifier, encoder, zeroing, gradient norm, optimizer), with the
    calls a step makes (L of each block matmul, L+1 LayerNorms forward, ...) and the FLOPs and
    bytes of the formulas, computed here independently for the block's matmuls;
  - the memory flags add their kinds: --offload 1 its copies (the GPU: on the copy stream) and the
    compute stream's waits for them, --offload optimizer,gradients the gradients' copies, 2 ranks
    the gradient sums (NCCL, MPI), --recompute gelu the GELU again; the emulated table says its
    times are the emulator's;
  - profiling changes nothing the run computes: the losses and the final model are bitwise those of
    the same run without --profile;
  - a step the run does not train is refused (past -x, not after a resumed step, negative), and
    -h lists the flag;
  - scripts/gpu_runbook.sh passes bash -n, and its --dry-run lists every step (the smoke test
    first, under a minute; about 20 minutes in all) with the commands the issue asks for.

    python3 tests/test_profile.py ./train_gpt ./build/emu/train_gpt ./test_gpt
"""

import json
import os
import re
import sys

import e2e
from e2e import ckpt, same_bytes, train_rows

TRAIN, CUDA, TESTER = e2e.usage(sys.argv, ["./train_gpt", "./build/emu/train_gpt", "./test_gpt"])
s = e2e.Suite("test_profile", tester=TESTER, run_limit=300)
FIX = s.fix
L, C, V, VP = 2, 32, 64, 128   # the fixture model (padded vocabulary: a multiple of 128)
B, T = 2, 16
BT = B * T
BASE = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", str(B), "-t", str(T),
        "-x", "3", "-u", "2", "-v", "0", "-s", "0"]
ROW_RE = re.compile(r"^\| (.{22}) \| (.{48}) \| (.{9}) \| +(\d+) \| +([0-9.]+) \| +(\S+) \| +([0-9.]+) \| +([0-9.]+) \|")
ALWAYS = ["matmul", "attention forward", "attention backward", "layernorm", "gelu", "residual", "classifier",
          "encoder", "zeroing", "gradient norm", "optimizer"]


def table_rows(out):
    """the rows of the printed table (not its by-kind summary) as dicts"""
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("profile of step")]
    if len(starts) != 1:
        return None
    rows = []
    for line in lines[starts[0] + 2:]:
        m = ROW_RE.match(line)
        if not m:
            break
        kind, name, stream, calls, ms, share, mb, gflop = m.groups()
        rows.append({"kind": kind.strip(), "name": name.strip(), "stream": stream.strip(), "calls": int(calls),
                     "ms": float(ms), "share": share, "mb": float(mb), "gflop": float(gflop)})
    return rows


def profile_run(name, train, flags, out, step=2, launcher=None):
    """a run with --profile STEP; (its result, the table's rows, profile.json) or None"""
    cmd = (launcher or []) + [train, *BASE, *flags, "--profile", str(step), "-o", s.path(out)]
    r = s.expect_ok(f"{name}: runs", cmd)
    if r is None:
        return None
    rows = table_rows(r.out)
    if not s.check(f"{name}: one table, for step {step}", rows is not None and f"profile of step {step}," in r.out,
                   r.out[-2000:]):
        return None
    try:
        with open(s.path(out, "profile.json")) as f:
            js = json.load(f)
    except (OSError, ValueError) as e:
        s.fail(f"{name}: profile.json parses", str(e))
        return None
    s.ok(f"{name}: profile.json beside log.jsonl parses")
    return r, rows, js


def check_structure(name, rows, js, kinds, emulated=False):
    """the table against the JSON, the shares' sum, the kinds present"""
    other = [row for row in rows if row["kind"] == "other"]
    entries = [row for row in rows if row["kind"] != "other"]
    same = len(entries) == len(js["entries"]) and all(
        a["kind"] == b["kind"] and a["name"] == b["name"] and a["stream"] == b["stream"] and a["calls"] == b["calls"]
        and abs(a["ms"] - b["ms"]) <= 1e-3 and abs(a["mb"] - b["bytes"] / 1e6) <= 0.01
        and abs(a["gflop"] - b["flops"] / 1e9) <= 1e-3 for a, b in zip(entries, js["entries"]))
    s.check(f"{name}: the JSON holds the table's rows", same and len(other) == 1,
            f"{len(entries)} rows, {len(js['entries'])} JSON entries")
    compute = [e for e in js["entries"] if e["stream"] == "compute"]
    shares = sum(e["share"] for e in compute) + js["other_share"]
    ms = sum(e["ms"] for e in compute) + js["other_ms"]
    s.check(f"{name}: the compute stream's shares and 'other' add up to 100% ({100 * shares:.3f}%)",
            abs(shares - 1.0) < 1e-3 and abs(ms - js["step_ms"]) <= 1e-3 * js["step_ms"] + 1e-3,
            f"shares {shares}, ms {ms} of {js['step_ms']}")
    present = {e["kind"] for e in js["entries"]}
    missing = [k for k in kinds if k not in present]
    s.check(f"{name}: every kind expected is there ({len(kinds)})", not missing, f"missing: {missing}")
    says = "EMULATED" in js["timing"]
    s.check(f"{name}: the timing {'says' if emulated else 'does not say'} the times are emulated's", says == emulated,
            js["timing"])
    check_roofline(name, js, measured=not emulated)


def check_roofline(name, js, measured):
    """the CPU measures its limits (triad GB/s, GEMM GFLOP/s) and gives each range with work its share of them:
    max(bytes / bandwidth, flops / rate) / time; the emulated GPU measures none and gives no shares"""
    roof = js.get("roofline")
    if not measured:
        s.check(f"{name}: no roofline where no limits are measured", roof is None and
                not any("roofline_share" in e for e in js["entries"]), f"{roof}")
        return
    if not s.check(f"{name}: the machine's limits measured (triad and GEMM)", roof is not None and roof["gb_s"] > 0
                   and roof["gflop_s"] > 0, f"{roof}"):
        return
    bad = []
    for e in js["entries"]:
        if e["bytes"] == 0 and e["flops"] == 0:
            continue
        want = max(e["bytes"] / (roof["gb_s"] * 1e9), e["flops"] / (roof["gflop_s"] * 1e9)) / (e["ms"] / 1e3)
        if "roofline_share" not in e or abs(e["roofline_share"] - want) > 1e-3 * want + 1e-6:
            bad.append(f"{e['kind']} {e['name']}: {e.get('roofline_share')} want {want}")
    s.check(f"{name}: every range's roofline share is max(bytes / bandwidth, FLOPs / rate) over its time", not bad, "; ".join(bad[:3]))


def entry(js, kind, name, stream="compute"):
    found = [e for e in js["entries"] if e["kind"] == kind and e["name"] == name and e["stream"] == stream]
    return found[0] if found else None


def check_counts(name, js, X, gelu_dgelu, fused_ln):
    """calls, FLOPs and bytes of every matmul shape, of LayerNorm forward (fused_ln: the GPU fuses each
    with the residual before it, but the first block's first and lnf) and of the residual, from the shapes"""
    shapes = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)] * L + [(C, VP)]  # the blocks', the classifier's
    want = {}  # name: (calls, flops, bytes); the classifier's (C -> Vp) shares a name with fc's here (Vp = 4C)
    for k, n in shapes:
        for fwd in (True, False):
            label = f"{'forward' if fwd else 'backward'} ({BT} x {k}) -> {n}"
            if not fwd and gelu_dgelu and k == 4 * C:
                label += " (with gelu backward)"
            calls, flops, nbytes = want.get(label, (0, 0, 0))
            flops += 2 * BT * k * n if fwd else 4 * BT * k * n + BT * n
            nbytes += (BT * k + k * n + n + BT * n) * X if fwd else (BT * n + 2 * BT * k + k * n) * X + 8 * (k * n + n)
            want[label] = (calls + 1, flops, nbytes)
    bad = []
    for label, (calls, flops, nbytes) in want.items():
        e = entry(js, "matmul", label)
        if e is None or (e["calls"], e["flops"], e["bytes"]) != (calls, flops, nbytes):
            bad.append(f"{label}: want {(calls, flops, nbytes)}, got {e}")
    extra = [e["name"] for e in js["entries"] if e["kind"] == "matmul" and e["name"] not in want]
    if extra:
        bad.append(f"unexpected matmuls: {extra}")
    ln, fused = entry(js, "layernorm", "forward"), entry(js, "layernorm", "forward, fused with the residual")
    # the GPU fuses each LayerNorm with the residual before it, but the first block's first and lnf
    n_fused = 2 * L - 1 if fused_ln else 0
    plain = 2 * L + 1 - n_fused
    if ln is None or ln["calls"] != plain or ln["flops"] != 7 * BT * C * plain:
        bad.append(f"layernorm forward: {ln}")
    if fused_ln and (fused is None or fused["calls"] != n_fused or fused["flops"] != 8 * BT * C * n_fused
                     or fused["bytes"] != ((4 * BT * C + 2 * C) * X + 8 * BT) * n_fused):
        bad.append(f"layernorm forward fused with the residual: {fused}")
    res = entry(js, "residual", "forward")
    if res is None or res["calls"] != 2 * L - n_fused:
        bad.append(f"residual forward: {res}")
    s.check(f"{name}: every matmul shape and layernorm forward: calls, FLOPs and bytes", not bad, "; ".join(bad))


def check_same_run(name, train, flags, profiled_dir):
    """the profiled run's losses and model bitwise those of the same run without --profile"""
    plain = s.path(profiled_dir + "_plain")
    if s.expect_ok(f"{name}: the same run without --profile", [train, *BASE, *flags, "-o", plain]) is None:
        return
    a, b = train_rows(s.path(profiled_dir)), train_rows(plain)
    same = a == b and len(a) == 3 and same_bytes(ckpt(s.path(profiled_dir), "model", 3, ".bin"), ckpt(plain, "model", 3, ".bin"))
    s.check(f"{name}: profiling changes nothing: losses and model bitwise equal", same, f"{a} vs {b}")


# ----------------------------------------------------------------------------
# the CPU trainer

res = profile_run("cpu", TRAIN, [], "cpu")
if res:
    r, rows, js = res
    check_structure("cpu", rows, js, ALWAYS)
    check_counts("cpu", js, 4, gelu_dgelu=False, fused_ln=False)
    check_same_run("cpu", TRAIN, [], "cpu")
# the five-layer fixture: offload keeps the last three layers in their slots (llmc/act_policy.h), so
# only a model of more than three moves blocks
L_DEEP = 5
res = profile_run("cpu --offload 1 --recompute gelu", TRAIN, ["-e", f"{FIX}/model_deep.bin", "--offload", "1", "--recompute", "gelu"], "cpu_off")
if res:
    r, rows, js = res
    check_structure("cpu --offload 1 --recompute gelu", rows, js, ALWAYS + ["offload copy"])
    g = entry(js, "gelu", "forward (recompute)")
    s.check("cpu --recompute gelu: the GELU again in backward, once a layer", g is not None and g["calls"] == L_DEEP, str(g))
res = profile_run("cpu, first step", TRAIN, [], "cpu_first", step=1)
if res:
    s.check("cpu, first step: the table says it holds the warm-up", "holds the warm-up" in res[0].out, res[0].out[-500:])

# ----------------------------------------------------------------------------
# the CUDA trainer, emulated

FP32 = ["--precision", "fp32"]
res = profile_run("gpu", CUDA, [], "gpu")
if res:
    r, rows, js = res
    check_structure("gpu", rows, js, ALWAYS, emulated="build/emu/" in CUDA)
    check_counts("gpu", js, 2, gelu_dgelu=True, fused_ln=True)
    s.check("gpu: the printed table says the times are the emulator's", "EMULATED" in r.out, r.out[-500:])
    check_same_run("gpu", CUDA, [], "gpu")
flags = ["--offload", "1", "--recompute", "1"] + FP32
res = profile_run("gpu --offload 1 --recompute 1", CUDA, flags, "gpu_off")
if res:
    r, rows, js = res
    check_structure("gpu --offload 1 --recompute 1", rows, js, ALWAYS + ["offload copy", "copy wait"],
                    emulated="build/emu/" in CUDA)
    copies = [e for e in js["entries"] if e["kind"] == "offload copy"]
    s.check("gpu --offload 1: the copies are timed on the copy stream", copies and all(e["stream"] == "copy" for e in copies),
            str(copies))
    check_same_run("gpu --offload 1 --recompute 1", CUDA, flags, "gpu_off")
flags = ["--offload", "optimizer,gradients", "-d", str(2 * BT)]
res = profile_run("gpu --offload optimizer,gradients", CUDA, flags, "gpu_optoff")
if res:
    r, rows, js = res
    check_structure("gpu --offload optimizer,gradients", rows, js,
                    [k for k in ALWAYS if k != "zeroing"] + ["offload copy"], emulated="build/emu/" in CUDA)
    down = entry(js, "offload copy", "gradients to the host", "gradients")
    s.check("gpu --offload optimizer,gradients: every micro-step's gradients down, on their own stream",
            down is not None and down["calls"] > 0, str(down))
    # the previous step's host update runs inside this step's forward, group by group: beside the GPU's
    # compute, so on the host stream (on the compute stream it would count the same time twice)
    host = [e for e in js["entries"] if e["kind"] == "optimizer" and "on the host" in e["name"]]
    s.check("gpu --offload optimizer,gradients: the previous step's host update, a group at a time, on the host stream",
            host and all(e["stream"] == "host" for e in host) and sum(e["calls"] for e in host) == 1 + L,
            str(host))

launcher, why = e2e.mpi_launcher(TRAIN)
if launcher is None:
    s.skip("2 ranks: the gradient sums in the table", why)
else:
    for name, train in (("cpu", TRAIN), ("gpu", CUDA)):
        res = profile_run(f"{name}, 2 ranks --zero 1", train, ["--zero", "1"], f"{name}_dp", launcher=launcher + ["2"])
        if res:
            r, rows, js = res
            check_structure(f"{name}, 2 ranks --zero 1", rows, js, ALWAYS + ["collective (NCCL, MPI)"],
                            emulated=name == "gpu" and "build/emu/" in CUDA)
            s.check(f"{name}, 2 ranks: one table (rank 0's)", r.out.count("profile of step") == 1, "")

# ----------------------------------------------------------------------------
# bad input, -h

s.expect_fail("--profile past the last step", "--profile 5: past the run's last step (-x 3)",
              [TRAIN, *BASE, "--profile", "5", "-o", s.path("bad1")])
s.expect_fail("--profile negative", "--profile -1: must be >= 0", [TRAIN, *BASE, "--profile", "-1", "-o", s.path("bad2")])
resumed = s.path("resumed")
if s.expect_ok("a run to resume", [TRAIN, *BASE, "-n", "2", "-o", resumed]):
    s.expect_fail("--profile of a step before the resumed one", "--profile 2: this run trains steps 4 to 5",
                  [TRAIN, *BASE, "-x", "5", "-y", "1", "--profile", "2", "-o", resumed])
r = s.run([TRAIN, "-h"])
s.check("-h lists --profile", "--profile" in r.out + r.err, (r.out + r.err)[-300:])

# ----------------------------------------------------------------------------
# scripts/gpu_runbook.sh: its syntax, and its steps as --dry-run lists them (no GPU here)

RUNBOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "gpu_runbook.sh")
r = s.run(["bash", "-n", RUNBOOK])
s.check("gpu_runbook.sh: bash -n", r.rc == 0, r.err[-300:])
r = s.run(["bash", RUNBOOK, "--dry-run"])
steps = re.findall(r"^== step (\S+): expected about (\d+) min", r.out, re.M)
names = [n for n, _ in steps]
want = ["smoke", "determinism", "sass", "profile", "sanitizer", "gpu-check", "trainer", "bench"]
s.check("gpu_runbook.sh --dry-run: every step, smoke first, each with its expected time, about 20 minutes in all",
        r.rc == 0 and names == want and sum(int(m) for _, m in steps) <= 20 and int(steps[0][1]) <= 1,
        f"rc {r.rc}, steps {steps}, {r.err[-200:]}")
cmds = [line for line in r.out.splitlines() if line.startswith("   $ ")]
san = [c for c in cmds if "compute-sanitizer" in c]
tools_ok = all(any(f"--tool {t}" in c and f"--precision {p}" in c and "-t 100 " in c for c in san)
               for t in ("memcheck", "racecheck", "synccheck", "initcheck") for p in ("bf16", "fp32"))
s.check("gpu_runbook.sh: the sanitizer's four tools over d6 in bf16 and fp32 at T = 100 (not a multiple of 64), "
        "and over the kernel tests", tools_ok and any("dev/cuda/test_" in c for c in san), "\n".join(san))
s.check("gpu_runbook.sh: the profile of d12 B=16 T=1024", any("--profile" in c and "-e d12 -b 16 -t 1024" in c for c in cmds),
        "\n".join(cmds))
r = s.run(["bash", RUNBOOK, "no-such-step"])
s.check("gpu_runbook.sh: an unknown step is refused, naming the steps", r.rc == 2 and "smoke" in r.out, r.out[-300:])

s.finish()
