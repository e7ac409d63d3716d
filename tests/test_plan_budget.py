"""test_plan_budget.py: --plan with a memory budget (--max-memory, --max-host-memory:
llmc/plan_search.h), on the tiny fixture model (L=2 C=32 NH=2 V=64), so every run takes a second:
  - for budgets from roomy to tight, the recommended command line (read from the search's JSON
    line, {"plan_search": ...}) trains for real, and its memory record in log.jsonl (measured by
    the accounting allocator) fits the budget and equals the recommendation's device and host
    bytes; which flags it picks where the budget forces a choice (another optimizer, then
    checkpointing), and the fastest that keeps the optimizer beside it;
  - a budget nothing fits: no recommendation, and the need it reports is exact (that many bytes
    fit, one byte less does not);
  - the sizes the flags take (bytes, KiB..TiB, fractions, any case) and the malformed ones, each
    refused with a message; --max-host-memory refused on the CPU (one memory);
  - a run (no --plan) whose plan exceeds --max-memory refuses to start and writes nothing;
  - two ranks (--plan-ranks 2): --zero joins the search, the command starts with mpirun, and
    (with mpirun) runs within the budget;
  - the emulated CUDA build answers with the GPU's layout (bf16 weights: its measured parameters
    are 1.5x the CPU's), keeps AdamW within a GPU budget through --offload optimizer (and that run
    measures what was predicted), takes its device budget from the emulated GPU's free memory when
    --max-memory is omitted, and reports the host budget when that one is short.

    python3 tests/test_plan_budget.py ./train_gpt ./test_gpt [./build/emu/train_gpt]

Prints "ok   name" or "FAIL name: detail" per check and, last, "N passed, N failed" (", N
skipped" without the emulated build or mpirun). Tolerances: none; bytes are compared exactly.
"""

import json
import os
import re
import sys

import e2e

TRAIN, TESTER, CUDA = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt", "./build/emu/train_gpt"], optional=1)
s = e2e.Suite("test_plan_budget", tester=TESTER, run_limit=60)
FIX, W = s.fix, s.root

BASE = ["-e", f"{FIX}/model.bin", "-i", f"{FIX}/train.bin", "-j", "", "-k", "", "-b", "2", "-t", "16",
        "-x", "2", "-u", "1", "-v", "0", "-s", "0", "-n", "0"]
KIB = 1024


def search(name, prog, budget, out=None, extra=(), env=None):
    """runs PROG --plan BUDGET... on the fixture; returns the search's JSON object (None on failure)"""
    cmd = [prog, "--plan", *budget, *BASE, *extra] + (["-o", out] if out else [])
    r = s.expect_ok(f"{name}: --plan {' '.join(budget)} exits 0", cmd, env)
    if r is None:
        return None, None
    lines = [line for line in r.out.splitlines() if line.startswith('{"plan_search"')]
    if not s.check(f"{name}: one JSON line", len(lines) == 1, f"{len(lines)} lines: {r.out[-400:]}"):
        return None, r
    return json.loads(lines[0])["plan_search"], r


def arg_after(argv, flag):
    """the argument after FLAG in ARGV, or None"""
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def fits(pick, budget):
    if budget["shared"]:
        return pick["device"] + pick["host"] <= budget["device"]
    return pick["device"] <= budget["device"] and pick["host"] <= budget["host"]


def run_pick(name, pick, budget, out, launcher=None):
    """runs a recommendation's argv (which holds -o OUT) for real; checks the measured memory
    against the recommendation and the budget; returns the measured record"""
    argv = pick["argv"]
    if argv[0] == "mpirun":  # the printed mpirun -np N, with the options this machine's needs
        argv = launcher + argv[3:]
    if arg_after(argv, "-o") != out:
        s.fail(f"{name}: the command has -o {out}", " ".join(argv))
        return None
    if not s.expect_ok(f"{name}: the recommended command trains", argv):
        return None
    try:
        measured = e2e.memory_record(out)["measured"]
    except (OSError, ValueError, KeyError) as e:
        s.fail(f"{name}: memory record", repr(e))
        return None
    got = {"device": measured["device_total"], "host": measured["host_total"]}
    s.check(f"{name}: measured device and host memory equal the recommendation's",
            got == {"device": pick["device"], "host": pick["host"]}, f"measured {got}, predicted {pick['device']}, {pick['host']}")
    s.check(f"{name}: measured memory fits the budget", fits(got, budget), f"measured {got}, budget {budget}")
    s.check_memory(f"{name}: measured equals planned, every category", out)
    return measured


def flags_of(pick):
    return [pick["flags"][f] for f in ("--optimizer", "--recompute", "--offload")]


# ----------------------------------------------------------------------------
# 1. CPU: budgets from roomy to tight; the recommendation trains within them

cpu_params = None
CASES = [  # budget, the recommended optimizer, --recompute, --offload, and the same-model pick's (None: none fits)
    ("1MiB", ["adamw", "none", "0"], None),            # everything fits: the flags as given
    ("670KiB", ["adafactor", "none", "0"], ["adamw", "gelu", "0"]),  # AdamW plain needs 679.75 KiB
    ("440KiB", ["adafactor", "1", "0"], None),         # only checkpointing every layer gets below
]
for budget_arg, want, want_same in CASES:
    name = f"cpu {budget_arg}"
    out = f"{W}/cpu_{budget_arg}"
    res, r = search(name, TRAIN, ["--max-memory", budget_arg], out)
    if res is None:
        continue
    rec, same = res["recommended"], res["same_model"]
    if not s.check(f"{name}: a recommendation", rec is not None, r.out[-400:]):
        continue
    s.check(f"{name}: recommends {' '.join(want)}", flags_of(rec) == want, f"recommended {rec['flags']}")
    s.check(f"{name}: one budget for everything (the CPU)", res["budget"]["shared"] and res["budget"]["host"] is None, res["budget"])
    s.check(f"{name}: the command carries the budget (the run checks it again)",
            arg_after(rec["argv"], "--max-memory") == budget_arg, " ".join(rec["argv"]))
    if want_same is None:
        s.check(f"{name}: no same-model alternative", same is None, f"same_model {same}")
    elif s.check(f"{name}: the fastest that keeps AdamW: {' '.join(want_same)}", same is not None and flags_of(same) == want_same,
                 f"same_model {same}"):
        s.check(f"{name}: the same-model pick costs more than the recommendation", same["cost"] > rec["cost"],
                f"{same['cost']} vs {rec['cost']}")
        same["argv"][same["argv"].index("-o") + 1] = out + "_same"
        run_pick(f"{name}, same model", same, res["budget"], out + "_same")
    measured = run_pick(name, rec, res["budget"], out)
    if measured and cpu_params is None:
        cpu_params = measured["parameters"]

# ----------------------------------------------------------------------------
# 2. nothing fits: no recommendation, and exactly what would be needed

def nothing_fits(name, budget_arg, extra=()):
    """a budget nothing fits: no recommendation, and the need reported is exact: that many bytes
    fit (everything a combination takes, the host store of --offload too), one byte less does not"""
    res, r = search(name, TRAIN, ["--max-memory", budget_arg], extra=extra)
    if res is None:
        return
    s.check(f"{name}: no recommendation", res["recommended"] is None, res["recommended"])
    s.check(f"{name}: says nothing fits", "nothing fits: none of the" in r.out, r.out[-400:])
    need = res["needed"]["device"]
    if not s.check(f"{name}: reports the memory needed", isinstance(need, int) and need > 0, res["needed"]):
        return
    res2, _ = search(f"{name}, the needed bytes", TRAIN, ["--max-memory", str(need)], extra=extra)
    if res2 is not None:
        rec = res2["recommended"]
        s.check(f"{name}, the needed bytes: something fits, needing exactly them",
                rec is not None and rec["device"] + rec["host"] == need, f"recommended {rec}, needed {need}")
    res3, _ = search(f"{name}, one byte less", TRAIN, ["--max-memory", str(need - 1)], extra=extra)
    if res3 is not None:
        s.check(f"{name}, one byte less: nothing fits", res3["recommended"] is None, res3["recommended"])


nothing_fits("cpu 300KiB", "300KiB")
# five layers: there --offload 1 keeps less on the "device" but more in all (the host store)
nothing_fits("cpu 5 layers 1KiB", "1KiB", ["-e", f"{FIX}/model_deep.bin"])

# ----------------------------------------------------------------------------
# 3. the sizes the flags take, and the malformed ones

for arg, want in [("1048576", 1 << 20), ("1048576B", 1 << 20), ("1024KiB", 1 << 20), ("1MiB", 1 << 20), ("1mib", 1 << 20),
                  ("0.5MiB", 1 << 19), ("1.5KiB", 1536), ("2GiB", 2 << 30), ("1TiB", 1 << 40), ("--max-memory=3KiB", 3072)]:
    budget = [arg] if arg.startswith("--") else ["--max-memory", arg]
    res, _ = search(f"size {arg}", TRAIN, budget)
    if res is not None:
        s.check(f"size {arg}: a budget of {want} bytes", res["budget"]["device"] == want, res["budget"])

res, r = search("size free", TRAIN, ["--max-memory", "free"])
if res is not None:
    s.check("size free: the host's available memory", res["budget"]["device"] > 0 and "host's available memory" in r.out,
            f"{res['budget']}: {r.out[:300]}")

for bad in ["24GB", "24gb", "1.5", "0", "-1", "24 GiB", "abc", "1e3", "0x10", "5EiB", "", ".5GiB", "1.GiB",
            "99999999999999999999", "4611686018427387905", "4194305TiB"]:
    s.expect_fail(f"size '{bad}' refused", f"flag --max-memory: '{bad}' is not a size",
                  [TRAIN, "--plan", "--max-memory", bad, *BASE])
s.expect_fail("size: --max-host-memory refused", "flag --max-host-memory: '1GB' is not a size",
              [TRAIN, "--plan", "--max-host-memory", "1GB", *BASE])
s.expect_fail("cpu: --max-host-memory is not the CPU's", "--max-host-memory: the CPU backend (train_gpt) keeps every category in host memory",
              [TRAIN, "--plan", "--max-memory", "1MiB", "--max-host-memory", "1GiB", *BASE])

# ----------------------------------------------------------------------------
# 4. a run above its budget refuses to start, before anything is allocated or written

out = f"{W}/guard"
s.expect_fail("guard: a run above --max-memory refuses to start", "more than the budget 600.00 KiB (--max-memory 600KiB)",
              [TRAIN, *BASE, "--max-memory", "600KiB", "-o", out])
s.check("guard: nothing written", not os.path.exists(out), f"{out} exists")
r = s.expect_ok("guard: --max-memory none is no budget", [TRAIN, *BASE, "--max-memory", "none", "-o", ""])

# ----------------------------------------------------------------------------
# 5. two ranks: --zero and --tp join the search; with mpirun the command runs

res, r = search("2 ranks 620KiB", TRAIN, ["--max-memory", "620KiB", "--plan-ranks", "2"], f"{W}/ranks2")
if res is not None and s.check("2 ranks 620KiB: a recommendation", res["recommended"] is not None, r.out[-300:]):
    rec = res["recommended"]
    # AdamW --zero 0 needs 679.75 KiB a rank; --zero 1 fits (617.88 KiB with its pack) at 1.78x, --tp 2 (half of each
    # layer and of wte a rank) in 400.75 KiB at 1.40x: in a model this small the gradient exchange outweighs the compute
    s.check("2 ranks 620KiB: AdamW with --tp 2 (it keeps the model, in 400.75 KiB a rank, at 1.40x against --zero 1's 1.78x)",
            rec["flags"] == {"--optimizer": "adamw", "--optimizer-state": "fp32", "--recompute": "none", "--offload": "0", "--zero": "0",
                             "--tp": "2", "--pp": "1", "--pp-schedule": "1f1b", "--loss-chunk": "0"},
            rec["flags"])
    s.check("2 ranks 620KiB: the command keeps the step's tokens (-d 64: B*T on each of the 2 ranks, not on --tp's 1 data-parallel rank)",
            "-d" in rec["argv"] and rec["argv"][rec["argv"].index("-d") + 1] == "64", rec["argv"])
    s.check("2 ranks 620KiB: the command starts with mpirun -np 2", rec["argv"][:3] == ["mpirun", "-np", "2"], rec["argv"][:4])
    mpirun, why_not = e2e.mpi_launcher(TRAIN)
    if mpirun:
        run_pick("2 ranks 620KiB", rec, res["budget"], f"{W}/ranks2", launcher=mpirun + ["2"])
    else:
        s.skip("2 ranks 620KiB: the recommended command", why_not)

# ----------------------------------------------------------------------------
# 5b. --loss-chunk joins the search: d12 at B=8, T=1024 on the CPU, where the logits (B*T*Vp fp32,
# 1.5 GiB) are the largest activation. The budget is the least total with the head in chunks of
# 4096 tokens (Adafactor, every layer recomputed): no whole head fits it, so every combination that
# fits has --loss-chunk 4096, and the search recommends one (planned only: nothing runs)

D12 = ["-e", "d12", "-b", "8", "-t", "1024", "-o", ""]
LEAST = ["--optimizer", "adafactor", "--recompute", "1,gelu,attn"]


def plan_total(name, extra):
    r = s.expect_ok(name, [TRAIN, "--plan", *BASE, *D12, *LEAST, *extra])
    m = re.search(r"^\| total +\| +([0-9.]+) MiB", r.out, re.M) if r else None
    return float(m.group(1)) if m else None


whole, chunked = plan_total("d12 B=8 T=1024: --plan, the head whole", []), plan_total("d12: --plan --loss-chunk 4096", ["--loss-chunk", "4096"])
if whole and chunked and s.check("d12 B=8 T=1024: --loss-chunk 4096 plans 4096 tokens' logits and LayerNorm output less (4096(C + Vp) floats)", abs(whole - chunked - 4096 * (768 + 50304) * 4 / 2**20) < 1,
                                 f"{whole} vs {chunked} MiB"):
    budget = f"{chunked + 1:.2f}MiB"
    res, r = search(f"d12 {budget}", TRAIN, ["--max-memory", budget], extra=D12)
    if res is not None and s.check(f"d12 {budget}: a recommendation", res["recommended"] is not None, r.out[-600:]):
        s.check(f"d12 {budget}: it has --loss-chunk 4096", res["recommended"]["flags"]["--loss-chunk"] == "4096", res["recommended"]["flags"])
        fitting = [line for line in r.out.splitlines() if line.startswith("yes ")]
        s.check(f"d12 {budget}: every combination that fits has --loss-chunk 4096 (the search's last column)",
                fitting and all(line.rstrip().endswith("| 4096") for line in fitting), "\n".join(fitting[:5]))

# ----------------------------------------------------------------------------
# 6. the emulated CUDA build: the GPU's layout, its free memory, the host budget

if CUDA is None or not os.path.isfile(CUDA):
    s.skip("emulated CUDA build", f"{CUDA or './build/emu/train_gpt'} not given or not built (make build/emu/train_gpt)")
else:
    out = f"{W}/emu"
    res, r = search("emu 32.6MiB, host 200KiB", CUDA, ["--max-memory", "32.6MiB", "--max-host-memory", "200KiB"], out)
    if res is not None and s.check("emu: a recommendation", res["recommended"] is not None, r.out[-300:]):
        rec = res["recommended"]
        s.check("emu: two budgets, device and host", not res["budget"]["shared"] and res["budget"]["host"] == 200 * KIB, res["budget"])
        # the fixture's heads of 16 get flash attention, which implies attn: --recompute attn plans
        # as none and gelu,attn as gelu, and only the first of such twins is listed (1,gelu,attn and
        # sqrt,gelu,attn stay: nothing else gives 1 or sqrt with gelu)
        rows = [l for l in r.out.splitlines() if re.match(r"^(yes|no: \w+) *\|", l) and l.count("|") >= 6]
        header = next((l for l in r.out.splitlines() if l.startswith("fits ")), "")
        col = [c.strip() for c in header.split("|")].index("--recompute") if "--recompute" in header else 5
        twins = [l for l in rows if l.split("|")[col].strip() in ("attn", "gelu,attn")]
        s.check("emu: flash attention: --recompute attn and gelu,attn are not listed (they repeat none and gelu)",
                rows and not twins and any(l.split("|")[col].strip() == "1,gelu,attn" for l in rows), "\n".join(twins[:5]))
        s.check("emu: flash attention: the repeats are counted below the table", "more plan as a row above" in r.out, r.out[-600:])
        s.check("emu: the host budget picks Adafactor (AdamW's host copy of m and v is 342.50 KiB)",
                rec["flags"]["--optimizer"] == "adafactor", rec["flags"])
        measured = run_pick("emu", rec, res["budget"], out)
        if measured and cpu_params:
            s.check("emu: bf16 weights: the parameters take 1.5x the CPU's (fp32 master + bf16 copy)",
                    2 * measured["parameters"] == 3 * cpu_params, f"emu {measured['parameters']}, cpu {cpu_params}")
    # --offload optimizer: the only way AdamW fits 32.5 MiB of GPU (its master weights and state go to the host)
    out = f"{W}/emu_opt"
    res, r = search("emu 32.5MiB", CUDA, ["--max-memory", "32.5MiB", "--max-host-memory", "64MiB"], out)
    if res is not None and s.check("emu 32.5MiB: a recommendation", res["recommended"] is not None, r.out[-300:]):
        same = res["same_model"]
        if s.check("emu 32.5MiB: AdamW fits with --offload optimizer",
                   same is not None and same["flags"]["--optimizer"] == "adamw" and "optimizer" in same["flags"]["--offload"],
                   f"same_model {same}"):
            run_pick("emu 32.5MiB, AdamW", same, res["budget"], out)
    gpu_bytes = 40 << 20
    res, r = search("emu, --max-memory omitted", CUDA, ["--max-host-memory", "1MiB"],
                    env={"CUDA_EMU_MEMORY_BYTES": str(gpu_bytes)})
    if res is not None:
        s.check("emu, --max-memory omitted: the device budget is the GPU's free memory",
                res["budget"]["device"] == gpu_bytes and "the GPU's free memory" in r.out, f"{res['budget']}: {r.out[:300]}")
    res, r = search("emu, host 100KiB", CUDA, ["--max-memory", "64MiB", "--max-host-memory", "100KiB"])
    if res is not None:
        need = res["needed"]
        if s.check("emu, host 100KiB: nothing fits, the host budget is short (Adafactor's host copies: 127.62 KiB)",
                   res["recommended"] is None and need["device"] is None and need["host"] > 100 * KIB and "closest, the host" in r.out,
                   f"{need}: {r.out[-400:]}"):
            res2, _ = search("emu, the needed host bytes", CUDA, ["--max-memory", "64MiB", "--max-host-memory", str(need["host"])])
            if res2 is not None:
                rec = res2["recommended"]
                s.check("emu, the needed host bytes: something fits, needing exactly them",
                        rec is not None and rec["host"] == need["host"], f"recommended {rec}, needed {need}")

s.finish()
