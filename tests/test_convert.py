"""test_convert.py: dev/convert_hf_gpt2.py against transformers, through the trainer.

    python3 tests/test_convert.py ./train_gpt ./test_gpt

dev/reference/tiny_hf_gpt2/ holds a tiny random GPT-2 as transformers saved it (L=2 C=32 NH=4
maxT=32 V=101) and, for N=4 batches of B=2 rows of T=32 tokens, the logits transformers gave,
the mean cross-entropy of each batch and the norm of its gradient (make_tiny_hf_gpt2.py wrote
them once; no torch here). The checks:
  - the committed logits give the committed losses (the reference files agree);
  - the converter (standard-library reader) writes a model file with the right header, size
    and zero padded vocabulary rows;
  - ./train_gpt -e converted.bin on a shard of the same tokens with -l 0 (the weights never
    move: each step's loss is the loss of one batch under the converted weights) logs, for
    every batch, the loss transformers' logits give to 1e-5 relative, and the gradient norm
    transformers' backward gives to 1e-4; its validation loss (forward only) at step 0 is the
    mean of the batch losses to 1e-5; the model it writes at the end is the converted file;
  - the same checkpoint saved as the Hugging Face hub's gpt2 files are (no "transformer."
    prefix, attention-mask buffers), in two shards with an index, in F16 and in BF16, and
    through the safetensors package (when installed) converts to the same weights;
  - wrong inputs (not safetensors, no config.json, a tensor missing, a config of another
    shape or activation, a truncated file, an untied lm_head) stop with a message naming the
    file and the problem, and leave no model file.
The trainer exposes no logits, so logits are compared through the loss they give; a flag that
writes them would let this test compare all B*T*V of them.
"""

import array
import json
import math
import os
import shutil
import struct
import sys
import zlib

import e2e

TRAIN, TESTER = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt"])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
REF = os.path.join(ROOT, "dev", "reference", "tiny_hf_gpt2")
CONVERT = [sys.executable, os.path.join(ROOT, "dev", "convert_hf_gpt2.py")]
LOSS_RTOL = 1e-5       # the loss of the converted model against transformers'
NORM_RTOL = 1e-4       # the gradient norm (fp32 sums in another order)
MODEL_MAGIC, HEADER_INTS = 20240326, 256

s = e2e.Suite("test_convert", tester=TESTER, run_limit=60)
W = s.root

with open(os.path.join(REF, "reference.json")) as f:
    ref = json.load(f)
B, T, V, N = ref["B"], ref["T"], ref["V"], ref["N"]
with open(os.path.join(REF, "config.json")) as f:
    hf_config = json.load(f)


# ----------------------------------------------------------------------------
# helpers: cross-entropy from logits, safetensors files, model files (shards: e2e.write_shard)

def mean_cross_entropy(logits, k):
    """batch k's mean -log softmax(logits)[target], in float64"""
    total = []
    for b in range(B):
        for t in range(T):
            row = logits[((k * B + b) * T + t) * V:((k * B + b) * T + t + 1) * V]
            target = ref["tokens"][k * B * T + b * T + t + 1]
            m = max(row)
            lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
            total.append(lse - row[target])
    return math.fsum(total) / (B * T)


def read_safetensors(path):
    """[(name, dtype, shape, bytes)] in file order, __metadata__ dropped"""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, e["dtype"], e["shape"], raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
            for k, e in items]


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors))


def checkpoint_dir(name, tensors, config=None):
    """a folder W/NAME with model.safetensors (TENSORS) and config.json (CONFIG or the reference's)"""
    d = os.path.join(W, name)
    os.makedirs(d)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config if config is None else config, f)
    return d


def floats(path, offset=0):
    a = array.array("f")
    with open(path, "rb") as f:
        f.seek(offset)
        a.frombytes(f.read())
    return a


def rel_err(got, want):
    return abs(got - want) / abs(want)


def convert(name, args):
    """runs the converter (stdlib reader unless ARGS says); the run, or None on failure"""
    return s.expect_ok(name, CONVERT + args)


# ----------------------------------------------------------------------------
# the reference files agree with each other

logits = floats(os.path.join(REF, "logits.bin"))
s.check("reference: logits.bin holds N*B*T*V fp32", len(logits) == N * B * T * V,
        f"{len(logits)} floats, want {N * B * T * V}")
want_losses = [mean_cross_entropy(logits, k) for k in range(N)]
worst = max(rel_err(a, b) for a, b in zip(want_losses, ref["loss"]))
s.check(f"reference: the committed logits give the committed losses (worst {worst:.1e})", worst < 1e-12,
        f"losses from logits.bin {want_losses}, reference.json {ref['loss']}")
s.check("reference: the losses are far from uniform (ln V), so they test the weights",
        min(abs(x - math.log(V)) for x in want_losses) > 0.5, f"losses {want_losses}, ln V {math.log(V):.4f}")

# ----------------------------------------------------------------------------
# convert, then the trainer's loss and gradient norm against transformers'

conv = os.path.join(W, "converted.bin")
C, L, NH, maxT = hf_config["n_embd"], hf_config["n_layer"], hf_config["n_head"], hf_config["n_positions"]
Vp = (V + 127) // 128 * 128
P = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
if convert("convert: the tiny checkpoint (standard-library reader)", [REF, "-o", conv, "--reader", "stdlib"]):
    with open(conv, "rb") as f:
        header = struct.unpack(f"<{HEADER_INTS}i", f.read(4 * HEADER_INTS))
    want = [MODEL_MAGIC, 3, maxT, V, L, NH, C, Vp]
    s.check("convert: header magic, version 3, maxT, V, L, NH, C, Vp", list(header[:8]) == want and not any(header[8:16]) and
            not any(header[18:]), f"header {header[:8]}, want {want}")
    with open(conv, "rb") as f:
        crc = zlib.crc32(f.read()[4 * HEADER_INTS:])
    s.check("convert: slots 16-17 record the weights' CRC-32, as train_gpt's model files do (llm.c leaves them 0)",
            header[16] == 0x32335243 and header[17] & 0xFFFFFFFF == crc, f"slots 16-17: {header[16:18]}, CRC-32 0x{crc:08x}")
    size = os.path.getsize(conv)
    s.check("convert: the file holds the header and P fp32 parameters", size == 4 * (HEADER_INTS + P),
            f"{size} bytes, want {4 * (HEADER_INTS + P)}")
    wte = floats(conv, 4 * HEADER_INTS)[:Vp * C]
    s.check(f"convert: wte padded from V={V} to Vp={Vp} with zero rows", not any(wte[V * C:]) and all(
        any(wte[r * C:(r + 1) * C]) for r in range(V)), "padded rows not zero, or a real row zero")

    shard = os.path.join(W, "tokens.bin")
    e2e.write_shard(shard, ref["tokens"], V)
    run = os.path.join(W, "run")
    r = s.expect_ok("train_gpt: -e converted.bin, -l 0, one step per reference batch",
                    [TRAIN, "-e", conv, "-i", shard, "-j", shard, "-k", "", "-b", str(B), "-t", str(T),
                     "-x", str(N), "-l", "0", "-v", str(N), "-m", str(N), "-s", "0", "-o", run])
    if r:
        rows = e2e.train_rows(run)
        got = [loss for _, loss, _, _ in rows]
        if s.check(f"train_gpt: {N} steps logged", len(got) == N, f"{len(got)} training lines in log.jsonl"):
            worst = max(rel_err(g, w) for g, w in zip(got, want_losses))
            s.check(f"train_gpt: each batch's loss equals transformers' to {LOSS_RTOL:g} (worst {worst:.1e})",
                    worst <= LOSS_RTOL, f"train_gpt {got}, transformers {want_losses}")
            norms = [n for _, _, n, _ in rows]
            worst = max(rel_err(g, w) for g, w in zip(norms, ref["grad_norm"]))
            s.check(f"train_gpt: each batch's gradient norm equals transformers' to {NORM_RTOL:g} (worst {worst:.1e})",
                    worst <= NORM_RTOL, f"train_gpt {norms}, transformers {ref['grad_norm']}")
        vals = {rec["step"]: rec["val_loss"] for rec in e2e.read_log(run) if "val_loss" in rec}
        want_val = math.fsum(want_losses) / N
        worst = max((rel_err(v, want_val) for v in vals.values()), default=math.inf)
        s.check(f"train_gpt: validation loss (forward only) at steps 0 and {N} is their mean to {LOSS_RTOL:g} "
                f"(worst {worst:.1e})", sorted(vals) == [0, N] and worst <= LOSS_RTOL,
                f"val_loss {vals}, want {want_val} at steps 0 and {N}")
        s.check("train_gpt: with -l 0 the model it writes is the converted file, byte for byte",
                e2e.same_bytes(e2e.ckpt(run, "model", N, ".bin"), conv), "files differ")

    # --- the same weights in other spellings and through the other reader
    tensors = read_safetensors(os.path.join(REF, "model.safetensors"))
    hub = [(k[len("transformer."):], dt, sh, data) for k, dt, sh, data in tensors]  # the hub's gpt2 names
    hub += [(f"h.{l}.attn.bias", "F32", [1, 1, maxT, maxT], bytes(4 * maxT * maxT)) for l in range(L)]
    out = os.path.join(W, "hub.bin")
    if convert("convert: hub layout (no 'transformer.' prefix, mask buffers)",
               [checkpoint_dir("hub", hub), "-o", out, "--reader", "stdlib"]):
        s.check("convert: hub layout gives the same file", e2e.same_bytes(out, conv), "files differ")

    shards = checkpoint_dir("sharded", [])  # gpt2-xl's layout on the hub: an index and shards
    os.remove(os.path.join(shards, "model.safetensors"))
    weight_map = {}
    for i, part in enumerate((tensors[:len(tensors) // 2], tensors[len(tensors) // 2:])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        write_safetensors(os.path.join(shards, name), part)
        weight_map.update({t[0]: name for t in part})
    with open(os.path.join(shards, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    out = os.path.join(W, "sharded.bin")
    if convert("convert: two shards and model.safetensors.index.json", [shards, "-o", out, "--reader", "stdlib"]):
        s.check("convert: the shards give the same file", e2e.same_bytes(out, conv), "files differ")

    for dtype in ("F16", "BF16"):
        narrow, expect = [], floats(conv, 4 * HEADER_INTS)  # expect: the converted weights, each narrowed
        for k, dt, sh, data in tensors:
            vals = array.array("f")
            vals.frombytes(data)
            if dtype == "F16":
                narrow.append((k, dtype, sh, struct.pack(f"<{len(vals)}e", *vals)))
            else:  # truncation: the top half of each fp32
                narrow.append((k, dtype, sh, b"".join(data[i + 2:i + 4] for i in range(0, len(data), 4))))
        if dtype == "F16":
            expect = array.array("f", struct.unpack(f"<{len(expect)}e", struct.pack(f"<{len(expect)}e", *expect)))
        else:
            bits = array.array("I")
            bits.frombytes(expect.tobytes())
            expect = array.array("I", (b & 0xFFFF0000 for b in bits))
        out = os.path.join(W, f"{dtype}.bin")
        if convert(f"convert: {dtype} tensors", [checkpoint_dir(dtype, narrow), "-o", out, "--reader", "stdlib"]):
            got = floats(out, 4 * HEADER_INTS)
            if dtype == "BF16":
                got = array.array("I", got.tobytes())
            s.check(f"convert: {dtype} tensors widen exactly to fp32", got == expect,
                    "weights differ from the converted fp32 weights narrowed")

    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        have_package = True
    except ImportError:
        have_package = False
    if have_package:
        out = os.path.join(W, "package.bin")
        if convert("convert: through the safetensors package", [REF, "-o", out, "--reader", "safetensors"]):
            s.check("convert: the safetensors package gives the same file", e2e.same_bytes(out, conv), "files differ")
    else:
        s.skip("convert: through the safetensors package", "safetensors or numpy not installed (optional)")


# ----------------------------------------------------------------------------
# wrong inputs: a message naming the file and the problem, no model file

def expect_error(name, phrases, args):
    out = os.path.join(W, "error_out.bin")
    s.expect_script_error(name, phrases, CONVERT + args + ["-o", out, "--reader", "stdlib"],
                          lambda: [p for p in (out, out + ".tmp") if os.path.exists(p)])


expect_error("error: a model file is not a safetensors file", ["tiny_model.bin", "not a safetensors file", "hf download"],
             [os.path.join(ROOT, "dev", "reference", "tiny_model.bin")])
lonely = os.path.join(W, "no_config")
os.makedirs(lonely)
shutil.copy(os.path.join(REF, "model.safetensors"), lonely)
expect_error("error: no config.json beside the weights", [os.path.join(lonely, "config.json"), "not found", "hf download"],
             [lonely])
gone = "transformer.h.1.mlp.c_fc.weight"
expect_error("error: a tensor missing", ["lacks 1 tensor", "h.1.mlp.c_fc.weight", "model.safetensors"],
             [checkpoint_dir("missing", [t for t in tensors if t[0] != gone])])
expect_error("error: config.json of another width", ["has shape", "[101, 48]", "wte.weight"],
             [checkpoint_dir("wider", tensors, dict(hf_config, n_embd=48))])
expect_error("error: config.json with more layers", ["lacks 12 tensor(s)", "(L=3)", "h.2."],
             [checkpoint_dir("deeper", tensors, dict(hf_config, n_layer=3))])
expect_error("error: an activation train_gpt does not compute", ["config.json", "activation_function is 'relu'"],
             [checkpoint_dir("relu", tensors, dict(hf_config, activation_function="relu"))])
cut = checkpoint_dir("truncated", tensors)
with open(os.path.join(cut, "model.safetensors"), "r+b") as f:
    f.truncate(os.path.getsize(os.path.join(cut, "model.safetensors")) - 100)
expect_error("error: a truncated safetensors file", ["model.safetensors", "truncated"], [cut])
wte = next(t for t in tensors if t[0] == "transformer.wte.weight")
untied = bytearray(wte[3])
untied[0] ^= 0x40
expect_error("error: an lm_head that is not wte", ["lm_head.weight differs from wte.weight"],
             [checkpoint_dir("untied", tensors + [("lm_head.weight", "F32", wte[2], bytes(untied))])])

s.finish()
