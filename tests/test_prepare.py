"""test_prepare.py: build/prepare_tokens (dev/data/prepare_tokens.c), text into token shards, against
dev/data/gpt2_bpe.py and, when it is installed, tiktoken:
  - TinyShakespeare as llm.c prepares it (a document a blank-line block, 32,768 tokens of val): the
    ids of gpt2_bpe.py and of tiktoken (llm.c's own call), the split 32,768 / 305,260, and the same
    bytes as dev/data/tinyshakespeare.py's files;
  - the same shards, byte for byte, with 1 and 3 threads and blocks of 1, 64 and 1M bytes (the
    blocks are cut where a word must end: a wrong cut changes ids);
  - random and hostile Unicode (test_gpt2_bpe.py's strings, both ends of every \\p{L}/\\p{N} run, a
    long run without white space), as JSON Lines (escaped and raw) and as a folder of text files
    (recursive, sorted), and from standard input: every document's ids are gpt2_bpe.py's (tiktoken's);
  - invalid UTF-8: refused naming file, line and byte offset; with --invalid-utf8 replace the ids of
    python's decode(errors="replace"); a lone surrogate escape in JSON alike;
  - empty files, a document longer than a shard (it runs on over shards), --val-fraction, shards
    that ./train_gpt's -i/-j globs read;
  - bad input (a missing file, a line that is not JSON, a field absent or not a string, shards of
    an earlier run, bad flags) stops naming file and line, and leaves no shard and no .tmp;
  - --overwrite removes this prefix's exact files, named, never another prefix's, a backup or an
    input; a prefix with glob characters ('run[1]/x', 'd/*') is a name; -o FILE/x is refused first;
  - the manifest: every shard with its split, tokens and checksum; train_gpt reads the set, and
    refuses a shard it does not list, a changed one, a missing one, a set without one (an
    interrupted run, killed); a short split is warned about, a short last shard named as a tail;

  - mutated text and JSON Lines (bytes changed, inserted, deleted) through the AddressSanitizer and
    UBSan build (when given): no report, and either the ids of python's reading of the same bytes
    (decode(errors="replace"), json.loads, tiktoken's U+FFFD for a lone surrogate) or, where python's
    json refuses the line, an error naming it.

    python3 tests/test_prepare.py ./build/prepare_tokens ./test_gpt ./train_gpt [./build/prepare_tokens_asan]
"""

import glob
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys

import e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "dev", "data"))
import gpt2_bpe  # noqa: E402
import test_gpt2_bpe  # noqa: E402  (its strings and its tiktoken built from the local files)

PREP, TESTER, TRAIN, PREP_ASAN = e2e.usage(sys.argv, ["./build/prepare_tokens", "./test_gpt", "./train_gpt", "[./build/prepare_tokens_asan]"], optional=1)
s = e2e.Suite("test_prepare", tester=TESTER, run_limit=120)
EOT = gpt2_bpe.EOT_TOKEN
SHAKESPEARE_VAL, SHAKESPEARE_TRAIN = 32768, 305260  # llm.c's split of TinyShakespeare


def read_shard(path):
    """the tokens of a shard, its header checked"""
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    assert header[:2] == (20240520, 1) and not any(header[3:]), f"{path}: header {header[:4]}"
    assert len(data) == 1024 + 2 * header[2], f"{path}: {len(data)} bytes for {header[2]} tokens"
    return list(struct.unpack(f"<{header[2]}H", data[1024:]))


def shards(prefix, split):
    """the shards of PREFIX (a name: '[' and '*' in it are themselves), not another prefix's"""
    return sorted(glob.glob(f"{glob.escape(prefix)}_{split}_{'[0-9]' * 6}.bin"))


def tokens_of(prefix):
    """(val tokens, train tokens) of the shards under PREFIX, each split's shards in order"""
    return tuple([t for p in shards(prefix, split) for t in read_shard(p)] for split in ("val", "train"))


def prepare(name, prefix, args, inputs, env=None, stdin=None):
    """runs the tool; returns (val, train) tokens, or None when it failed"""
    cmd = [PREP, "-o", prefix, "--bpe", BPE] + args + inputs
    if stdin is None:
        r = s.expect_ok(name, cmd, env=env)
    else:
        p = subprocess.run(cmd, input=stdin, capture_output=True, env=dict(os.environ, **(env or {})), timeout=s.run_limit)
        r = s.check(name, p.returncode == 0, f"exit code {p.returncode}: {p.stderr[:300]!r}")
    return tokens_of(prefix) if r else None


def reference(docs):
    """llm.c's stream: every document <|endoftext|> and its ids (gpt2_bpe.py)"""
    out = []
    for d in docs:
        out += [EOT] + enc.encode(d)
    return out


def reference_tiktoken(docs):
    out = []
    for d in docs:
        out += [EOT] + tk.encode_ordinary(d)
    return out


def first_difference(got, want):
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"{len(got)} vs {len(want)} tokens, first difference at {i}: {got[i:i + 6]} vs {want[i:i + 6]}"


def check_ids(name, got, docs):
    """got: the whole stream (val + train); the same as gpt2_bpe.py's and tiktoken's"""
    want = reference(docs)
    s.check(f"{name}: the ids of gpt2_bpe.py", got == want, first_difference(got, want))
    if tk is not None:
        want = reference_tiktoken(docs)
        s.check(f"{name}: the ids of tiktoken", got == want, first_difference(got, want))


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w", encoding=None if isinstance(data, bytes) else "utf-8") as f:
        f.write(data)
    return path


def same_files(a_prefix, b_prefix):
    a = [os.path.basename(p)[len(os.path.basename(a_prefix)):] for p in sorted(glob.glob(a_prefix + "_*.bin"))]
    b = [os.path.basename(p)[len(os.path.basename(b_prefix)):] for p in sorted(glob.glob(b_prefix + "_*.bin"))]
    return a == b and a and all(e2e.same_bytes(a_prefix + x, b_prefix + x) for x in a)


BPE, why = e2e.bpe_dir()
if BPE is None:
    s.skip("prepare_tokens", why)
    s.finish()
enc = gpt2_bpe.load_encoder(BPE)
try:
    tk = test_gpt2_bpe.load_tiktoken_gpt2()
except ImportError:
    tk = None
    s.skip("prepare_tokens against tiktoken", "tiktoken is not installed (pip install tiktoken); gpt2_bpe.py is the reference")

# ----------------------------------------------------------------------------
# TinyShakespeare, as llm.c prepares it

with open(test_gpt2_bpe.TEXT_PATH, encoding="utf-8") as f:
    text = f.read()
sections = text.split("\n\n")
shakespeare_docs = [sec + "\n\n" for sec in sections[:-1]] + [sections[-1]]
ts = s.path("ts", "ts")
got = prepare("TinyShakespeare: --docs blank-lines --val-tokens 32768", ts,
              ["--docs", "blank-lines", "--val-tokens", "32768"], [test_gpt2_bpe.TEXT_PATH])
if got:
    val, train = got
    s.check("TinyShakespeare: val 32,768 and train 305,260 tokens in ts_val_000000.bin, ts_train_000001.bin",
            (len(val), len(train)) == (SHAKESPEARE_VAL, SHAKESPEARE_TRAIN)
            and [os.path.basename(p) for p in shards(ts, "val") + shards(ts, "train")] == ["ts_val_000000.bin", "ts_train_000001.bin"],
            f"val {len(val)}, train {len(train)}, files {os.listdir(os.path.dirname(ts))}")
    check_ids("TinyShakespeare", val + train, shakespeare_docs)
    if tk is not None:  # llm.c's dev/data/tinyshakespeare.py, exactly
        want = tk.encode((gpt2_bpe.EOT_TEXT + text).replace("\n\n", "\n\n" + gpt2_bpe.EOT_TEXT), allowed_special={gpt2_bpe.EOT_TEXT})
        s.check("TinyShakespeare: the tokens of llm.c's tinyshakespeare.py (tiktoken)", val + train == want, first_difference(val + train, want))
    r = s.run([sys.executable, os.path.join(REPO, "dev", "data", "tinyshakespeare.py"), "--out-dir", s.path("ts_script"),
               "--tokenizer-out", s.path("ts_script", "tok.bin"), "--bpe-dir", BPE, "--input", test_gpt2_bpe.TEXT_PATH,
               "--prepare-tokens", PREP])
    if s.check("TinyShakespeare: dev/data/tinyshakespeare.py runs", r.rc == 0, r.err[-300:]):
        s.check("TinyShakespeare: tinyshakespeare.py's files are the tool's shards, byte for byte",
                e2e.same_bytes(s.path("ts_script", "tiny_shakespeare_val.bin"), ts + "_val_000000.bin")
                and e2e.same_bytes(s.path("ts_script", "tiny_shakespeare_train.bin"), ts + "_train_000001.bin"), "files differ")
    for threads, block in ((1, "1"), (3, "64"), (1, "1M"), (3, "1M")):
        p = s.path(f"ts_{threads}_{block}", "ts")
        if prepare(f"TinyShakespeare: --threads {threads} --block-size {block}", p,
                   ["--docs", "blank-lines", "--val-tokens", "32768", "--threads", str(threads), "--block-size", block],
                   [test_gpt2_bpe.TEXT_PATH]) is not None:
            s.check(f"TinyShakespeare: {threads} thread(s), blocks of {block}: the same shards byte for byte", same_files(p, ts), "differ")

# ----------------------------------------------------------------------------
# random and hostile Unicode: JSON Lines, a folder of text files, standard input

def boundary_texts():
    """both ends of every run of \\p{L} and \\p{N} (and the code points just outside), between letters,
    digits and spaces (tests/test_bpe.py's, here as documents)"""
    letters, numbers = gpt2_bpe.letter_and_number_runs()
    points = set()
    for first, last in letters + numbers:
        points.update((first - 1, first, last, last + 1))
    points = sorted(cp for cp in points if 0 < cp <= sys.maxunicode and not 0xD800 <= cp <= 0xDFFF)
    return [f"a{chr(cp)}1 {chr(cp)}x 7{chr(cp)}{chr(cp)}  {chr(cp)}" for cp in points]


hostile = (test_gpt2_bpe.TRICKY + [t for t, _ in test_gpt2_bpe.KNOWN_IDS] + test_gpt2_bpe.random_strings(3000)
           + boundary_texts()
           + ["a,b.c;d!" * 4000, "x" + "\u3000" * 3000 + "y", "\u00a0" * 2000 + "z", "'s" * 3000])
rng = random.Random(5)
for escaped in (False, True):
    path = write(s.path(f"hostile_{escaped}.jsonl"), "".join(json.dumps({"id": i, "meta": {"x": [1, 2.5e3, None, True]}, "text": d},
                                                                     ensure_ascii=escaped) + "\n" for i, d in enumerate(hostile)))
    name = "hostile Unicode as JSON Lines" + (" (\\u escapes)" if escaped else " (raw UTF-8)")
    for block in ("1M", "16"):
        p = s.path(f"hj_{escaped}_{block}", "h")
        got = prepare(f"{name}, blocks of {block}", p, ["--val-tokens", "1000", "--threads", "3", "--block-size", block], [path])
        if got:
            check_ids(f"{name}, blocks of {block}", got[0] + got[1], hostile)

folder = s.path("corpus")
files = {}
for i, d in enumerate(hostile[:400]):
    sub = ["", "b", "a/deep", "a"][i % 4]
    files[os.path.join(folder, sub, f"doc{rng.randrange(10**6):06d}_{i}.txt")] = d
files[os.path.join(folder, "empty.txt")] = ""  # an empty file: a document of its EOT alone, as in llm.c
write(os.path.join(folder, "notes.md"), "not read: neither .txt nor .jsonl")
write(os.path.join(folder, ".hidden.txt"), "not read: hidden")
for path, d in files.items():
    write(path, d.encode("utf-8"))
order = sorted(files)  # by path, byte by byte (ASCII names: str order)
got = prepare("a folder of .txt files (recursive, sorted by path)", s.path("folder", "f"), ["--val-tokens", "0"], [folder])
if got:
    s.check("a folder: --val-tokens 0 writes no val shard, train from f_train_000000.bin",
            not got[0] and [os.path.basename(p) for p in shards(s.path("folder", "f"), "train")] == ["f_train_000000.bin"],
            f"{os.listdir(s.path('folder'))}")
    check_ids("a folder of text files, one document a file, an empty file too", got[1], [files[p] for p in order])
stdin_text = "".join(hostile[:300])
got = prepare("standard input (-)", s.path("stdin", "s"), ["--val-tokens", "0"], ["-"], stdin=stdin_text.encode("utf-8"))
if got:
    check_ids("standard input: one document", got[1], [stdin_text])
got = prepare("an empty file: --val-tokens 0", s.path("empty", "e"), ["--val-tokens", "0"], [os.path.join(folder, "empty.txt")])
if got:
    s.check("an empty file: one document, its EOT alone", got == ([], [EOT]), f"{got}")
got = prepare("an empty .jsonl file", s.path("emptyj", "e"), [], [write(s.path("empty.jsonl"), "")])
if got:
    s.check("an empty .jsonl file: no document, no shard (a manifest of none)", got == ([], []) and
            [os.path.basename(p) for p in glob.glob(s.path("emptyj", "*"))] == ["e_manifest.txt"], f"{got}")

# ----------------------------------------------------------------------------
# invalid UTF-8: refused where it is, or replaced as python's decode does

bad = (b"line one\nok \xe4\xb8\xad\n" + b"bad \xff here\n" + b"\xe2\x82 cut \xed\xa0\x80 surrogate \xf4\x90\x80\x80 big \xc0\xaf overlong "
       b"\xf0\x9f\x98 \xe2\x82")
bad_path = write(s.path("bad_utf8.txt"), bad)
first_bad = bad.index(b"\xff")
r = s.expect_fail("invalid UTF-8: refused by default", f"{bad_path}:3: invalid UTF-8 at byte offset {first_bad}",
                  [PREP, "-o", s.path("badu", "b"), "--bpe", BPE, bad_path])
got = prepare("invalid UTF-8: --invalid-utf8 replace", s.path("badr", "b"), ["--invalid-utf8", "replace", "--val-tokens", "0"], [bad_path])
if got:
    check_ids("invalid UTF-8 replaced: python's decode(errors=\"replace\")", got[1], [bad.decode("utf-8", errors="replace")])
    for block in ("1", "5"):
        again = prepare(f"invalid UTF-8 replaced, blocks of {block}", s.path(f"badr{block}", "b"),
                        ["--invalid-utf8", "replace", "--val-tokens", "0", "--block-size", block], [bad_path])
        s.check(f"invalid UTF-8 replaced, blocks of {block}: the same ids", again == got, "differ")
lone = write(s.path("lone.jsonl"), '{"text": "fine"}\n{"text": "a \\ud800 b \\udc00\\ud83d\\ude00 c"}\n')
s.expect_fail("a lone surrogate escape in JSON: refused, naming the line", f"{lone}:2: not JSON: a lone surrogate escape",
              [PREP, "-o", s.path("lone", "l"), "--bpe", BPE, lone])
got = prepare("a lone surrogate escape: --invalid-utf8 replace", s.path("loner", "l"), ["--invalid-utf8", "replace", "--val-tokens", "0"], [lone])
if got:
    check_ids("a lone surrogate escape replaced by U+FFFD", got[1], ["fine", "a \ufffd b \ufffd\U0001F600 c"])

# ----------------------------------------------------------------------------
# shards: a document longer than a shard, --val-fraction, what train_gpt reads

long_doc = " ".join(hostile[:800])
want = reference([long_doc])
got = prepare("a document longer than a shard: --shard-tokens 1000 --val-tokens 2500", s.path("long", "l"),
              ["--shard-tokens", "1000", "--val-tokens", "2500", "--threads", "3", "--block-size", "100"], [write(s.path("long.txt"), long_doc)])
if got:
    sizes = {split: [len(read_shard(p)) for p in shards(s.path("long", "l"), split)] for split in ("val", "train")}
    rest = len(want) - 2500
    s.check("a long document: val 1000, 1000, 500; train shards of 1000 and the rest",
            sizes["val"] == [1000, 1000, 500] and sizes["train"] == [1000] * (rest // 1000) + ([rest % 1000] if rest % 1000 else []),
            f"{sizes} for {len(want)} tokens")
    s.check("a long document: the shards join to its ids", got[0] + got[1] == want, first_difference(got[0] + got[1], want))
    names = [os.path.basename(p) for p in shards(s.path("long", "l"), "val") + shards(s.path("long", "l"), "train")]
    s.check("a long document: shards numbered on from val to train", names == [f"l_{'val' if i < 3 else 'train'}_{i:06d}.bin" for i in range(len(names))], f"{names}")
for fraction, shard in (("0.25", "100M"), ("0.25", "1000"), ("0", "100M"), ("1", "100M")):
    p = s.path(f"frac_{fraction}_{shard}", "f")
    got = prepare(f"--val-fraction {fraction} --shard-tokens {shard}", p, ["--val-fraction", fraction, "--shard-tokens", shard], [s.path("long.txt")])
    if got:
        first = min(len(want), 1000 if shard == "1000" else len(want))
        k = int(float(fraction) * first + 0.5)
        s.check(f"--val-fraction {fraction} --shard-tokens {shard}: val is {fraction} of the first shard ({k} tokens)",
                len(got[0]) == k and got[0] + got[1] == want, f"val {len(got[0])}, train {len(got[1])}")
ts_small = s.path("ts_small", "ts")
if prepare("TinyShakespeare in shards of 100,000 tokens", ts_small, ["--docs", "blank-lines", "--shard-tokens", "100K"], [test_gpt2_bpe.TEXT_PATH]):
    run = s.path("train_run")
    r = s.expect_ok("./train_gpt -i 'ts_train_*.bin' -j 'ts_val_*.bin' trains on them", [TRAIN, "-e", "tiny", "-i", ts_small + "_train_*.bin",
                    "-j", ts_small + "_val_*.bin", "-k", "", "-b", "2", "-t", "32", "-x", "2", "-v", "2", "-m", "1", "-s", "0", "-o", run])
    if r:
        s.check("./train_gpt on the shards: a finite loss below ln(V) + 1", all(0 < row[1] < 11.8 for row in e2e.train_rows(run)), f"{e2e.train_rows(run)}")
r = s.run([PREP, "-o", s.path("progress", "p"), "--bpe", BPE, test_gpt2_bpe.TEXT_PATH])
s.check("the progress line on stderr: bytes, documents, tokens, MB/s",
        re.search(r"^1\.1 of 1\.1 MB, 1 documents, \d+ tokens, [0-9.]+ MB/s \(\d+ threads\)$", r.err, re.M), r.err[-300:])

# ----------------------------------------------------------------------------
# bad input: a clear error, file and line, no shard and no .tmp left

jl = write(s.path("err", "data.jsonl"), '{"text": "one"}\n\n{"text": "two"}\n{"text": "three", }\n')
out = s.path("err_out", "x")
s.expect_fail("error: a missing input", "input '/nonexistent/in.txt' not found", [PREP, "-o", out, "--bpe", BPE, "/nonexistent/in.txt"])
s.expect_fail("error: a line that is not JSON names file:line and column", f"{jl}:4: not JSON: an object key that is not a string at column 19",
              [PREP, "-o", out, "--bpe", BPE, jl])
s.expect_fail("error: a line that is a JSON array", f":1: a JSON value that is not an object",
              [PREP, "-o", out, "--bpe", BPE, write(s.path("err", "arr.jsonl"), '[1, 2]\n')])
s.expect_fail("error: a field absent names file:line and --field", f"{jl}:1: no field \"body\" in this object\n  hint: --field NAME",
              [PREP, "-o", out, "--bpe", BPE, "--field", "body", jl])
s.expect_fail("error: a field that is not a string", ":2: the field \"text\" is not a string",
              [PREP, "-o", out, "--bpe", BPE, write(s.path("err", "num.jsonl"), '{"text": "a"}\n{"text": 5}\n')])
cut = write(s.path("err", "cut.jsonl"), "".join(json.dumps({"text": d}) + "\n" for d in hostile[:2000]) + '{"text": "cut')
s.expect_fail("error: a bad line after shards were written: they are removed", f"{cut}:2001: not JSON: a string without its closing quote",
              [PREP, "-o", out, "--bpe", BPE, "--shard-tokens", "1000", "--block-size", "64", cut])
s.check("error: no shard left by the failed run", not glob.glob(out + "*"), f"{glob.glob(out + '*')}")
for flag, value, phrase in (("--val-fraction", "1.5", "want a fraction from 0 to 1"), ("--shard-tokens", "3G", "want a whole number from 1"),
                            ("--docs", "lines", "--docs 'lines': want file | blank-lines"), ("--threads", "x", "--threads 'x' is not a number"),
                            ("--format", "csv", "--format 'csv': want auto | text | jsonl"), ("--bogus", "1", "unknown flag '--bogus'")):
    s.expect_fail(f"error: {flag} {value}", phrase, [PREP, "-o", out, "--bpe", BPE, flag, value, jl])
s.expect_fail("error: --val-tokens with --val-fraction", "both given", [PREP, "-o", out, "--bpe", BPE, "--val-tokens", "5", "--val-fraction", "0.5", jl])
s.expect_fail("error: no -o", "no output given", [PREP, "--bpe", BPE, jl])
s.expect_fail("error: a folder without .txt or .jsonl", "holds no .txt or .jsonl file", [PREP, "-o", out, "--bpe", BPE, s.path("logs")])
stale = s.path("stale", "x")
small = write(s.path("small.jsonl"), '{"text": "one"}\n{"text": "two"}\n')
if prepare("--overwrite: a first run of several shards", stale, ["--shard-tokens", "1000", "--val-tokens", "0"], [s.path("long.txt")]):
    before = len(glob.glob(stale + "_*.bin"))
    s.expect_fail("error: shards of an earlier run under the same name", f"already has {before + 1} file(s) of an earlier run under this name (",
                  [PREP, "-o", stale, "--bpe", BPE, small])
    got = prepare("--overwrite: a second, smaller corpus", stale, ["--overwrite", "--val-tokens", "0"], [small])
    if got:
        s.check(f"--overwrite: the {before} shards of the first run are gone, the new one holds the new corpus",
                before > 1 and [os.path.basename(p) for p in glob.glob(stale + "_*.bin")] == ["x_train_000000.bin"]
                and got[1] == reference(["one", "two"]), f"{glob.glob(stale + '_*.bin')}")

# ----------------------------------------------------------------------------
# --overwrite removes only this prefix's exact files (issue 38, item 9); a prefix with glob
# characters still sees its earlier shards (item 10)

ow = s.path("ow")
tiny = write(s.path("tiny.jsonl"), '{"text": "one two three"}\n')
if prepare("--overwrite: an earlier run of 'mine'", os.path.join(ow, "mine"), ["--shard-tokens", "1000", "--val-tokens", "1000"], [s.path("long.txt")]) \
        and prepare("--overwrite: another prefix 'mine_train' in the same folder", os.path.join(ow, "mine_train"), [], [tiny]):
    backup = write(os.path.join(ow, "mine_train_v1_backup.bin"), b"a file of the user's")
    others = sorted(glob.glob(os.path.join(ow, "mine_train_train_*")) + [os.path.join(ow, "mine_train_manifest.txt"), backup])
    mine_before = sorted(shards(os.path.join(ow, "mine"), "val") + shards(os.path.join(ow, "mine"), "train") + [os.path.join(ow, "mine_manifest.txt")])
    as_input = shards(os.path.join(ow, "mine"), "train")[-1]
    s.expect_fail("--overwrite: a shard of the prefix given as an input is refused, nothing removed",
                  f"--overwrite would remove '{as_input}', which is the input", [PREP, "-o", os.path.join(ow, "mine"), "--bpe", BPE,
                  "--overwrite", "--format", "text", as_input])
    r = s.run([PREP, "-o", os.path.join(ow, "mine"), "--bpe", BPE, "--overwrite", "--val-tokens", "0", tiny])
    removed = sorted(line.split()[1] for line in r.out.splitlines() if line.startswith("removed "))
    s.check("--overwrite: removes this prefix's shards and manifest, each named, and nothing else (not mine_train_*, not a backup)",
            r.rc == 0 and removed == mine_before and all(os.path.exists(p) for p in others)
            and sorted(glob.glob(os.path.join(ow, "mine_*"))) == sorted(others + [os.path.join(ow, "mine_train_000000.bin"),
                                                                                  os.path.join(ow, "mine_manifest.txt")]),
            f"exit {r.rc}, removed {removed}, folder {sorted(os.listdir(ow))}: {r.err[-200:]}")
    r = s.run([PREP, "-o", os.path.join(ow, "*"), "--bpe", BPE, "--overwrite", "--val-tokens", "0", tiny])
    s.check("--overwrite with -o 'DIR/*': removes no other prefix's files (the prefix is a name, not a pattern)",
            r.rc == 0 and "removed" not in r.out and all(os.path.exists(p) for p in others), f"exit {r.rc}: {r.out[-300:]}")
globby = s.path("run[1]", "x")
if prepare("a prefix with glob characters 'run[1]/x': a first corpus", globby, ["--val-tokens", "0", "--shard-tokens", "1000"], [s.path("long.txt")]):
    s.expect_fail("a prefix with glob characters: a second run sees the first's shards", "already has",
                  [PREP, "-o", globby, "--bpe", BPE, "--val-tokens", "0", tiny])
    got = prepare("a prefix with glob characters: --overwrite, a smaller corpus", globby, ["--overwrite", "--val-tokens", "0"], [tiny])
    s.check("a prefix with glob characters: --overwrite leaves the second corpus alone, no shard of the first",
            got == ([], reference(["one two three"])) and sorted(os.listdir(os.path.dirname(globby))) == ["x_manifest.txt", "x_train_000000.bin"],
            f"{sorted(os.listdir(os.path.dirname(globby)))}")

# ----------------------------------------------------------------------------
# the manifest (item 11): written last; the trainer refuses a set without one, or that disagrees

TRAIN_ARGS = ["-e", "tiny", "-k", "", "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-s", "0", "-o", ""]


def train_on(prefix, extra=()):
    return [TRAIN, "-i", prefix + "_train_*.bin", "-j", prefix + "_val_*.bin"] + TRAIN_ARGS + list(extra)


mf = s.path("mf", "m")
if prepare("manifest: a corpus in shards of 1000 tokens", mf, ["--shard-tokens", "1000", "--val-tokens", "2000"], [s.path("long.txt")]):
    lines = []
    if os.path.exists(mf + "_manifest.txt"):
        with open(mf + "_manifest.txt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    listed = [line.split(" ", 4) for line in lines if line.startswith("shard ")]
    made = shards(mf, "val") + shards(mf, "train")
    want = []
    for p in made:
        with open(p, "rb") as f:
            data = f.read()
        want.append(["shard", "val" if "_val_" in p else "train", str((len(data) - 1024) // 2), f"0x{e2e.shard_sum(data):08x}", os.path.basename(p)])
    s.check("manifest: its header, the tokenizer, every shard with split, tokens and checksum (python's), then end N",
            lines[:2] == ["llm.c token shards manifest 1", f"tokenizer gpt2-bpe vocab {gpt2_bpe.VOCAB_SIZE} eot {EOT}"]
            and listed == want and lines[-1:] == [f"end {len(made)}"], f"{lines[:3]} ... {lines[-1:]}; {listed[:2]} vs {want[:2]}")
    s.expect_ok("manifest: train_gpt reads the set", train_on(mf))
    extra = mf + "_train_000099.bin"
    shutil.copy(made[-1], extra)
    s.expect_fail("manifest: a shard it does not list (an earlier run's) is refused", f"token shard '{extra}' is listed in no manifest", train_on(mf))
    os.remove(extra)
    data = bytearray(open(made[3], "rb").read())
    data[2000] ^= 1
    shutil.copy(made[3], mf + ".keep")
    write(made[3], bytes(data))
    s.expect_fail("manifest: a shard changed since (one bit) is refused", f"token shard '{made[3]}' is not the one", train_on(mf))
    os.replace(mf + ".keep", made[3])
    os.rename(made[4], mf + ".gone")
    s.expect_fail("manifest: a listed shard missing is refused", f"lists the train shard '{os.path.basename(made[4])}', which the pattern",
                  train_on(mf))
    os.rename(mf + ".gone", made[4])
    if os.path.exists(mf + "_manifest.txt"):
        os.rename(mf + "_manifest.txt", mf + ".manifest_gone")
    s.expect_fail("manifest: a set without one is refused, naming the fix", "no manifest beside the token shard", train_on(mf))
    r = s.run(train_on(mf, ["--no-manifest"]))
    if r.rc != 0 and "no manifest beside" in r.err:
        s.skip("manifest: --no-manifest reads a set without one", "this train_gpt does not hand --no-manifest to the data loader yet "
               "(llmc/trainer.h's dataloader_init calls: dataloader_init_rule with o->no_manifest)")
    else:
        s.check("manifest: --no-manifest reads a set without one (llm.c's scripts make none)", r.rc == 0, f"exit {r.rc}: {r.err[-300:]}")
    if os.path.exists(mf + ".manifest_gone"):
        os.rename(mf + ".manifest_gone", mf + "_manifest.txt")
    short = s.path("short", "s")
    r = s.run([PREP, "-o", short, "--bpe", BPE, "--shard-tokens", "1000", "--val-tokens", "100", s.path("long.txt")])
    s.check("a split shorter than a step of -b 4 -t 1024: warned, with the fix", r.rc == 0 and
            "warning: the val split has 100 tokens, fewer than one step of -b 4 -t 1024 needs (4097)" in r.err, r.err[-400:])
    tail = s.path("tail", "t")  # the val split chosen so that the last train shard holds 10 tokens
    total = len(reference([long_doc]))
    if prepare("a last train shard of 10 tokens", tail, ["--shard-tokens", "1000", "--val-tokens", str((total - 10) % 1000 + 1000)],
               [s.path("long.txt")]):
        s.expect_fail("the trainer's message for a short last shard says it is the tail of its split",
                      "has 10 tokens, fewer than one step needs (33 = B*T*processes + 1): it is the last of the",
                      [TRAIN, "-i", tail + "_train_*.bin", "-j", ""] + TRAIN_ARGS[:4] + ["-b", "1"] + TRAIN_ARGS[6:])

# an interrupted run: killed after a few shards (the shards stay, no manifest): the trainer refuses them
killed = s.path("killed", "k")
p = subprocess.Popen([PREP, "-o", killed, "--bpe", BPE, "--shard-tokens", "10000", "--val-tokens", "0", "--block-size", "1000", "-"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
with open(s.path("long.txt"), "rb") as f:
    text = f.read()
p.stdin.write(text * (3 * 2**20 // len(text) + 1))  # 3 MB: reads of 1 MB, the last waits for more
p.stdin.flush()
wrote = [p.stdout.readline() for _ in range(3)]  # three shards written; standard input still open
p.kill()
p.wait()
s.check("an interrupted run (SIGKILL after 3 shards): the shards are there, no manifest",
        len(shards(killed, "train")) >= 3 and not os.path.exists(killed + "_manifest.txt"), f"{wrote} {os.listdir(os.path.dirname(killed))}")
for leftover in glob.glob(killed + "_*.tmp"):  # the shard being written when it was killed: the next run removes it, as this
    os.remove(leftover)                        # test does, so that the trainer's check below sees only what it must refuse
s.expect_fail("an interrupted run's shards: the trainer refuses them, naming the fix", "no manifest beside the token shard",
              [TRAIN, "-i", killed + "_train_*.bin", "-j", ""] + TRAIN_ARGS)

# -o FILE/x: refused before any input is read (standard input held open: a run that reads first waits)
not_dir = write(s.path("a_file"), "x")
p = subprocess.Popen([PREP, "-o", os.path.join(not_dir, "x"), "--bpe", BPE, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
try:
    p.wait(timeout=20)  # (not communicate: it would close standard input)
    err = p.stderr.read()
    p.stdin.close()
    s.check("-o FILE/x: refused before reading any input, naming the file", p.returncode == 1 and "is a file, not a folder" in err
            and e2e.FAIL_LOCATION_RE.search(err), f"exit {p.returncode}: {err[-300:]}")
except subprocess.TimeoutExpired:
    p.kill()
    p.communicate()
    s.fail("-o FILE/x: refused before reading any input, naming the file", "it waited for standard input: the output is checked after reading")

# ----------------------------------------------------------------------------
# mutated inputs through the sanitizer build: no report, python's ids or a clean refusal

MUTATIONS = 120
SEEDS = [b'{"text": "hello \\u00e9 w\\n\\"orld", "a": [1, 2, {"b": null}], "c": -1.5e3, "d": true}\n',
         b'{"id": 7, "text": "x\\ud83d\\ude00y \\t", "text2": "z"}\n\n',
         "caf\u00e9 \u3000 na\u00efve 'll 're\n\n\n  x\n\u00a0\u2028q\n\n".encode(), b"\xe2\x82\xac \xf0\x9f\x98\x80 \xff\xc0\xaf\n\n"]


def python_docs(data, jsonl, blank_lines):
    """python's documents of DATA (bytes), or None where python's json refuses a line"""
    if not jsonl:
        text = data.decode("utf-8", errors="replace")
        if not blank_lines:
            return [text]
        parts = text.split("\n\n")
        return [p + "\n\n" for p in parts[:-1]] + [parts[-1]]
    docs = []
    for line in data.split(b"\n"):
        line = line.decode("utf-8", errors="replace")
        if not line.strip(" \t\r"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            return None
        docs.append(obj["text"].encode("utf-16", "surrogatepass").decode("utf-16", "replace"))  # tiktoken's U+FFFD
    return docs


FRAGMENTS = [b"]", b"}", b"[", b"{", b",", b":", b'"', b"\\", b"\\u", b"\\ud800", b"\\udc00", b"\\u00", b"1e", b"-0.",
             b"tru", b"null", b" ", b"\n", b"\n\n", b"\x00", b"\x1f", b"\xed\xa0\x80", b"\xc0", b"\xf0\x9f", b"\xe3\x80\x80"]


def mutate(rng):
    """a seed, a few times over, with bytes changed, fragments of JSON and UTF-8 put in, bytes cut out"""
    data = bytearray(rng.choice(SEEDS) * rng.randint(1, 4))
    for _ in range(rng.randint(0, 6)):
        pos = rng.randrange(len(data) + 1)
        op = rng.randrange(4) if pos < len(data) else 1
        if op == 0:
            data[pos] = rng.randrange(256)
        elif op == 1:
            data[pos:pos] = rng.choice(FRAGMENTS)
        elif op == 2:
            del data[pos]
        else:
            del data[pos:pos + rng.randint(1, 20)]
    return bytes(data)


# lines at the edges of JSON, each alone: python's json reads them (the ids must be python's) or not
# (an error naming the line)
JSON_EDGES = [
    '{"text": "a"]', '{"text": "a",}', '{"text" "a"}', "{'text': 'a'}", '{"text": "a"} x', '{"text": "a\x01"}',
    '{"text": "\\x"}', '{"text": "\\u12"}', '{"a": 01, "text": "b"}', '{"a": 1., "text": "b"}', '{"a": .5, "text": "b"}',
    '{"a": [1,], "text": "b"}', '{"a": {"b"}, "text": "c"}', '{"text": "a"', '{"text": tru}', '{"a": -, "text": "b"}',
    '{"a": 1e, "text": "b"}', '[{"text": "a"}]', '"text"', '{"text": null}', '{"text": ["a"]}', '{"text": "a", "text": "b"}',
    ' \t{"x": {"text": 1}, "text": "t"} \r', '{"text": "\\/\\b\\f\\n\\r\\t\\"\\\\"}', '{"a": -0.0e+5, "b": 1E-2, "text": ""}',
    '{"a": [[], {}, [{}]], "text": "\\u00e9\\u4e2d\\ud83d\\ude00"}', '{"text": "\\uD83D\\uDE00 upper"}', '{}', '{"TEXT": "a"}',
]


edge_bad = []
for k, line in enumerate(JSON_EDGES):
    path = write(s.path("edges", f"e{k}.jsonl"), line + "\n")
    prefix = s.path("edges", f"out{k}", "e")
    r = s.run([PREP, "-o", prefix, "--bpe", BPE, "--val-tokens", "0", path])
    want = python_docs((line + "\n").encode(), True, False)
    if want is None and (r.rc != 1 or f"{path}:1: " not in r.err or glob.glob(prefix + "*")):
        edge_bad.append(f"{line!r}: python refuses it; exit {r.rc}: {r.err[:150]!r}")
    elif want is not None and (r.rc != 0 or sum(tokens_of(prefix), []) != reference(want)):
        edge_bad.append(f"{line!r}: python reads {want!r}; exit {r.rc}: {r.err[:150]!r}")
s.check(f"{len(JSON_EDGES)} JSON lines at the edges of the grammar: read as python's json reads them, or refused naming the line",
        not edge_bad, " | ".join(edge_bad[:4]))

if PREP_ASAN is None:
    s.skip("mutated inputs under ASan and UBSan", "no build/prepare_tokens_asan given")
else:
    rng, bad = random.Random(11), []
    for case in range(MUTATIONS):
        data, jsonl, blank = mutate(rng), case % 2 == 0, case % 4 == 1
        path = write(s.path("mutated", f"case{'.jsonl' if jsonl else '.txt'}"), data)
        prefix = s.path("mutated", "out", "m")
        cmd = [PREP_ASAN, "-o", prefix, "--bpe", BPE, "--overwrite", "--invalid-utf8", "replace", "--val-tokens", "0",
               "--block-size", str(rng.choice([1, 7, 64])), "--docs", "blank-lines" if blank else "file", path]
        r = s.run(cmd, env={"ASAN_OPTIONS": "detect_leaks=0", "OMP_NUM_THREADS": "3"})
        want = python_docs(data, jsonl, blank)
        if r.crashed() or "Sanitizer" in r.err or "runtime error" in r.err:
            bad.append(f"case {case} {data[:60]!r}: exit {r.rc}: {r.err[-200:]}")
        elif want is None:
            if r.rc != 1 or not e2e.FAIL_LOCATION_RE.search(r.err) or f"{path}:" not in r.err or glob.glob(prefix + "*"):
                bad.append(f"case {case} {data[:60]!r}: python refuses it; exit {r.rc}: {r.err[-200:]}")
        elif r.rc != 0:
            bad.append(f"case {case} {data[:60]!r}: python reads it; exit {r.rc}: {r.err[-200:]}")
        elif sum(tokens_of(prefix), []) != reference(want):
            bad.append(f"case {case} {data[:60]!r}: {first_difference(sum(tokens_of(prefix), []), reference(want))}")
    s.check(f"{MUTATIONS} mutated texts and JSON Lines under ASan and UBSan: no report; python's ids, or refused as python refuses",
            not bad, f"{len(bad)} cases: " + " | ".join(bad[:3]))
    r = s.run([PREP_ASAN, "-o", s.path("asan_ts", "t"), "--bpe", BPE, "--docs", "blank-lines", "--block-size", "100", test_gpt2_bpe.TEXT_PATH])
    s.check("TinyShakespeare under ASan (leaks included): exit 0, no report", r.rc == 0 and "Sanitizer" not in r.err, r.err[-300:])

s.finish()
