"""readme_gen.py: README.md and doc/*.md against the program and the code, so they cannot drift from
them: the parts the program prints (its -h, the presets, --plan's answers), README's path through the
code, and every relative link.

    python3 scripts/readme_gen.py --check    # make test: every check below; exit 1 if one fails
    python3 scripts/readme_gen.py --write    # rewrite the generated parts (after a change that moves them)

1. Generated parts. A part sits between two markers in README.md or in one file of doc/ (once in all
   of them), which the rest of the file keeps:

    <!-- gen:usage -->
    ...what usage() below makes from `./train_gpt -h`...
    <!-- /gen -->

   Each name is one function of GENERATORS, which runs the CPU trainer (--train, ./train_gpt) or the
   emulated CUDA build (--emu, build/emu/train_gpt: the same source as train_gpt_cu, and its --plan
   needs no GPU) and formats what it prints. Only what the program prints goes in a part: measured
   figures (timings, peak RSS) stay outside, with their machine and date. A part whose program is not
   built is skipped, and says so; a marker without a generator, a generator without its marker, or a
   marker in two places fails.
2. The path through the code: README's section "A path through the code" is a list of entries
   "- `FILE` `FUNCTION`, `FUNCTION` — what it teaches". Each entry's file must exist and define each
   function it names (a C or C++ definition: the name, its parenthesized arguments, then `{`; or a
   #define of it; a call or a prototype is not one). An entry out of that shape fails too, so that a
   slip cannot hide one from the check.
3. Links: every relative link [text](target) of README.md and doc/*.md must reach an existing file,
   and a #fragment into a Markdown file (or within one) one of its headings, as GitHub makes their ids.

--check prints "ok" or "FAIL" per part, entry and file, and "N passed, N failed" last.
"""

import argparse
import difflib
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
README = os.path.join(ROOT, "README.md")
DOC = os.path.join(ROOT, "doc")
GEN_RE = re.compile(r"(<!-- gen:([a-z0-9_]+) -->\n)(.*?)(<!-- /gen -->)", re.S)
GPU_NAME = "./train_gpt_cu"  # how README names the CUDA trainer whose plans the emulated build makes
GIB = 2.0 ** 30
GPT2_NAMES = {"d12": "GPT-2 124M", "d24": "GPT-2 medium", "d36": "GPT-2 large", "d48": "GPT-2 XL"}


class Missing(Exception):
    """a program a part needs is not built"""


def run(prog, args, refusal=None):
    """PROG's stdout with ARGS (run from the repository root); Missing if PROG is not there; None if
    it stops with a message containing REFUSAL (a flag the backend does not build)"""
    if not os.path.isfile(os.path.join(ROOT, prog)):
        raise Missing(f"{prog} is not built (make {prog.lstrip('./')})")
    p = subprocess.run([prog] + args, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0 and refusal is not None and refusal in p.stderr:
        return None
    if p.returncode != 0:
        raise RuntimeError(f"{prog} {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[:400]}")
    return p.stdout


def plan_json(out):
    """the {"plan_search": ...} object, the last line of a --plan search"""
    return json.loads(out.strip().splitlines()[-1])["plan_search"]


# ----------------------------------------------------------------------------
# the parts

def usage(a):
    """`./train_gpt -h`, but its first line (the program's path)"""
    lines = run(a.train, ["-h"]).splitlines()[1:]
    return "```\n" + "\n".join(lines) + "\n```\n"


def presets(a):
    """the -e presets: -h's list, with each one's parameter count from --plan's memory table (4P)"""
    line = run(a.train, ["-h"]).splitlines()[-1]
    found = re.findall(r"(\w+) \(L=(\d+) C=(\d+) NH=(\d+)\)", line)
    rows = ["| preset | L | C | NH | parameters |", "|---|---|---|---|---|"]
    for name, L, C, NH in found:
        table = run(a.train, ["--plan", "-e", name, "-b", "1", "-t", "64", "-o", ""])
        mib = float(re.search(r"^\| parameters +\| +([0-9.]+) MiB", table, re.M).group(1))
        P = mib * 2 ** 20 / 4
        count = f"{P / 1e9:.2f}B" if P >= 1e9 else f"{P / 1e6:.1f}M"
        rows.append(f"| `{name}` | {L} | {C} | {NH} | {count}{' (' + GPT2_NAMES[name] + ')' if name in GPT2_NAMES else ''} |")
    tail = re.search(r"; (GPT-2's vocabulary and maxT \d+)$", line)
    return "\n".join(rows) + f"\n\nAll with {tail.group(1) if tail else 'GPT-2 vocabulary'} (from `./train_gpt -h`).\n"


D48_ARGS = ["--plan", "-e", "d48", "-b", "8", "-t", "1024", "--max-memory", "40GiB", "--max-host-memory", "64GiB"]


def d48_40gib(a):
    """--plan's answer for d48 on a 40 GiB GPU, condensed: the header, the first rows that fit and
    the first that do not, and the recommendations"""
    out = run(a.emu, D48_ARGS).replace(a.emu, GPU_NAME)
    lines, j = out.splitlines(), plan_json(out)
    rows = [l for l in lines if re.match(r"^(yes|no: \w+) +\|", l)]
    head = next(i for i, l in enumerate(lines) if l.startswith("fits "))
    rec = next(i for i, l in enumerate(lines) if l.startswith("recommended"))
    fits = [l for l in rows if l.startswith("yes")]
    not_fit = [l for l in rows if not l.startswith("yes")]
    body = lines[:2] + ["cost model: ..."] + [lines[head]] + fits[:4] + ["..."] + not_fit[:2] + ["..."] + lines[rec:-1]
    return (f"The answer for d48 on a 40 GiB GPU (`{GPU_NAME} {' '.join(D48_ARGS)}`; condensed: {j['fitting']} of the "
            f"{j['combinations']} combinations fit):\n\n```\n" + "\n".join(body) + "\n```\n")


RECOMMEND = [  # build, program attribute, model, B, budgets (GiB)
    ("GPU bf16", "emu", "d12", 8, (24, 40, 80)), ("GPU bf16", "emu", "d24", 8, (24, 40, 80)),
    ("GPU bf16", "emu", "d48", 8, (24, 40, 80)), ("GPU bf16", "emu", "d12", 32, (24, 40, 80)),
    ("GPU bf16", "emu", "d24", 32, (24, 40, 80)), ("CPU fp32", "train", "d12", 8, (24,)),
    ("CPU fp32", "train", "d24", 8, (24,)), ("CPU fp32", "train", "d48", 8, (24,)),
]


def flags_text(flags, keep_optimizer=False):
    """{"--optimizer": "adamw", "--recompute": "none", ...} -> "`--recompute sqrt`" (what differs from plain)"""
    plain = {"--optimizer": "adamw", "--optimizer-state": "fp32", "--recompute": "none", "--offload": "0", "--zero": "0", "--loss-chunk": "0"}
    parts = [f"{k} {v}" for k, v in flags.items() if plain.get(k) != v and not (keep_optimizer and k == "--optimizer")]
    return f"`{' '.join(parts)}`" if parts else "(plain)"


def recommendations(a):
    """the recommended flags at T=1024 for each model, batch and budget: --plan's JSON line"""
    rows = ["| build | model | B | budget | recommended | cost | device | host | fastest keeping AdamW |",
            "|---|---|---|---|---|---|---|---|---|"]
    for build, prog, model, B, budgets in RECOMMEND:
        cells_by_budget = []
        for gib in budgets:
            args = ["--plan", "-e", model, "-b", str(B), "-t", "1024", "--max-memory", f"{gib}GiB"]
            if prog == "emu":
                args += ["--max-host-memory", "64GiB"]
            j = plan_json(run(getattr(a, prog), args))
            rec, same = j["recommended"], j["same_model"]
            if rec is None:
                cells = ["none fits", "-", "-", "-", "-"]
            else:
                host = f"{rec['host'] / GIB:.1f} GiB" if build.startswith("GPU") else "0"
                keep = "the same" if rec["flags"]["--optimizer"] == "adamw" else "none fits" if same is None else \
                    f"{flags_text(same['flags'])}: {same['cost']:.2f}x, {same['device'] / GIB:.1f} GiB"
                cells = [flags_text(rec["flags"]), f"{rec['cost']:.2f}x", f"{rec['device'] / GIB:.1f} GiB", host, keep]
            if cells_by_budget and cells_by_budget[-1][1] == cells:  # equal answers share a row: "24, 40 GiB"
                cells_by_budget[-1][0].append(gib)
            else:
                cells_by_budget.append(([gib], cells))
        for gibs, cells in cells_by_budget:
            rows.append(f"| {build} | {model} | {B} | {', '.join(map(str, gibs))} GiB | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


UNIT_BYTES = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}


def table_bytes(out, row):
    """the planned bytes of ROW ("device total") in a memory table that --plan printed"""
    m = re.search(r"^\| " + row + r" +\| +([0-9.]+) (B|KiB|MiB|GiB) ", out, re.M)
    return float(m.group(1)) * UNIT_BYTES[m.group(2)]


GPU80 = [  # model, flags: one 80 GB GPU at B=1, T=1024
    ("d72", []), ("d84", []), ("d84", ["--offload", "optimizer"]), ("d84", ["--offload", "optimizer,gradients"]),
]
GPU80_COMMON = ["-b", "1", "-t", "1024", "--optimizer", "adafactor", "--recompute", "1,gelu,attn"]


def gpu80(a):
    """the largest presets on one 80 GB GPU: --plan's device and host totals (GPU build, bf16, flash)"""
    rows = ["| model | flags (all: `" + " ".join(GPU80_COMMON) + "`) | GPU memory | host memory (pinned) | fits 80 GB (74.5 GiB) |",
            "|---|---|---|---|---|"]
    for model, flags in GPU80:
        out = run(a.emu, ["--plan", "-e", model] + GPU80_COMMON + flags)
        dev, host = (table_bytes(out, row) for row in ("device total", "host total"))
        rows.append(f"| {model} | {'`' + ' '.join(flags) + '`' if flags else '-'} | {dev / GIB:.1f} GiB | {host / GIB:.1f} GiB | "
                    f"{'yes' if dev <= 80e9 else 'no'} |")
    return "\n".join(rows) + "\n"


ZERO8_PRESETS = ["d12", "d24", "d36", "d48", "d60", "d72", "d84"]
ZERO8_COMMON = ["-b", "1", "-t", "1024", "--recompute", "sqrt", "--plan-ranks", "8"]
ZERO8_BUDGET = 80e9  # bytes a rank has: an 80 GB GPU, or 80 GB of host memory per CPU rank


def zero8x80(a):
    """per ZeRO stage, the largest preset whose plan fits 80 GB a rank on 8 ranks, and d84's plan: the
    CPU trainer's total (fp32, AdamW) and the CUDA trainer's GPU memory (bf16, flash); a stage a
    backend refuses says so. Then d84 on the CUDA trainer with --offload optimizer: the GPU's and the
    pinned host memory a rank (under --zero 2 and 3 each rank offloads its shard)"""
    rows = ["| `--zero` | CPU trainer: largest preset in 80 GB a rank | its memory a rank | d84 a rank | "
            "CUDA trainer: largest preset in 80 GB of GPU | its GPU memory | d84 a rank | "
            "d84, `--offload optimizer`: GPU a rank | its host memory a rank |",
            "|---|---|---|---|---|---|---|---|---|"]
    for stage in range(4):
        cells = [f"{stage}"]
        for prog, row in ((a.train, "total"), (a.emu, "device total")):
            fits, d84 = None, None
            for model in ZERO8_PRESETS:
                out = run(prog, ["--plan", "-e", model, "--zero", str(stage)] + ZERO8_COMMON, refusal="builds ZeRO stages up to")
                if out is None:
                    break
                b = table_bytes(out, row)
                if b <= ZERO8_BUDGET:
                    fits = (model, b)
                if model == "d84":
                    d84 = b
            if d84 is None:
                cells += ["not built (refused)", "-", "-"]
            else:
                cells += [f"{fits[0]}" if fits else "none", f"{fits[1] / GIB:.1f} GiB" if fits else "-", f"{d84 / GIB:.1f} GiB"]
        out = run(a.emu, ["--plan", "-e", "d84", "--zero", str(stage), "--offload", "optimizer"] + ZERO8_COMMON)
        cells += [f"{table_bytes(out, row) / GIB:.1f} GiB" for row in ("device total", "host total")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


TP8_LAYOUTS = [(1, 1, 0), (2, 1, 0), (4, 1, 0), (1, 1, 3), (2, 1, 1), (2, 1, 3), (4, 1, 1), (4, 1, 3),
               (1, 2, 1), (1, 2, 2), (1, 4, 1), (1, 4, 2), (1, 8, 0), (2, 2, 1), (4, 2, 0)]  # (--tp, --pp, --zero) on 8 ranks
TP8_MICRO_PER_STAGE = 2  # --pp's micro-batches a step: 2 a stage (-d), so that 1F1B's first stage holds N of them


def tp8x80(a):
    """per layout of 8 ranks (--tp, --pp, and --zero over the 8 / (tp pp) data-parallel ranks), the largest preset
    the CPU trainer plans within 80 GB a rank (fp32, AdamW, ZERO8_COMMON; --pp: its largest stage, with
    TP8_MICRO_PER_STAGE micro-batches a stage), and d84's plan a rank; a preset whose heads or padded vocabulary
    --tp does not divide is skipped, and d84's cell says why"""
    rows = ["| `--tp` | `--pp` | `--zero` | data-parallel ranks | largest preset in 80 GB a rank | its memory a rank | d84 a rank |",
            "|---|---|---|---|---|---|---|"]
    for tp, pp, zero in TP8_LAYOUTS:
        fits, d84 = None, None
        data = 8 // (tp * pp)
        micro = ["-d", str(1024 * data * TP8_MICRO_PER_STAGE * pp)] if pp > 1 else []
        for model in ZERO8_PRESETS:
            out = run(a.train, ["--plan", "-e", model, "--tp", str(tp), "--pp", str(pp), "--zero", str(zero)] + micro + ZERO8_COMMON,
                      refusal="do not split over")
            if out is None:
                if model == "d84":
                    d84 = "refused: --tp divides neither its heads nor Vp"
                continue
            b = table_bytes(out, "total")
            if b <= ZERO8_BUDGET:
                fits = (model, b)
            if model == "d84":
                d84 = f"{b / GIB:.1f} GiB"
        rows.append(f"| {tp} | {pp} | {zero} | {data} | {fits[0] if fits else 'none'} | {f'{fits[1] / GIB:.1f} GiB' if fits else '-'} | {d84} |")
    return "\n".join(rows) + "\n"


def compare_sets(a):
    """scripts/compare_flags.py's default flag sets"""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import compare_flags
    return "".join(f"{i}. {'`' + f + '`' if f else '(plain)'}\n" for i, f in enumerate(compare_flags.DEFAULT_SETS, 1))


GENERATORS = {"compare_sets": compare_sets, "usage": usage, "presets": presets, "d48_40gib": d48_40gib, "recommendations": recommendations, "gpu80": gpu80,
              "zero8x80": zero8x80, "tp8x80": tp8x80}


# ----------------------------------------------------------------------------
# the files, and a tally of what passed

def rel(path):
    return os.path.relpath(path, ROOT)


def markdown_files(a):
    """README.md and doc/*.md, or the --file ones"""
    if a.file:
        return [os.path.abspath(f) for f in a.file]
    return [README] + sorted(glob.glob(os.path.join(DOC, "*.md")))


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def ok(self, what, n=1):
        print(f"ok   {what}")
        self.passed += n

    def fail(self, what, n=1):
        print(f"FAIL {what}")
        self.failed += n


# ----------------------------------------------------------------------------
# 1. the generated parts

def generated_parts(a, texts, t):
    """checks (or with --write rewrites) every <!-- gen:NAME --> part of the files in texts"""
    where = {}  # name -> the files that hold its marker (once each time it occurs)
    for path, text in texts.items():
        for m in GEN_RE.finditer(text):
            where.setdefault(m.group(2), []).append(path)
    if not a.file:  # with --file, a part may sit in a file not given
        for name in sorted(set(GENERATORS) - set(where)):
            t.fail(f"gen:{name}: no <!-- gen:{name} --> ... <!-- /gen --> in README.md or doc/*.md")
    new = {}
    for name, paths in where.items():
        if name not in GENERATORS:
            t.fail(f"gen:{name}: {rel(paths[0])} has this marker, but scripts/readme_gen.py no such part")
            continue
        if len(paths) > 1:
            t.fail(f"gen:{name}: the part is in {len(paths)} places ({', '.join(rel(p) for p in paths)}): say it once, link to it")
            continue
        try:
            new[name] = GENERATORS[name](a)
        except Missing as e:
            print(f"skipped: gen:{name} ({e})")
            t.skipped += 1
    written = []
    for path, text in texts.items():
        if a.write:
            changed = GEN_RE.sub(lambda m: m.group(1) + new.get(m.group(2), m.group(3)) + m.group(4), text)
            if changed != text:
                with open(path, "w") as f:
                    f.write(changed)
                texts[path] = changed
                written.append(rel(path))
            continue
        for m in GEN_RE.finditer(text):
            name, old = m.group(2), m.group(3)
            if name not in new or len(where[name]) > 1:
                continue
            if old == new[name]:
                t.ok(f"gen:{name}: {rel(path)} is the program's output")
            else:
                diff = list(difflib.unified_diff(old.splitlines(), new[name].splitlines(), rel(path), "the program", lineterm="", n=0))
                t.fail(f"gen:{name}: {rel(path)} differs from the program's output (python3 scripts/readme_gen.py --write):")
                print("\n".join("    " + l for l in diff[:12]))
    if a.write:
        print(f"made {len(new)} part(s): {', '.join(sorted(new))}; rewrote {', '.join(written) if written else 'no file (each part was up to date)'}"
              + (f"; {t.skipped} skipped" if t.skipped else ""))


# ----------------------------------------------------------------------------
# 2. README's path through the code: each entry's functions are defined in its file

PATH_HEADING = "## A path through the code"
PATH_ENTRY_RE = re.compile(r"^- `([^`]+)` (`[A-Za-z_]\w*`(?:, `[A-Za-z_]\w*`)*) — \S")
PATH_ENTRY_FORM = "- `FILE` `FUNCTION`, `FUNCTION` — what it teaches"
DEFINE_RE = r"^[ \t]*#[ \t]*define[ \t]+{}\b"


def definition_span(text, name):
    """(start, end) of NAME's definition in C or C++ source TEXT, end at its closing brace (a
    macro: its line), or None: a line that begins (no indentation: not a statement inside a body)
    with declaration words and NAME(, whose balanced argument list is followed by `{`. A call
    (`x = f(...)`, `f(...);`, `return f(...)`) is not one, nor a prototype (`...);`), nor a comment"""
    macro = re.search(DEFINE_RE.format(re.escape(name)), text, re.M)
    if macro:
        return macro.start(), macro.end()
    for m in re.finditer(r"\b" + re.escape(name) + r"\s*\(", text):
        start = text.rfind("\n", 0, m.start()) + 1
        prefix = text[start:m.start()]
        if prefix[:1].isspace() or re.search(r"[=;\".]|->|//|/\*|^\*|\breturn\b", prefix):
            continue
        i = balanced_end(text, m.end() - 1, "(", ")")
        rest = text[i + 1:]
        if rest.lstrip().startswith("{"):
            return start, balanced_end(text, i + 1 + rest.index("{"), "{", "}")
    return None


def balanced_end(text, i, opening, closing):
    """the index of the bracket that closes the one at text[i]"""
    depth = 0
    while i < len(text):
        depth += {opening: 1, closing: -1}.get(text[i], 0)
        if depth == 0:
            return i
        i += 1
    return i


def defines(text, name):
    """whether C or C++ source TEXT defines function (or macro) NAME (definition_span)"""
    return definition_span(text, name) is not None


def path_entries(readme_text):
    """(line number, line) of every list entry of README's path section, or None without the section"""
    lines = readme_text.split("\n")
    try:
        first = next(i for i, l in enumerate(lines) if l.strip() == PATH_HEADING)
    except StopIteration:
        return None
    entries = []
    for i in range(first + 1, len(lines)):
        if lines[i].startswith("## ") or lines[i].startswith("# "):
            break
        if lines[i].startswith("- "):
            entries.append((i + 1, lines[i]))
    return entries


def check_path(readme, text, t):
    entries = path_entries(text)
    if not entries:
        t.fail(f"path: {rel(readme)} has no section \"{PATH_HEADING}\" with entries of the form {PATH_ENTRY_FORM}")
        return
    sources, good, functions = {}, 0, 0
    for lineno, line in entries:
        m = PATH_ENTRY_RE.match(line)
        name = f"path: {rel(readme)}:{lineno}"
        if m is None:
            t.fail(f"{name}: an entry not of the form {PATH_ENTRY_FORM}: {line[:80]}")
            continue
        path, names = m.group(1), re.findall(r"`(\w+)`", m.group(2))
        full = os.path.normpath(os.path.join(ROOT, path))
        if os.path.isabs(path) or not full.startswith(ROOT + os.sep) or not os.path.isfile(full):
            t.fail(f"{name}: `{path}` `{names[0]}`: no file {path} in the repository")
            continue
        if full not in sources:
            with open(full, errors="replace") as f:
                sources[full] = f.read()
        missing = [n for n in names if not defines(sources[full], n)]
        if missing:
            t.fail(f"{name}: `{path}` " + ", ".join(f"`{n}`" for n in missing) +
                   f": not defined in {path} (renamed or moved? fix the entry)")
            continue
        good += 1
        functions += len(names)
    if good:
        t.ok(f"path: {good} entries of README's path through the code: their {functions} functions are defined in the files named", good)
    check_path_length(readme, text, sources, t)


# the afternoon README promises, in lines of the functions a path names and in files (issue 32's
# measure): the plain CPU step, main to the AdamW update, and the CUDA step
PATH_STEPS = {"**The CPU step**": (900, 5), "**The CUDA step**": (1500, None)}


def definition_lines(text, name):
    """the lines of NAME's definition in TEXT (its first line to its closing brace; a macro: 1)"""
    span = definition_span(text, name)
    return 0 if span is None else text.count("\n", span[0], span[1]) + 1


def check_path_length(readme, text, sources, t):
    """each step's path (its entries up to "Skip on a first reading") stays within its lines and files"""
    lines = text.split("\n")
    for heading, (most_lines, most_files) in PATH_STEPS.items():
        try:
            first = next(i for i, l in enumerate(lines) if l.startswith(heading))
        except StopIteration:
            t.fail(f"path: {rel(readme)} has no paragraph starting {heading}")
            continue
        total, files = 0, set()
        for line in lines[first + 1:]:
            if line.startswith("Skip on a first reading") or line.startswith("## "):
                break
            m = PATH_ENTRY_RE.match(line)
            if m is None:
                continue
            full = os.path.normpath(os.path.join(ROOT, m.group(1)))
            if full not in sources:
                continue
            files.add(m.group(1))
            total += sum(definition_lines(sources[full], n) for n in re.findall(r"`(\w+)`", m.group(2)))
        step = heading.strip("*")
        within = total <= most_lines and (most_files is None or len(files) <= most_files)
        limit = f"at most {most_lines} lines" + (f" over at most {most_files} files" if most_files else "")
        if within:
            t.ok(f"path: {step}: {total} lines of functions over {len(files)} files ({limit})")
        else:
            t.fail(f"path: {step}: {total} lines over {len(files)} files ({', '.join(sorted(files))}): more than {limit}")


# ----------------------------------------------------------------------------
# 3. relative links, and the headings they point at

LINK_RE = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE_RE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)


def prose(text):
    """TEXT without its fenced code blocks and inline code spans (neither holds a link)"""
    text = FENCE_RE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def heading_ids(text):
    """the ids GitHub gives the headings of a Markdown text: lowercase, punctuation but - and _
    dropped, spaces as -, a repeat numbered -1, -2, ..."""
    ids, seen = set(), {}
    for line in FENCE_RE.sub("", text).split("\n"):
        m = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if not m:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def check_links(paths, texts, t):
    for path in paths:
        bad, n = [], 0
        for target in LINK_RE.findall(prose(texts[path])):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            n += 1
            file_part, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                bad.append(f"{target} (no file {rel(dest)})")
                continue
            if fragment and dest.endswith(".md"):
                if dest not in texts:
                    with open(dest, errors="replace") as f:
                        texts[dest] = f.read()
                if fragment not in heading_ids(texts[dest]):
                    bad.append(f"{target} (no heading #{fragment} in {rel(dest)})")
        if bad:
            t.fail(f"links: {rel(path)}: " + "; ".join(bad))
        else:
            t.ok(f"links: {rel(path)}: its {n} relative links reach their files and headings")


# ----------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description="README.md and doc/*.md against the program and the code")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="check; exit 1 if anything fails")
    mode.add_argument("--write", action="store_true", help="rewrite the generated parts, in whichever file each is")
    ap.add_argument("--train", default="./train_gpt", help="the CPU trainer (default ./train_gpt)")
    ap.add_argument("--emu", default="build/emu/train_gpt", help="the emulated CUDA build (default build/emu/train_gpt)")
    ap.add_argument("--file", action="append", help="a Markdown file to check (repeatable; default README.md and doc/*.md)")
    a = ap.parse_args(argv)
    paths = markdown_files(a)
    texts = {}
    for p in paths:
        with open(p) as f:
            texts[p] = f.read()
    t = Tally()
    generated_parts(a, texts, t)
    if a.write:
        return 1 if t.failed else 0
    if README in texts:
        check_path(README, texts[README], t)
    check_links(paths, texts, t)
    print(f"{t.passed} passed, {t.failed} failed" + (f", {t.skipped} skipped" if t.skipped else ""))
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
