"""
gpt2_bpe.py: GPT-2's byte-level BPE tokenizer in pure python (stdlib only).

Gives exactly the token ids of OpenAI's GPT-2 encoder (and of tiktoken's "gpt2"
encoding) without tiktoken, the `regex` module or numpy, so the data scripts run
on a fresh machine. Usage:

    from gpt2_bpe import load_encoder, EOT_TOKEN
    enc = load_encoder()                      # reads <repo>/../shared/data/gpt2/
    ids = enc.encode("Hello world")           # [15496, 995]
    assert enc.decode(ids) == "Hello world"

How GPT-2 turns text into ids, in the order of this file:
  1. pre-tokenizer: a regex cuts the text into words (" world", "'s", "  ", ...);
     BPE never merges across these cuts.
  2. bytes -> unicode: each word's utf-8 bytes become printable unicode chars,
     one char per byte, because the merges file is written in those chars.
  3. BPE: adjacent symbols are merged, lowest-ranked pair (from vocab.bpe) first,
     until no pair in the word has a rank.
  4. encoder.json maps each final symbol to its token id.

Failure behaviour: load_encoder raises FileNotFoundError naming the missing file
and the fix; encode raises UnicodeEncodeError for lone surrogates in the text.
"""

import json
import os
import re
import sys
import unicodedata

EOT_TOKEN = 50256           # id of <|endoftext|>, GPT-2's only special token
EOT_TEXT = "<|endoftext|>"
VOCAB_SIZE = 50257          # 256 byte tokens + 50000 merges + <|endoftext|>

REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BPE_DIR = os.path.normpath(os.path.join(REPO_DIR, "..", "shared", "data", "gpt2"))
ENCODER_JSON = "encoder.json"   # token string (in byte-unicode chars) -> id
VOCAB_BPE = "vocab.bpe"         # "#version" line, then one merge "a b" per line, best first

# -----------------------------------------------------------------------------
# 1. pre-tokenizer
#
# GPT-2 splits text with (python `regex` module syntax)
#     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# stdlib `re` has no \p{L} / \p{N}, so we build those classes from unicodedata
# categories (L* = letter, N* = number) and spell out the pattern with them.
# Everything else, including the backtracking in \s+(?!\S) that leaves the last
# space of a run to be glued to the next word, is then done by `re` itself.
#
# \s must be unicode's White_Space property, as in the `regex` module and in
# tiktoken's rust regex. It is NOT python's str.isspace(), which also counts the
# separators \x1c-\x1f (so stdlib `\s` would cut "a\x1cb" differently).
WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680"
               "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
               "\u2028\u2029\u202f\u205f\u3000")


def codepoint_runs(codepoints):
    """[first, last] of each run of consecutive codepoints (sorted)"""
    runs = []
    for cp in codepoints:
        if runs and cp == runs[-1][1] + 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    return runs


def letter_and_number_runs():
    """the runs of \\p{L} (unicode category L*) and of \\p{N} (N*) codepoints, from this
    python's unicodedata (dev/data/make_bpe_unicode.py writes the same runs for llmc/bpe.h)"""
    letters, numbers = [], []
    for cp in range(sys.maxunicode + 1):
        major = unicodedata.category(chr(cp))[0]
        if major == "L":
            letters.append(cp)
        elif major == "N":
            numbers.append(cp)
    return codepoint_runs(letters), codepoint_runs(numbers)


def _char_class(runs):
    """body of a `re` character class matching the given runs of codepoints,
    written as escaped ranges: \\U00000041-\\U0000005a..."""
    def esc(cp):
        return "\\U%08x" % cp
    return "".join(esc(a) if a == b else esc(a) + "-" + esc(b) for a, b in runs)


def build_pretokenizer():
    """compile GPT-2's split pattern for stdlib `re` (about 0.1 s: scans all of unicode)"""
    letter_runs, number_runs = letter_and_number_runs()
    L = _char_class(letter_runs)
    N = _char_class(number_runs)
    S = _char_class(codepoint_runs(sorted(ord(c) for c in WHITE_SPACE)))
    pattern = (r"'s|'t|'re|'ve|'m|'ll|'d"
               rf"| ?[{L}]+"            # ' ?\p{L}+'  a word, with its leading space
               rf"| ?[{N}]+"            # ' ?\p{N}+'  a number
               rf"| ?[^{S}{L}{N}]+"     # ' ?[^\s\p{L}\p{N}]+'  punctuation, symbols, marks
               rf"|[{S}]+(?![^{S}])"    # '\s+(?!\S)'  spaces, minus the last one before a word
               rf"|[{S}]+")             # '\s+'  that single last one, if not a plain space
    return re.compile(pattern)

# -----------------------------------------------------------------------------
# 2. bytes -> unicode
#
# GPT-2's vocab files spell each byte as one printable char: the printable bytes
# ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68 bytes (controls,
# space, ...) are mapped in byte order to chr(256), chr(257), ...  So space (0x20)
# is 'Ġ' = chr(288) and newline (0x0a) is 'Ċ' = chr(266).

def bytes_to_unicode():
    """dict byte value (0..255) -> the single char that spells it in the vocab files"""
    printable = (list(range(ord("!"), ord("~") + 1)) +
                 list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table

# -----------------------------------------------------------------------------
# 3. + 4. BPE and the encoder


class Encoder:
    def __init__(self, encoder, merges):
        # encoder: token string (byte-unicode chars) -> id; merges: list of (a, b), best first
        self.encoder = encoder
        self.decoder = {i: s for s, i in encoder.items()}
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.pretokenizer = build_pretokenizer()
        self.eot_token = EOT_TOKEN
        self.cache = {}  # word (str) -> its token ids; text repeats words a lot

    def bpe(self, word):
        """merge a word (byte-unicode chars) into vocab symbols, lowest merge rank first"""
        symbols = list(word)
        while len(symbols) > 1:
            pairs = zip(symbols, symbols[1:])
            best = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if best not in self.bpe_ranks:
                break  # no adjacent pair can merge: done
            # merge every occurrence of the best pair, left to right, non-overlapping
            merged = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols

    def encode_word(self, word):
        ids = self.cache.get(word)
        if ids is None:
            chars = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
            ids = [self.encoder[s] for s in self.bpe(chars)]
            self.cache[word] = ids
        return ids

    def encode(self, text):
        """text -> list of token ids. "<|endoftext|>" in text is plain text here
        (like tiktoken's encode_ordinary); append EOT_TOKEN yourself."""
        ids = []
        for word in self.pretokenizer.findall(text):
            ids.extend(self.encode_word(word))
        return ids

    def token_bytes(self, token_id):
        """the raw bytes of one token (b'<|endoftext|>' for EOT), may be partial utf-8"""
        return bytes(self.byte_decoder[c] for c in self.decoder[token_id])

    def decode(self, ids):
        """token ids -> text; bytes that are not valid utf-8 become U+FFFD"""
        data = b"".join(self.token_bytes(i) for i in ids)
        return data.decode("utf-8", errors="replace")


def load_encoder(bpe_dir=DEFAULT_BPE_DIR):
    """read encoder.json and vocab.bpe from bpe_dir into an Encoder"""
    paths = {name: os.path.join(bpe_dir, name) for name in (ENCODER_JSON, VOCAB_BPE)}
    for path in paths.values():
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"GPT-2 BPE file not found: {path}\n"
                f"  hint: put encoder.json and vocab.bpe in {bpe_dir}, or point at them with "
                f"--bpe-dir (dev/data/tinyshakespeare.py downloads them if it can)")
    with open(paths[ENCODER_JSON], "r", encoding="utf-8") as f:
        encoder = json.load(f)
    with open(paths[VOCAB_BPE], "r", encoding="utf-8") as f:
        lines = f.read().split("\n")
    # first line is "#version: 0.2", the last one is empty (file ends in "\n")
    merges = [tuple(line.split()) for line in lines[1:] if line]
    if len(encoder) != VOCAB_SIZE or encoder.get(EOT_TEXT) != EOT_TOKEN:
        raise ValueError(f"{paths[ENCODER_JSON]} is not GPT-2's encoder.json "
                         f"({len(encoder)} entries, expected {VOCAB_SIZE} with "
                         f"{EOT_TEXT} = {EOT_TOKEN})")
    return Encoder(encoder, merges)


# module-level encode/decode on the default files, loaded on first use
_default = None


def _default_encoder():
    global _default
    if _default is None:
        _default = load_encoder()
    return _default


def encode(text):
    return _default_encoder().encode(text)


def decode(ids):
    return _default_encoder().decode(ids)


if __name__ == "__main__":
    # python3 dev/data/gpt2_bpe.py "some text"  ->  prints the tokens
    text = " ".join(sys.argv[1:]) or "Hello world"
    enc = load_encoder()
    ids = enc.encode(text)
    print(ids)
    print([enc.decode([i]) for i in ids])
