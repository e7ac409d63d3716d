"""
bench_tokenize.py: build/prepare_tokens's speed (1 thread and all of them) beside tiktoken's
encode_ordinary on one thread, on the same text, and whether their ids agree (`make bench-tokenize`).

    python3 dev/data/bench_tokenize.py                  # TinyShakespeare repeated to 100 MB
    python3 dev/data/bench_tokenize.py --mb 20          # a shorter run
    python3 dev/data/bench_tokenize.py --input my.txt   # any text (documents: blank-line blocks)

The text is cut into blank-line blocks, llm.c's TinyShakespeare documents; prepare_tokens reads it
with --docs blank-lines, and tiktoken encodes the same blocks one by one (llm.c's loop, without its
process pool): MB/s = bytes of text / wall seconds of the encoding (prepare_tokens: its whole run,
loading GPT-2's files and writing the shards included; tiktoken: the encode calls alone). Prints
the machine's CPU and one line a run; the shards are compared with tiktoken's ids when tiktoken is
installed (else that run is skipped, and said so). Measure on a quiet machine: another job on the
cores makes every number meaningless.
"""

import argparse
import glob
import os
import platform
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


def run_tool(path, bpe_dir, threads, out):
    """(seconds, tokens) of prepare_tokens on PATH with THREADS (0: all)"""
    prefix = os.path.join(out, f"t{threads}", "bench")
    cmd = [TOOL, "--docs", "blank-lines", "--val-tokens", "0", "--bpe", bpe_dir, "--threads", str(threads), "-o", prefix, path]
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
        try:
            import test_gpt2_bpe
            tk = test_gpt2_bpe.load_tiktoken_gpt2()
        except ImportError:
            print("tiktoken: skipped (not installed: pip install tiktoken)")
            return
        blocks = text.split("\n\n")
        docs = [b + "\n\n" for b in blocks[:-1]] + [blocks[-1]]
        start = time.perf_counter()
        ids = [tk.encode_ordinary(d) for d in docs]
        seconds = time.perf_counter() - start
        print(f"tiktoken encode_ordinary, {'1 thread':>8}: {nbytes / 1e6 / seconds:8.1f} MB/s  ({seconds:.2f} s)")
        want = []
        for d in ids:
            want += [gpt2_bpe.EOT_TOKEN] + d
        print(f"prepare_tokens's tokens are tiktoken's: {results[1] == want}")


if __name__ == "__main__":
    main()
