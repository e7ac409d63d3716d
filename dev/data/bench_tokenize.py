"""
bench_tokenize.py: build/prepare_tokens's speed (1 thread and all of them) beside tiktoken's
encode_ordinary on one thread, on the same text, and whether their ids agree (`make bench-tokenize`).

    python3 dev/data/bench_tokenize.py                  # TinyShakespeare repeated to 100 MB
    python3 dev/data/bench_tokenize.py --mb 20          # a shorter run
    python3 dev/data/bench_tokenize.py --input my.txt   # any text (documents: blank-line blocks)
    python3 dev/data/bench_tokenize.py --long-mb 20     # the long-word case at 20 MB (default 2; 0: none)

The text is cut into blank-line blocks, llm.c's TinyShakespeare documents; prepare_tokens reads it
with --docs blank-lines, and tiktoken encodes the same blocks one by one (llm.c's loop, without its
process pool): MB/s = bytes of text / wall seconds of the encoding (prepare_tokens: its whole run,
loading GPT-2's files and writing the shards included; tiktoken: the encode calls alone). Prints
the machine's CPU and one line a run; the shards are compared with tiktoken's ids when tiktoken is
installed (else that run is skipped, and said so). Then the long-word case: --long-mb MB of random
letters without white space, one word of GPT-2's pre-tokenizer that BPE merges whole (llmc/bpe.h's
heap; quadratic before), prepare_tokens on one thread beside tiktoken, and whether their ids agree.
Measure on a quiet machine: another job on the cores makes every number meaningless.
"""

import argparse
import glob
import os
import platform
import random
import string
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_bpe  # noqa: E402
import tinyshakespeare  # noqa: E402  (where TinyShakespeare and GPT-2's files are, or their download)

TOOL = tinyshakespeare.PREPARE_TOKENS


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_tool(path, bpe_dir, threads, out, docs="blank-lines"):
    """(seconds, tokens) of prepare_tokens on PATH with THREADS (0: all)"""
    prefix = os.path.join(out, f"{docs}_t{threads}", "bench")
    cmd = [TOOL, "--docs", docs, "--val-tokens", "0", "--bpe", bpe_dir, "--threads", str(threads), "-o", prefix, path]
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed:\n{p.stderr}")
    tokens = []
    for shard in sorted(glob.glob(prefix + "_train_*.bin")):
        with open(shard, "rb") as f:
            data = f.read()
        tokens += struct.unpack(f"<{(len(data) - 1024) // 2}H", data[1024:])
    return seconds, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--input", help="the text (default: TinyShakespeare)")
    ap.add_argument("--mb", type=float, default=100, help="repeat the text to at least this many MB (default 100)")
    ap.add_argument("--long-mb", type=float, default=2, help="MB of random letters without white space: the long-word case (default 2; 0: none)")
    ap.add_argument("--bpe-dir", help="GPT-2's encoder.json and vocab.bpe (default: as tinyshakespeare.py finds them)")
    args = ap.parse_args()
    if not os.path.exists(TOOL):
        sys.exit(f"error: no {TOOL}\n  hint: make build/prepare_tokens")
    text_path = tinyshakespeare.find_text(args.input)
    bpe_dir = tinyshakespeare.find_bpe_dir(args.bpe_dir)
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    if not text.endswith("\n\n"):
        text += "\n\n"  # each copy ends its last block, so that the copies are whole documents
    text = text * max(1, int(args.mb * 1e6 / len(text.encode("utf-8")) + 0.999))
    nbytes = len(text.encode("utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores; text: {text_path} to {nbytes / 1e6:.1f} MB")
        results = {}
        for threads in (1, 0):
            seconds, tokens = run_tool(corpus, bpe_dir, threads, tmp)
            results[threads] = tokens
            label = "1 thread" if threads == 1 else f"all threads ({os.cpu_count()})"
            print(f"prepare_tokens, {label:>18}: {nbytes / 1e6 / seconds:8.1f} MB/s  ({seconds:.2f} s, {len(tokens):,} tokens)")
        print(f"prepare_tokens: 1 thread and all threads write the same tokens: {results[1] == results[0]}")
        tk = load_tiktoken()
        if tk is not None:
            compare_tiktoken(tk, text, nbytes, results[1])
        if args.long_mb > 0:
            long_word(tk, bpe_dir, tmp, args.long_mb)


def load_tiktoken():
    try:
        import test_gpt2_bpe
        return test_gpt2_bpe.load_tiktoken_gpt2()
    except ImportError:
        print("tiktoken: skipped (not installed: pip install tiktoken)")
        return None


def long_word(tk, bpe_dir, tmp, mb):
    """the long-word case: MB of random letters, one document without white space"""
    rng = random.Random(0)
    text = "".join(rng.choices(string.ascii_lowercase, k=int(mb * 1e6)))
    path = os.path.join(tmp, "letters.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write(text)
    seconds, tokens = run_tool(path, bpe_dir, 1, tmp, docs="file")
    print(f"long word ({len(text) / 1e6:.1f} MB of random letters, no white space): prepare_tokens, 1 thread: {seconds:.2f} s "
          f"({len(tokens):,} tokens)")
    if tk is None:
        return
    start = time.perf_counter()
    want = [gpt2_bpe.EOT_TOKEN] + tk.encode_ordinary(text)
    print(f"long word: tiktoken encode_ordinary, 1 thread: {time.perf_counter() - start:.2f} s; the same ids: {tokens == want}")


def compare_tiktoken(tk, text, nbytes, tool_tokens):
    """tiktoken's MB/s on the same blank-line documents, and whether the ids agree"""
    blocks = text.split("\n\n")
    docs = [b + "\n\n" for b in blocks[:-1]] + [blocks[-1]]
    start = time.perf_counter()
    ids = [tk.encode_ordinary(d) for d in docs]
    seconds = time.perf_counter() - start
    print(f"tiktoken encode_ordinary, {'1 thread':>8}: {nbytes / 1e6 / seconds:8.1f} MB/s  ({seconds:.2f} s)")
    want = []
    for d in ids:
        want += [gpt2_bpe.EOT_TOKEN] + d
    print(f"prepare_tokens's tokens are tiktoken's: {tool_tokens == want}")


if __name__ == "__main__":
    main()
