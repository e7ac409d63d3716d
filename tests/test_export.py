"""test_export.py: dev/export_hf_gpt2.py, a model file back into a Hugging Face GPT-2 checkpoint.

    python3 tests/test_export.py ./train_gpt ./test_gpt

The checks:
  - dev/reference/tiny_hf_gpt2/ (transformers' own save_pretrained) through dev/convert_hf_gpt2.py
    and back through the exporter is the same model.safetensors, byte for byte; its config.json
    names the same model (the converter reads it back to the same shape);
  - train_gpt's forward (test_gpt --probs: the CPU backend's next-token probabilities) on prompts of
    1 to 32 tokens gives transformers' committed logits (logits.bin) to 1e-4 (as log-softmax: logits
    are defined up to a constant); with transformers installed, GPT2LMHeadModel.from_pretrained
    loads the exported folder as it is and gives the same logits to 1e-4, for the reference model and
    for a model trained here (skipped, and said so, without torch and transformers);
  - a model trained here for 20 steps (the fixture, V=64, checkpoints at 10 and 20): the run's folder
    exports its newest checkpoint; converted back it is the trained file byte for byte and gives the
    same validation loss;
  - a model of GPT-2's vocabulary (the preset tiny, one step): wte loses its padding rows (50304 ->
    50257), GPT-2's tokenizer goes along (vocab.json, merges.txt), and it converts back byte for byte;
  - a bf16 model file (version 5) exports as its weights widened to fp32;
  - wrong inputs (not a model file, a truncated one, a folder without a complete checkpoint, a path
    that is not there) stop with the file and the problem, and leave no folder contents and no .tmp.
"""

import array
import json
import math
import os
import struct
import subprocess
import sys
import zlib

import e2e

TRAIN, TESTER = e2e.usage(sys.argv, ["./train_gpt", "./test_gpt"])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
REF = os.path.join(ROOT, "dev", "reference", "tiny_hf_gpt2")
CONVERT = [sys.executable, os.path.join(ROOT, "dev", "convert_hf_gpt2.py")]
EXPORT = [sys.executable, os.path.join(ROOT, "dev", "export_hf_gpt2.py")]
LOGIT_TOL = 1e-4       # the issue's bar: transformers' logits and train_gpt's forward
STEPS = 20
HEADER_INTS = 256

s = e2e.Suite("test_export", tester=TESTER, run_limit=120)
W = s.root
with open(os.path.join(REF, "reference.json")) as f:
    ref = json.load(f)
B, T, V, N = ref["B"], ref["T"], ref["V"], ref["N"]


def floats(path, offset=0):
    a = array.array("f")
    with open(path, "rb") as f:
        f.seek(offset)
        a.frombytes(f.read())
    return a


def log_softmax(row):
    m = max(row)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def c_log_probs(model, prompts):
    """train_gpt's forward: log of test_gpt --probs's next-token probabilities after each prompt"""
    p = subprocess.run([TESTER, "--probs", model], input="".join(" ".join(map(str, q)) + "\n" for q in prompts),
                       capture_output=True, text=True, timeout=s.run_limit)
    if p.returncode != 0:
        return None
    return [[math.log(max(float(x), 1e-45)) for x in line.split()] for line in p.stdout.splitlines()]


def worst_difference(got, want):
    return max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))


def ref_prompts():
    """(prompt, transformers' logits after it) for rows of the reference stream, prefixes of 1 to T tokens"""
    logits = floats(os.path.join(REF, "logits.bin"))
    out = []
    for k, b, t in ((0, 0, 0), (0, 1, 4), (1, 0, 16), (2, 1, 30), (3, 1, T - 1)):
        start = k * B * T + b * T
        row = logits[((k * B + b) * T + t) * V:((k * B + b) * T + t + 1) * V]
        out.append((ref["tokens"][start:start + t + 1], list(row)))
    return out


def transformers_log_probs(folder, prompts):
    """transformers' log-softmax of the logits after each prompt, from the exported FOLDER"""
    import torch
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(folder).float().eval()
    with torch.no_grad():
        return [torch.log_softmax(model(input_ids=torch.tensor([q])).logits[0, -1].double(), -1).tolist() for q in prompts]


try:
    import transformers  # noqa: F401  (its tokenizers need no torch)
    have_tokenizers = True
except ImportError:
    have_tokenizers = False
try:
    import torch  # noqa: F401
    have_transformers = have_tokenizers
except ImportError:
    have_transformers = False
if not have_transformers:
    s.skip("exported folders through transformers' GPT2LMHeadModel.from_pretrained",
           "torch or transformers is not installed (pip install torch transformers); the committed logits stand in")

# ----------------------------------------------------------------------------
# the reference checkpoint: convert, export, the same bytes

conv, hf_dir = os.path.join(W, "tiny.bin"), os.path.join(W, "tiny_hf")
if s.expect_ok("convert: dev/reference/tiny_hf_gpt2 (stdlib reader)", CONVERT + [REF, "-o", conv, "--reader", "stdlib"]):
    if s.expect_ok("export: the converted model file", EXPORT + [conv, "-o", hf_dir]):
        s.check("export: model.safetensors is transformers' own file, byte for byte",
                e2e.same_bytes(os.path.join(hf_dir, "model.safetensors"), os.path.join(REF, "model.safetensors")), "files differ")
        with open(os.path.join(hf_dir, "config.json")) as f:
            ours = json.load(f)
        with open(os.path.join(REF, "config.json")) as f:
            theirs = json.load(f)
        keys = ("model_type", "n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "activation_function",
                "layer_norm_epsilon", "tie_word_embeddings", "scale_attn_weights", "eos_token_id", "bos_token_id")
        s.check("export: config.json names the reference's model", all(ours.get(k) == theirs.get(k) for k in keys),
                f"{ {k: (ours.get(k), theirs.get(k)) for k in keys if ours.get(k) != theirs.get(k)} }")
        back = os.path.join(W, "tiny_back.bin")
        if s.expect_ok("convert the export back (its config.json read by the converter)", CONVERT + [hf_dir, "-o", back, "--reader", "stdlib"]):
            s.check("convert -> export -> convert: the model file byte for byte", e2e.same_bytes(back, conv), "files differ")

    prompts = ref_prompts()
    got = c_log_probs(conv, [q for q, _ in prompts])
    if s.check("test_gpt --probs runs train_gpt's forward", got is not None and len(got) == len(prompts), "failed"):
        want = [log_softmax(row) for _, row in prompts]
        worst = worst_difference(got, want)
        s.check(f"train_gpt's forward gives transformers' logits (committed) on prompts of 1 to {T} tokens to {LOGIT_TOL:g} "
                f"(worst {worst:.1e})", worst <= LOGIT_TOL, f"worst {worst}")
        if have_transformers:
            hf_got = transformers_log_probs(hf_dir, [q for q, _ in prompts])
            worst = worst_difference(hf_got, got)
            s.check(f"transformers loads the exported folder: its logits are train_gpt's to {LOGIT_TOL:g} (worst {worst:.1e})",
                    worst <= LOGIT_TOL, f"worst {worst}")

# ----------------------------------------------------------------------------
# a model trained here for 20 steps

run = os.path.join(W, "run")
fix = s.fix
trained = e2e.ckpt(run, "model", STEPS, ".bin")
if s.expect_ok(f"train the fixture {STEPS} steps, checkpoints at 10 and {STEPS}",
               [TRAIN, "-e", f"{fix}/model.bin", "-i", f"{fix}/train.bin", "-j", "", "-k", "", "-b", "4", "-t", "32",
                "-x", str(STEPS), "-l", "1e-2", "-n", "10", "-v", "0", "-s", "0", "-o", run]):
    out = os.path.join(W, "trained_hf")
    r = s.expect_ok("export: the run's folder", EXPORT + [run, "-o", out])
    if r:
        s.check(f"export: a folder gives its newest complete checkpoint (step {STEPS})", os.path.basename(trained) in r.out, r.out[:300])
        back = os.path.join(W, "trained_back.bin")
        if s.expect_ok("convert the exported model back", CONVERT + [out, "-o", back, "--reader", "stdlib"]):
            s.check(f"the trained model, exported and converted back: the same file byte for byte", e2e.same_bytes(back, trained), "differ")
            losses = {}
            for name, model in (("trained", trained), ("back", back)):
                d = os.path.join(W, f"eval_{name}")
                if s.expect_ok(f"validation loss of the {name} model (-l 0, one step)",
                               [TRAIN, "-e", model, "-i", f"{fix}/train.bin", "-j", f"{fix}/val.bin", "-k", "", "-b", "4", "-t", "32",
                                "-x", "1", "-l", "0", "-v", "1", "-m", "4", "-s", "0", "-o", d]):
                    losses[name] = [rec["val_loss"] for rec in e2e.read_log(d) if "val_loss" in rec]
            if len(losses) == 2:
                s.check(f"exported and converted back: the same validation loss ({losses['trained'][:1]})",
                        losses["trained"] == losses["back"] and losses["trained"], f"{losses}")
            prompts = [list(range(1, 1 + n)) for n in (1, 7, 32)]
            got = c_log_probs(trained, prompts)
            if have_transformers and got:
                worst = worst_difference(transformers_log_probs(out, prompts), got)
                s.check(f"transformers on the trained model's export: train_gpt's logits to {LOGIT_TOL:g} (worst {worst:.1e})",
                        worst <= LOGIT_TOL, f"worst {worst}")

# ----------------------------------------------------------------------------
# GPT-2's vocabulary: wte unpadded from 50304 rows, the tokenizer copied along

bpe, why = e2e.bpe_dir()
gpt2_run = os.path.join(W, "run_gpt2")
if bpe is None:
    s.skip("export with GPT-2's tokenizer", why)
elif s.expect_ok("train the preset tiny (V=50257) one step", [TRAIN, "-e", "tiny", "-i", f"{fix}/train.bin", "-j", "", "-k", "",
                 "-b", "2", "-t", "32", "-x", "1", "-v", "0", "-s", "0", "-o", gpt2_run]):
    out = os.path.join(W, "gpt2_hf")
    if s.expect_ok("export: a model of GPT-2's vocabulary, --bpe", EXPORT + [gpt2_run, "-o", out, "--bpe", bpe]):
        st = os.path.join(out, "model.safetensors")
        with open(st, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            wte = json.loads(f.read(n))["transformer.wte.weight"]["shape"]
        s.check("export: wte has GPT-2's 50257 rows (not the padded 50304)", wte == [50257, 64], f"shape {wte}")
        s.check("export: the tokenizer is GPT-2's encoder.json and vocab.bpe as vocab.json and merges.txt",
                e2e.same_bytes(os.path.join(out, "vocab.json"), os.path.join(bpe, "encoder.json"))
                and e2e.same_bytes(os.path.join(out, "merges.txt"), os.path.join(bpe, "vocab.bpe"))
                and os.path.isfile(os.path.join(out, "tokenizer_config.json")), f"{sorted(os.listdir(out))}")
        back = os.path.join(W, "gpt2_back.bin")
        if s.expect_ok("convert it back", CONVERT + [out, "-o", back, "--reader", "stdlib"]):
            s.check("GPT-2's vocabulary: exported and converted back, the model file byte for byte",
                    e2e.same_bytes(back, e2e.ckpt(gpt2_run, "model", 1, ".bin")), "differ")
        if not have_tokenizers:
            s.skip("transformers' AutoTokenizer on the exported tokenizer", "transformers is not installed")
        else:
            from transformers import AutoTokenizer
            ids = AutoTokenizer.from_pretrained(out)("Hello world")["input_ids"]
            s.check("transformers' AutoTokenizer loads the exported tokenizer", ids == [15496, 995], f"{ids}")

# ----------------------------------------------------------------------------
# a bf16 model file: its weights widened

if os.path.isfile(conv):
    with open(conv, "rb") as f:
        raw = f.read()
    header, body = bytearray(raw[:4 * HEADER_INTS]), raw[4 * HEADER_INTS:]
    header[4 * 16:4 * 18] = bytes(8)  # no checksum, as llm.c writes them (the bodies below are not the converter's)
    struct.pack_into("<i", header, 4, 5)  # version 5: bf16
    bf16 = bytes(header) + b"".join(body[i + 2:i + 4] for i in range(0, len(body), 4))
    truncated = bytes(header[:4] + struct.pack("<i", 3) + header[8:]) + b"".join(b"\0\0" + body[i + 2:i + 4] for i in range(0, len(body), 4))
    for name, data in (("bf16.bin", bf16), ("truncated.bin", truncated)):
        with open(os.path.join(W, name), "wb") as f:
            f.write(data)
    if (s.expect_ok("export: a bf16 model file (version 5)", EXPORT + [os.path.join(W, "bf16.bin"), "-o", os.path.join(W, "bf16_hf")])
            and s.expect_ok("export: the same weights truncated, fp32", EXPORT + [os.path.join(W, "truncated.bin"), "-o", os.path.join(W, "trunc_hf")])):
        s.check("export: bf16 widens exactly to fp32", e2e.same_bytes(os.path.join(W, "bf16_hf", "model.safetensors"),
                                                                     os.path.join(W, "trunc_hf", "model.safetensors")), "differ")

# ----------------------------------------------------------------------------
# wrong inputs


def expect_error(name, phrases, args):
    out = os.path.join(W, "error_out")
    s.expect_script_error(name, phrases, EXPORT + args + ["-o", out], lambda: os.listdir(out) if os.path.isdir(out) else [])


expect_error("error: not a model file", ["model.safetensors", "is not a model file (magic"], [os.path.join(REF, "model.safetensors")])
cut = os.path.join(W, "cut.bin")
if os.path.isfile(conv):
    with open(conv, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[:-100])
    expect_error("error: a truncated model file", ["cut.bin", "truncated or corrupt"], [cut])
os.makedirs(os.path.join(W, "no_ckpt"))
expect_error("error: a folder without a complete checkpoint", ["no_ckpt", "no complete checkpoint"], [os.path.join(W, "no_ckpt")])
expect_error("error: a path that is not there", ["'/nonexistent/model.bin' not found"], ["/nonexistent/model.bin"])

# damage, NaN weights and the output folder (issue 38): checked before anything is written
if os.path.isfile(trained):
    import shutil
    bad_run = os.path.join(W, "run_damaged")
    shutil.copytree(run, bad_run)
    with open(e2e.ckpt(bad_run, "model", STEPS, ".bin"), "r+b") as f:
        f.seek(4 * HEADER_INTS + 4096)
        f.write(b"\x7f" * 16)
    expect_error("error: a damaged model file (16 bytes of 0x7f) is named", ["is damaged: its weights' CRC-32 is"],
                 [e2e.ckpt(bad_run, "model", STEPS, ".bin")])
    out = os.path.join(W, "damaged_hf")
    r = s.expect_ok("export: a run's folder whose newest checkpoint is damaged", EXPORT + [bad_run, "-o", out])
    if r:
        s.check("export: ... skips it, naming it, for the newest intact one (step 10)",
                f"skipped the checkpoint of step {STEPS}" in r.out and "model_00000010.bin" in r.out, r.out[:400])
    nan = os.path.join(W, "nan.bin")
    with open(trained, "rb") as f:
        data = bytearray(f.read())
    struct.pack_into("<f", data, 4 * HEADER_INTS + 4 * 5, float("nan"))
    struct.pack_into("<I", data, 4 * 17, zlib.crc32(data[4 * HEADER_INTS:]))  # whole as written: a diverged run's file
    with open(nan, "wb") as f:
        f.write(data)
    expect_error("error: NaN weights are named, not exported", ["transformer.wte.weight: element 5 is nan"], [nan])
    taken = os.path.join(W, "taken_hf")
    os.makedirs(taken)
    for name in ("pytorch_model.bin", "tokenizer.json"):
        with open(os.path.join(taken, name), "w") as f:
            f.write("another model's")
    s.expect_script_error("error: -o holding another model's files is refused, naming them",
                          ["holds files this export does not write (pytorch_model.bin, tokenizer.json)"],
                          EXPORT + [trained, "-o", taken], lambda: sorted(set(os.listdir(taken)) - {"pytorch_model.bin", "tokenizer.json"}))
    s.expect_script_error("error: -o a file is refused", ["is a file, not a folder"], EXPORT + [trained, "-o", nan], lambda: [])
    again = os.path.join(W, "trained_hf")
    s.expect_ok("export: into an earlier export's folder again", EXPORT + [trained, "-o", again])

s.finish()
