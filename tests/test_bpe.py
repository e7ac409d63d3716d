"""test_bpe.py: the C encoder of GPT-2's BPE (llmc/bpe.h, which --sample tokenizes its prompt with)
against dev/data/gpt2_bpe.py and, when it is installed, tiktoken (CI installs it):
  - the same words (the pre-tokenizer's) and ids on all of TinyShakespeare, in well under two seconds (about 0.3 s here);
  - on the tricky strings, the known ids and 5,000 random strings of dev/data/test_gpt2_bpe.py;
  - on both ends of every run of \\p{L} and \\p{N} code points (and the code points just outside),
    each between letters, digits and spaces, so that every entry of the table is looked up;
  - on long words (random letters, digits, punctuation, runs of one letter), which bpe.h merges by
    heap: the ids of its quadratic scan (the old algorithm, kept for short words) and of tiktoken;
  - llmc/bpe_unicode.h is what dev/data/make_bpe_unicode.py writes (when this python has the
    Unicode version the header was made from).

    python3 tests/test_bpe.py ./test_gpt

The C encoder runs as `test_gpt --bpe-encode DIR`: texts on stdin, each its length in bytes on a
line and then its bytes; one line of ids a text on stdout, the words apart ("64|127 244|16"), the
words against python's split (so a wrong class shows even where BPE would not merge across it),
the ids also against tiktoken's. Prints "ok   name" or "FAIL name: detail"
per check and, last, "N passed, N failed" (", N skipped"); exits 1 if any check failed.
"""

import os
import random
import re
import string
import subprocess
import sys
import time
import unicodedata

import e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "dev", "data"))
import gpt2_bpe  # noqa: E402
import make_bpe_unicode  # noqa: E402
import test_gpt2_bpe  # noqa: E402  (its strings and its tiktoken built from the local files)

(TESTER,) = e2e.usage(sys.argv, ["./test_gpt"])
s = e2e.Suite("test_bpe", tester=TESTER, run_limit=60)
BPE_DIR = gpt2_bpe.DEFAULT_BPE_DIR
SHAKESPEARE_SECONDS = 2.0   # the C encoder on TinyShakespeare (1.1 MB), loading the files included
LONG_WORD_BYTES = (31, 32, 33, 100, 1000, 20000)  # around llmc/bpe.h's BPE_HEAP_MIN_BYTES, and beyond


def c_encode(texts):
    """the C encoder's ids of each text, word by word (a list of lists: the pre-tokenizer's words),
    and the seconds the process took"""
    data = b"".join(b"%d\n" % len(t.encode("utf-8")) + t.encode("utf-8") for t in texts)
    start = time.monotonic()
    p = subprocess.run([TESTER, "--bpe-encode", BPE_DIR], input=data, capture_output=True, timeout=s.run_limit)
    seconds = time.monotonic() - start
    if p.returncode != 0:  # a failed check of the words against bpe_encode, say: the suite ends here
        s.fail("the C encoder runs (test_gpt --bpe-encode)", p.stderr.decode(errors="replace")[:300])
        s.finish()
    lines = p.stdout.decode().split("\n")[:len(texts)]
    return [[[int(x) for x in word.split()] for word in line.split("|")] if line else [] for line in lines], seconds


def flat(words):
    return [i for word in words for i in word]


def python_words(enc, text):
    """gpt2_bpe.py's ids of TEXT, word by word"""
    return [enc.encode_word(w) for w in enc.pretokenizer.findall(text)]


def first_difference(name, texts, got, want):
    """passes if got[i] == want[i] for every text, else names the first text that differs"""
    for text, g, w in zip(texts, got, want):
        if g != w:
            i = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return s.fail(name, f"{text[:60]!r}: first difference at item {i}: {g[i:i + 5]} vs {w[i:i + 5]}")
    return s.check(name, len(got) == len(want) == len(texts), f"{len(got)} results for {len(texts)} texts")


def run_boundary_texts():
    """for each run of letters and numbers: its first and last code point and the ones just
    outside it, each after a letter, a digit and a space, before a digit and a letter"""
    letters, numbers = gpt2_bpe.letter_and_number_runs()
    points = set()
    for first, last in letters + numbers:
        points.update((first - 1, first, last, last + 1))
    points = sorted(cp for cp in points if 0 < cp <= sys.maxunicode and not 0xD800 <= cp <= 0xDFFF)
    return [f"a{chr(cp)}1 {chr(cp)}x 7{chr(cp)}{chr(cp)}  {chr(cp)}" for cp in points]


def main():
    if not all(os.path.isfile(os.path.join(BPE_DIR, f)) for f in (gpt2_bpe.ENCODER_JSON, gpt2_bpe.VOCAB_BPE)):
        s.skip("the C encoder against python", f"no GPT-2 BPE files in {BPE_DIR} (see dev/data/tinyshakespeare.py)")
        s.finish()

    with open(make_bpe_unicode.OUT_PATH, encoding="utf-8") as f:
        committed = f.read()
    header_version = re.search(r'BPE_UNICODE_VERSION "([^"]*)"', committed).group(1)
    if header_version == unicodedata.unidata_version:
        s.check("llmc/bpe_unicode.h is what dev/data/make_bpe_unicode.py writes", committed == make_bpe_unicode.header_text(),
                "differs: rerun python3 dev/data/make_bpe_unicode.py")
    else:
        s.skip("llmc/bpe_unicode.h against its script",
               f"this python has Unicode {unicodedata.unidata_version}, the header {header_version}")

    enc = gpt2_bpe.load_encoder(BPE_DIR)
    try:
        tk = test_gpt2_bpe.load_tiktoken_gpt2()
    except ImportError:
        tk = None
        s.skip("the C encoder against tiktoken", "tiktoken is not installed (pip install tiktoken)")

    with open(test_gpt2_bpe.TEXT_PATH, encoding="utf-8") as f:
        text = f.read()
    (got,), seconds = c_encode([text])
    want = python_words(enc, text)
    first_difference(f"TinyShakespeare ({len(flat(want)):,} tokens): the C words and ids are gpt2_bpe.py's", [text], [got], [want])
    if tk is not None:
        first_difference("TinyShakespeare: the C ids are tiktoken's", [text], [flat(got)], [tk.encode_ordinary(text)])
    s.check(f"TinyShakespeare: the C encoder takes under {SHAKESPEARE_SECONDS:g} s (loading the files included)",
            seconds < SHAKESPEARE_SECONDS, f"{seconds:.2f} s")
    print(f"     {len(text.encode('utf-8')):,} bytes in {seconds:.3f} s")

    sets = (("tricky strings", test_gpt2_bpe.TRICKY + [t for t, _ in test_gpt2_bpe.KNOWN_IDS]),
            ("5000 random strings", test_gpt2_bpe.random_strings(5000)),
            ("both ends of every \\p{L} and \\p{N} run", run_boundary_texts()))
    for name, texts in sets:
        got, _ = c_encode(texts)
        first_difference(f"{name}: the C words and ids are gpt2_bpe.py's", texts, got, [python_words(enc, t) for t in texts])
        if tk is not None:
            first_difference(f"{name}: the C ids are tiktoken's", texts, [flat(g) for g in got], [tk.encode_ordinary(t) for t in texts])
    # long words (one pre-tokenizer word each: no white space), merged by heap: the ids of the
    # quadratic scan (test_gpt checks each word against it) and of tiktoken; small alphabets make
    # runs of one pair ("aaaa": the leftmost merges first), random letters the case
    rng = random.Random(8)
    long_words = ["".join(rng.choice(alphabet) for _ in range(n)) for n in LONG_WORD_BYTES
                  for alphabet in ("a", "ab", "abc", string.ascii_lowercase, string.ascii_letters, "0123456789", ",.;!-")]
    got, seconds = c_encode(long_words)
    s.check(f"{len(long_words)} long words ({min(LONG_WORD_BYTES)} to {max(LONG_WORD_BYTES):,} bytes): the heap's ids are the scan's "
            f"(test_gpt --bpe-encode checks each)", len(got) == len(long_words), f"{len(got)} results")
    if tk is not None:
        first_difference("long words: the C ids are tiktoken's", long_words, [flat(g) for g in got], [tk.encode_ordinary(t) for t in long_words])
    else:
        s.skip("long words against tiktoken", "tiktoken is not installed: the scan in C is the reference")
    got, _ = c_encode([t for t, _ in test_gpt2_bpe.KNOWN_IDS])
    first_difference("known ids (\"Hello world\" is 15496 995, ...)", test_gpt2_bpe.KNOWN_IDS, [flat(g) for g in got],
                     [ids for _, ids in test_gpt2_bpe.KNOWN_IDS])
    s.finish()


main()
