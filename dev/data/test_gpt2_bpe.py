"""
test_gpt2_bpe.py: checks dev/data/gpt2_bpe.py and the files tinyshakespeare.py writes (through
build/prepare_tokens, which make builds first; tests/test_prepare.py tests the tool itself).

    python3 dev/data/test_gpt2_bpe.py

Prints "ok <name>" or "FAIL <name>: ..." per check, ends with "N passed, N failed",
and exits non-zero if anything failed. Stdlib only; if tiktoken is installed it is
the independent reference (built from the local BPE files, no network): our ids must
equal its ids on all of TinyShakespeare, on tricky strings and on random strings.
The file format checks read the files back with struct, not with the writer's code.
"""

import contextlib
import io
import os
import random
import struct
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_bpe  # noqa: E402
import tinyshakespeare  # noqa: E402

TEXT_PATH = os.path.join(tinyshakespeare.SHARED_DATA_DIR, "tinyshakespeare.txt")

# whitespace runs, contractions, digits, letters from many scripts, combining marks,
# emoji, controls, and the White_Space-vs-str.isspace() corner (\x1c..\x1f, \x85)
TRICKY = [
    "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", " \t\n ", "\r\n", "\r\n\r\n",
    "a  b", "a   b", "a\n\nb", "a \n b", "a\t\tb", "   leading", "trailing   ", "x \n",
    "Hello world", "hello   world  ", " \u00a0x", "\u00a0\u00a0", "\u3000日本語\u3000",
    "don't I'll we've they're she'd I'm it's", "DON'T IT'S", "'s 't 're 've 'm 'll 'd",
    "' s", "''s", " 's", "'", "''", "'x", "rock'n'roll", "o'clock'",
    "2024 12345 3.14159 -7 1e-10 0x1F", "１２３ ３４", "½ ⅔ Ⅻ ² ٣", "a1b2 c3",
    "naïve café émigré Ünïcödé", "e\u0301 a\u0308", "ǅ ﬁ ß ΣΑΣ", "Привет мир",
    "مرحبا بالعالم", "हिन्दी भाषा", "日本語のテキスト、です。", "한국어 텍스트",
    "👍🏽 family 👨‍👩‍👧 😀😀😀", "\u200b zero\u200bwidth", "\ufeffbom", "\x00\x01\x02",
    "!\x1c!", "a\x1c b", "\x1c\x1d\x1e\x1f", " \x1f x", "\x85!", "a\u2028b\u2029c",
    "x = f(y) + 3.14e-10; // done?!", "<|endoftext|>", "  !!!  ???  ", "a-b_c@d.e",
    "ROMEO:\nBut, soft! what light through yonder window breaks?\n\n",
    " " * 50 + "x", "\n" * 20, "ab" * 300,
]

# (text, ids) pairs, checked without tiktoken (ids taken from tiktoken's gpt2)
KNOWN_IDS = [
    ("Hello world", [15496, 995]),
    ("\n", [198]),
    ("\n\n", [628]),
    (" the", [262]),
    ("don't", [9099, 470]),
    ("it's", [270, 338]),
    ("  hello", [220, 23748]),
    (" 12345", [17031, 2231]),
    ("naïve café", [2616, 38776, 40304]),
    ("👍", [41840, 235]),
    ("<|endoftext|>", [27, 91, 437, 1659, 5239, 91, 29]),
]

# (text, words) for the pre-tokenizer alone
KNOWN_SPLITS = [
    ("hello   world", ["hello", "  ", " world"]),      # \s+(?!\S) leaves the last space
    ("a\n\nb", ["a", "\n", "\n", "b"]),                 # ... and a lone "\n" is \s+
    ("x  ", ["x", "  "]),                               # a run at the end stays whole
    ("it's IT'S", ["it", "'s", " IT", "'", "S"]),       # contractions are lowercase only
    (" 's", [" '", "s"]),
    ("2024 12345", ["2024", " 12345"]),
    ("e\u0301", ["e", "\u0301"]),                        # combining mark is not \p{L}
    ("!\x1c!", ["!\x1c!"]),                             # \x1c is not \s (unicode White_Space)
    ("\u00a0x", ["\u00a0", "x"]),                       # NBSP is \s but not the ' ?' space
]

# -----------------------------------------------------------------------------
# tiny test runner

results = {"passed": 0, "failed": 0}


def check(name, fn):
    """run fn(); it passes unless it raises. Prints ok/FAIL."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (any failure of a check is reported)
        results["failed"] += 1
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"FAIL {name}: {type(e).__name__}: {e} (line {where.lineno})")
        return
    results["passed"] += 1
    print(f"ok {name}")


def expect_equal(got, want, what):
    if got != want:
        # point at the first difference, lists can be long
        if isinstance(got, list) and isinstance(want, list):
            i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b),
                     min(len(got), len(want)))
            raise AssertionError(f"{what}: first difference at index {i}: got "
                                 f"{got[i:i + 5]} want {want[i:i + 5]} "
                                 f"(lengths {len(got)} vs {len(want)})")
        raise AssertionError(f"{what}: got {got!r} want {want!r}")

# -----------------------------------------------------------------------------
# readers for the two file formats, written from the format spec (not the writer)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    n = header[2]
    tokens = list(struct.unpack(f"<{n}H", data[1024:]))  # fails if the size is wrong
    return header, tokens


def read_tokenizer(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    pos, table = 1024, []
    for _ in range(header[2]):
        length = data[pos]
        table.append(data[pos + 1:pos + 1 + length])
        pos += 1 + length
    if pos != len(data):
        raise AssertionError(f"{len(data) - pos} trailing bytes after the last token")
    return header, table

# -----------------------------------------------------------------------------
# checks without tiktoken


def test_round_trip(enc):
    for s in TRICKY:
        expect_equal(enc.decode(enc.encode(s)), s, f"decode(encode({s!r}))")


def test_known_ids(enc):
    for text, ids in KNOWN_IDS:
        expect_equal(enc.encode(text), ids, f"encode({text!r})")


def test_known_splits(enc):
    for text, words in KNOWN_SPLITS:
        expect_equal(enc.pretokenizer.findall(text), words, f"split({text!r})")


def test_module_functions():
    expect_equal(gpt2_bpe.encode("Hello world"), [15496, 995], "gpt2_bpe.encode")
    expect_equal(gpt2_bpe.decode([15496, 995]), "Hello world", "gpt2_bpe.decode")
    expect_equal(gpt2_bpe.EOT_TOKEN, 50256, "EOT_TOKEN")


def test_token_bytes(enc):
    # byte tokens come first in vocab.bpe's byte-unicode order, then the merges
    want = {0: b"!", 93: b"~", 94: b"\xa1", 188: b"\x00", 256: b" t",
            15496: b"Hello", 50256: b"<|endoftext|>"}
    for token_id, b in want.items():
        expect_equal(enc.token_bytes(token_id), b, f"token_bytes({token_id})")
    singles = sorted(enc.token_bytes(i) for i in range(256))
    expect_equal(singles, [bytes([b]) for b in range(256)], "ids 0..255 are the 256 bytes")


def tokenize_documents(enc, text):
    """llm.c's tokenization, the reference: '<|endoftext|>' + text, with every '\\n\\n' followed by
    '<|endoftext|>'; each section between two EOTs encoded on its own (as tiktoken splits at
    special tokens)"""
    sections = text.split("\n\n")
    tokens = []
    for i, section in enumerate(sections):
        tokens.append(gpt2_bpe.EOT_TOKEN)
        tokens.extend(enc.encode(section if i == len(sections) - 1 else section + "\n\n"))
    return tokens


def test_documents(enc):
    # llm.c: "<|endoftext|>" + text, and after every "\n\n" another "<|endoftext|>"
    eot = gpt2_bpe.EOT_TOKEN
    got = tokenize_documents(enc, "A:\nhi\n\nB:\nyo\n")
    want = [eot] + enc.encode("A:\nhi\n\n") + [eot] + enc.encode("B:\nyo\n")
    expect_equal(got, want, "two sections")
    expect_equal(tokenize_documents(enc, "x\n\n"),
                 [eot] + enc.encode("x\n\n") + [eot], "trailing blank line")


def test_script_outputs(enc):
    # run the script end to end on a small text into a temp dir, read everything back
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
    with tempfile.TemporaryDirectory() as tmp:
        text_path = os.path.join(tmp, "small.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write(text)
        tok_path = os.path.join(tmp, "tok.bin")
        argv = ["--input", text_path, "--out-dir", tmp, "--tokenizer-out", tok_path, "--val-tokens", "8"]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            tinyshakespeare.main(argv)
            tinyshakespeare.main(argv)  # second run: outputs present, must skip
        if "already present" not in out.getvalue():
            raise AssertionError("second run did not skip the present outputs")

        want = tokenize_documents(enc, text)
        header, val = read_shard(os.path.join(tmp, "tiny_shakespeare_val.bin"))
        expect_equal(header[:3], (20240520, 1, 8), "val header")
        expect_equal(set(header[3:]), {0}, "val header padding")
        expect_equal(val, want[:8], "val tokens: the first 8")
        header, train = read_shard(os.path.join(tmp, "tiny_shakespeare_train.bin"))
        expect_equal((header[:3], train), ((20240520, 1, len(want) - 8), want[8:]), "train: the rest")
        if sorted(os.listdir(tmp)) != ["small.txt", "tiny_shakespeare_manifest.txt", "tiny_shakespeare_train.bin",
                                       "tiny_shakespeare_val.bin", "tok.bin"]:
            raise AssertionError(f"other files left: {sorted(os.listdir(tmp))}")

        header, table = read_tokenizer(tok_path)
        expect_equal(header[:4], (20240328, 2, 50257, 50256), "tokenizer header")
        expect_equal(set(header[4:]), {0}, "tokenizer header padding")
        expect_equal(table[15496] + table[995], b"Hello world", "tokenizer entries")
        expect_equal(table[50256], b"<|endoftext|>", "tokenizer eot entry")
        expect_equal(table, [enc.token_bytes(i) for i in range(50257)], "all entries")


def test_missing_input_message():
    # a missing input file stops with a message that names the file and the fix
    try:
        tinyshakespeare.main(["--input", "/nonexistent/tiny.txt", "--force"])
    except SystemExit as e:
        msg = str(e.code)
        if "/nonexistent/tiny.txt" not in msg or "hint:" not in msg:
            raise AssertionError(f"unhelpful message: {msg!r}")
        return
    raise AssertionError("did not stop on a missing input file")

# -----------------------------------------------------------------------------
# checks against tiktoken


def load_tiktoken_gpt2():
    """tiktoken's gpt2 encoding built from the local BPE files (no network)"""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's split pattern
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(gpt2_bpe.DEFAULT_BPE_DIR, gpt2_bpe.VOCAB_BPE),
        encoder_json_file=os.path.join(gpt2_bpe.DEFAULT_BPE_DIR, gpt2_bpe.ENCODER_JSON))
    return tiktoken.Encoding(name="gpt2_local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={gpt2_bpe.EOT_TEXT: gpt2_bpe.EOT_TOKEN},
                             explicit_n_vocab=gpt2_bpe.VOCAB_SIZE)


def random_strings(n, seed=1337):
    """short strings over an alphabet that stresses the pre-tokenizer and BPE"""
    rng = random.Random(seed)
    alphabet = (list(" " * 8 + "\n" * 4 + "\t\r\x0b\x0c") + list("abcdeABCDEsStTdmlrv'''") +
                list("0123456789.,;:!?-_()[]\"") + list("\xa0\x85\x1c\x1f\u2028\u3000\u200b") +
                list("éüßΣж日本語ا١½Ⅻ²\u0301\u0308") + ["👍", "🏽", "\u200d", "\ufeff", "\x00"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def test_tiktoken_tricky(enc, tk):
    for s in TRICKY + [t for t, _ in KNOWN_IDS]:
        expect_equal(enc.encode(s), tk.encode_ordinary(s), f"encode({s!r})")


def test_tiktoken_random(enc, tk):
    for s in random_strings(5000):
        expect_equal(enc.encode(s), tk.encode_ordinary(s), f"encode({s!r})")


def test_tiktoken_decode(enc, tk):
    # random id sequences, including ones that cut utf-8 characters in half
    rng = random.Random(7)
    for _ in range(2000):
        ids = [rng.randrange(gpt2_bpe.VOCAB_SIZE) for _ in range(rng.randint(1, 8))]
        expect_equal(enc.decode(ids), tk.decode(ids), f"decode({ids})")
    for i in range(gpt2_bpe.VOCAB_SIZE):
        if enc.token_bytes(i) != tk.decode_single_token_bytes(i):
            raise AssertionError(f"token_bytes({i}) differs")


def read_text():
    with open(TEXT_PATH, "r", encoding="utf-8") as f:
        return f.read()


def test_tiktoken_shakespeare(enc, tk):
    text = read_text()
    expect_equal(enc.encode(text), tk.encode_ordinary(text), "whole text")


def test_tiktoken_documents(enc, tk):
    text = read_text()
    # exactly what llm.c's tinyshakespeare.py feeds tiktoken
    eot = gpt2_bpe.EOT_TEXT
    llmc_text = (eot + text).replace("\n\n", "\n\n" + eot)
    want = tk.encode(llmc_text, allowed_special={eot})
    got = tokenize_documents(enc, text)
    expect_equal(got, want, "documents")
    expect_equal(len(got), 338028, "token count (llm.c: 32,768 val + 305,260 train)")

# -----------------------------------------------------------------------------


def main():
    t0 = time.time()
    enc = gpt2_bpe.load_encoder()
    check("round_trip", lambda: test_round_trip(enc))
    check("known_ids", lambda: test_known_ids(enc))
    check("known_splits", lambda: test_known_splits(enc))
    check("module_functions", test_module_functions)
    check("token_bytes", lambda: test_token_bytes(enc))
    check("documents", lambda: test_documents(enc))
    check("script_outputs", lambda: test_script_outputs(enc))
    check("missing_input_message", test_missing_input_message)

    try:
        tk = load_tiktoken_gpt2()
    except ImportError:
        tk = None
        print("skip tiktoken: not installed")
    if tk is not None:
        check("tiktoken_tricky", lambda: test_tiktoken_tricky(enc, tk))
        check("tiktoken_random", lambda: test_tiktoken_random(enc, tk))
        check("tiktoken_decode", lambda: test_tiktoken_decode(enc, tk))
        check("tiktoken_shakespeare", lambda: test_tiktoken_shakespeare(enc, tk))
        check("tiktoken_documents", lambda: test_tiktoken_documents(enc, tk))

    print(f"({time.time() - t0:.1f}s)")
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
