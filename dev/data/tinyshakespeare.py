"""
tinyshakespeare.py: TinyShakespeare into llm.c's token shards (by build/prepare_tokens, GPT-2's BPE in
C) and GPT-2's tokenizer file.

    python3 dev/data/tinyshakespeare.py            # writes the three files below
    python3 dev/data/tinyshakespeare.py --force    # rewrite them even if present

Writes (paths are defaults, see --help):
    data/tinyshakespeare/tiny_shakespeare_val.bin    first 32,768 tokens
    data/tinyshakespeare/tiny_shakespeare_train.bin  the rest (305,260 tokens)
    data/tinyshakespeare/tiny_shakespeare_manifest.txt  the two with their tokens and checksums
    data/gpt2_tokenizer.bin                          id -> bytes table, for decoding in C

Like llm.c's dev/data/tinyshakespeare.py, every blank-line separated block of the
play (mostly one speaker's lines) is a document: it starts with <|endoftext|> and
keeps its trailing "\\n\\n". The tokens are build/prepare_tokens's (`make` builds it
first; this script builds it with make when it is missing):
    build/prepare_tokens --docs blank-lines --val-tokens 32768 -o .../tiny_shakespeare TEXT
its shards tiny_shakespeare_val_000000.bin and _train_000001.bin renamed to the names
above, and in its manifest tiny_shakespeare_manifest.txt (which the trainer checks them
against); the tokenizer file is written here from dev/data/gpt2_bpe.py. The input files
are read from <repo>/../shared/data/; only if they are absent there are they
downloaded (into data/) from the usual URLs. Python's standard library only.

File formats (all integers little-endian):
    token shard:  256 x int32 header [magic 20240520, version 1, n_tokens, 0...]
                  then n_tokens x uint16 token ids
    tokenizer:    256 x int32 header [magic 20240328, version 2, vocab 50257, eot 50256, 0...]
                  then for each id 0..vocab-1: uint8 length, then that many raw bytes
"""

import argparse
import os
import struct
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_bpe  # noqa: E402  (lives next to this file)

REPO_DIR = gpt2_bpe.REPO_DIR
SHARED_DATA_DIR = os.path.normpath(os.path.join(REPO_DIR, "..", "shared", "data"))
DATA_DIR = os.path.join(REPO_DIR, "data")  # gitignored

TEXT_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"  # + file name

VAL_TOKENS = 32768  # llm.c's split: the first 32,768 tokens are val (~10%)
PREPARE_TOKENS = os.path.join(REPO_DIR, "build", "prepare_tokens")  # make build/prepare_tokens
MANIFEST_SUFFIX = "_manifest.txt"  # the tool's PREFIX_manifest.txt (llmc/manifest.h), which the trainer reads

# the tokenizer file's header slots
HEADER_INTS = 256
HEADER_MAGIC, HEADER_VERSION, HEADER_COUNT, HEADER_EOT = 0, 1, 2, 3
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2  # count = vocab size; v2 adds the eot slot

# -----------------------------------------------------------------------------
# command line: one table gives both the parser and the usage text

FLAGS = [
    # flag, default, help
    ("--input", None, "TinyShakespeare text (default: <repo>/../shared/data/tinyshakespeare.txt, "
                      "downloaded into data/ if absent)"),
    ("--bpe-dir", None, "folder with GPT-2's encoder.json and vocab.bpe (default: "
                        "<repo>/../shared/data/gpt2/, downloaded into data/gpt2/ if absent)"),
    ("--out-dir", os.path.join(DATA_DIR, "tinyshakespeare"),
     "where the .bin token shards go (default: <repo>/data/tinyshakespeare)"),
    ("--tokenizer-out", os.path.join(DATA_DIR, "gpt2_tokenizer.bin"),
     "tokenizer file to write (default: <repo>/data/gpt2_tokenizer.bin)"),
    ("--prepare-tokens", PREPARE_TOKENS, "the tool that writes the shards (default: <repo>/build/prepare_tokens, "
                                         "built with make when missing)"),
    ("--val-tokens", str(VAL_TOKENS), f"tokens of the validation split (default: llm.c's {VAL_TOKENS})"),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    for flag, default, help_text in FLAGS:
        parser.add_argument(flag, default=default, help=help_text)
    parser.add_argument("--force", action="store_true", help="rewrite outputs that already exist")
    return parser.parse_args(argv)

# -----------------------------------------------------------------------------
# inputs: the local shared copy, else a cached download, else download


def download(url, path):
    print(f"downloading {url} -> {path}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            data = resp.read()
    except OSError as e:
        return f"download of {url} failed: {e}"
    write_atomic(path, data)
    return None


def find_input(given, shared_path, cache_path, url, fix):
    """path of an input file: the one given, else the shared copy, else a download.
    Exits with a message naming the fix if none can be had."""
    if given is not None:
        if os.path.exists(given):
            return given
        sys.exit(f"error: input file not found: {given}\n  hint: {fix}")
    looked = [shared_path] if shared_path == cache_path else [shared_path, cache_path]
    for path in looked:
        if os.path.exists(path):
            return path
    problem = download(url, cache_path)
    if problem is not None:
        sys.exit(f"error: no local copy at {' or '.join(looked)}, and {problem}\n  hint: {fix}")
    return cache_path


def find_text(given):
    return find_input(given,
                      os.path.join(SHARED_DATA_DIR, "tinyshakespeare.txt"),
                      os.path.join(DATA_DIR, "tinyshakespeare", "tiny_shakespeare.txt"),
                      TEXT_URL,
                      f"copy {TEXT_URL} to <repo>/../shared/data/tinyshakespeare.txt "
                      f"or pass --input PATH")


def find_bpe_dir(given):
    fix = ("copy encoder.json and vocab.bpe from " + BPE_URL +
           " into <repo>/../shared/data/gpt2/ or pass --bpe-dir DIR")
    files = (gpt2_bpe.ENCODER_JSON, gpt2_bpe.VOCAB_BPE)
    if given is not None:
        for name in files:
            find_input(os.path.join(given, name), None, None, None, fix)  # exits if missing
        return given
    shared_dir = os.path.join(SHARED_DATA_DIR, "gpt2")
    if all(os.path.exists(os.path.join(shared_dir, name)) for name in files):
        return shared_dir
    cache_dir = os.path.join(DATA_DIR, "gpt2")
    for name in files:  # both files come from the same folder, so fetch both into the cache
        find_input(None, os.path.join(cache_dir, name), os.path.join(cache_dir, name),
                   BPE_URL + name, fix)
    return cache_dir

# -----------------------------------------------------------------------------
# tokenize: build/prepare_tokens


def find_tool(path):
    """the prepare_tokens binary: PATH, built with make if it is the default and missing"""
    if not os.path.exists(path) and path == PREPARE_TOKENS:
        print(f"{path} is missing: make build/prepare_tokens")
        subprocess.run(["make", "-C", REPO_DIR, "build/prepare_tokens"], check=False)
    if not os.path.exists(path):
        sys.exit(f"error: no {path}\n  hint: make build/prepare_tokens (needs gcc with OpenMP)")
    return path


def tokenize_to_shards(tool, text_path, bpe_dir, val_tokens, val_path, train_path):
    """the tool's two shards of TEXT_PATH (llm.c's documents), renamed to val_path and train_path"""
    prefix = os.path.join(os.path.dirname(os.path.abspath(val_path)), "tiny_shakespeare")
    made = [f"{prefix}_val_000000.bin", f"{prefix}_train_000001.bin"]
    cmd = [tool, "--docs", "blank-lines", "--val-tokens", str(val_tokens), "--bpe", bpe_dir, "-o", prefix,
           "--overwrite", text_path]
    print(" ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        sys.exit(f"error: {tool} failed (its message is above)")
    if not os.path.exists(made[1]):
        sys.exit(f"error: {text_path} has no more than {val_tokens} tokens, all of them validation\n"
                 f"  hint: a smaller --val-tokens")
    for src, dst in zip(made, (val_path, train_path)):
        os.replace(src, dst)
        print(f"{src} -> {dst}")
    rename_in_manifest(prefix + MANIFEST_SUFFIX, {os.path.basename(a): os.path.basename(b) for a, b in zip(made, (val_path, train_path))})


def rename_in_manifest(path, names):
    """the tool's manifest (llmc/manifest.h) with its shards' new names: a shard line ends in its name"""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        words = line.split(" ", 4)
        if words[0] == "shard" and len(words) == 5 and words[4] in names:
            lines[i] = " ".join(words[:4] + [names[words[4]]])
    write_atomic(path, "\n".join(lines).encode("utf-8"))
    print(f"{path}: the shards' new names")

# -----------------------------------------------------------------------------
# writers


def write_atomic(path, data):
    """write bytes to path via a temp file + os.replace, so a reader (or a killed
    run) never sees a half-written file"""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def header_bytes(magic, version, count, eot=0):
    header = [0] * HEADER_INTS
    header[HEADER_MAGIC] = magic
    header[HEADER_VERSION] = version
    header[HEADER_COUNT] = count
    header[HEADER_EOT] = eot
    return struct.pack(f"<{HEADER_INTS}i", *header)


def write_tokenizer(path, enc):
    """tokenizer file: header, then per token id a uint8 length and the token's bytes"""
    parts = [header_bytes(TOKENIZER_MAGIC, TOKENIZER_VERSION, gpt2_bpe.VOCAB_SIZE,
                          gpt2_bpe.EOT_TOKEN)]
    for token_id in range(gpt2_bpe.VOCAB_SIZE):
        b = enc.token_bytes(token_id)
        assert 0 < len(b) < 256, f"token {token_id} is {len(b)} bytes, does not fit a uint8"
        parts.append(bytes([len(b)]) + b)
    data = b"".join(parts)
    write_atomic(path, data)
    print(f"wrote {gpt2_bpe.VOCAB_SIZE:,} tokens (eot {gpt2_bpe.EOT_TOKEN}) to {path} "
          f"({len(data):,} bytes)")

# -----------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    val_path = os.path.join(args.out_dir, "tiny_shakespeare_val.bin")
    train_path = os.path.join(args.out_dir, "tiny_shakespeare_train.bin")
    manifest_path = os.path.join(args.out_dir, "tiny_shakespeare" + MANIFEST_SUFFIX)  # an older run's files have none
    outputs = [val_path, train_path, manifest_path, args.tokenizer_out]
    if not args.force and all(os.path.exists(p) for p in outputs):
        print("already present (use --force to rewrite):\n  " + "\n  ".join(outputs))
        return

    t0 = time.time()
    text_path = find_text(args.input)
    bpe_dir = find_bpe_dir(args.bpe_dir)
    tool = find_tool(args.prepare_tokens)
    print(f"text: {text_path}\nbpe:  {bpe_dir}")
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.tokenizer_out)), exist_ok=True)
    tokenize_to_shards(tool, text_path, bpe_dir, int(args.val_tokens), val_path, train_path)
    enc = gpt2_bpe.load_encoder(bpe_dir)
    write_tokenizer(args.tokenizer_out, enc)
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
