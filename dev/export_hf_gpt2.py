"""
export_hf_gpt2.py: this project's model file (or the newest checkpoint of a run's folder) into a
Hugging Face GPT-2 checkpoint, model.safetensors + config.json, that transformers loads as it is:

    python3 dev/export_hf_gpt2.py out/ -o my_gpt2/                 # the newest complete checkpoint in out/
    python3 dev/export_hf_gpt2.py out/model_00000200.bin -o my_gpt2/
    python3 -c "from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('my_gpt2')"

The inverse of dev/convert_hf_gpt2.py (its table of the 16 tensors and HF's names is the one used
here): the model file's (out, in) linear weights are transposed back to Conv1D's (in, out), the
vocabulary's padding rows V..Vp-1 of wte are dropped, the output layer is wte (tied, so not stored:
transformers ties lm_head to it), and a bf16 model file (version 5) is widened to fp32. The file is
what GPT2LMHeadModel.save_pretrained writes: names "transformer.*", sorted, fp32, the header's JSON
without spaces and padded with spaces to 8 bytes, {"format": "pt"} as metadata; so a checkpoint that
dev/convert_hf_gpt2.py read comes back byte for byte (tests/test_export.py). config.json names what
train_gpt computes (tanh GELU, LayerNorm eps 1e-5, no dropout), EOT = the last id as bos and eos.
With GPT-2's vocabulary (V = 50257) the folder also gets the tokenizer, GPT-2's encoder.json and
vocab.bpe as vocab.json and merges.txt (from --bpe), so AutoTokenizer and pipeline() load it too.

Standard library only. A model file is read one tensor at a time (memory: the largest tensor).
Failure: a missing or foreign file, or a folder without a complete checkpoint, stops with what is
wrong and how to make a right one; files are written to temporary names and renamed, so a failed
run leaves none half written.
"""

import argparse
import array
import json
import os
import re
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_hf_gpt2 as hf  # noqa: E402  (the tensor table, the transpose, the header's numbers)

MODEL_VERSION_BF16 = 5    # llmc/checkpoint.h: bf16 weights (the top half of each fp32)
MODEL_HINT = "a model file comes from ./train_gpt (-o: out/model_00000200.bin) or from dev/convert_hf_gpt2.py"
SHARED_BPE_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "gpt2"))
GPT2_VOCAB = 50257        # with this vocabulary the tokenizer is GPT-2's and goes along
SAFETENSORS_ALIGN = 8     # the format pads its JSON header with spaces to this
PREFIX = "transformer."   # save_pretrained's names for GPT2LMHeadModel's body


class ExportError(Exception):
    """a wrong input: the message names the file, what is wrong and the fix"""


# ----------------------------------------------------------------------------
# the model file (llmc/checkpoint.h)

def newest_checkpoint(folder):
    """the model file of the newest complete checkpoint (DONE_<step> marker) in FOLDER"""
    steps = [int(m.group(1)) for m in (re.fullmatch(r"DONE_(\d{8})", n) for n in os.listdir(folder)) if m]
    if not steps:
        raise ExportError(f"'{folder}' holds no complete checkpoint (no DONE_<step> marker)\n"
                          f"  hint: give a model file, or a run's output folder (./train_gpt -o {folder})")
    path = os.path.join(folder, f"model_{max(steps):08d}.bin")
    if not os.path.isfile(path):
        raise ExportError(f"'{folder}' marks step {max(steps)} complete but has no {os.path.basename(path)}\n  hint: {MODEL_HINT}")
    return path


def read_header(path):
    """the config ({"L", "C", "NH", "V", "Vp", "maxT"}) and bytes a weight of the model file PATH"""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(4 * hf.HEADER_INTS)
    except OSError as e:
        raise ExportError(f"cannot read '{path}': {e.strerror}\n  hint: {MODEL_HINT}")
    if len(raw) < 4 * hf.HEADER_INTS:
        raise ExportError(f"'{path}' is {size} bytes, shorter than a model file's header\n  hint: {MODEL_HINT}")
    h = struct.unpack(f"<{hf.HEADER_INTS}i", raw)
    if h[0] != hf.MODEL_MAGIC:
        raise ExportError(f"'{path}' is not a model file (magic {h[0]}, want {hf.MODEL_MAGIC})\n  hint: {MODEL_HINT}")
    if h[1] not in (hf.MODEL_VERSION_FP32, MODEL_VERSION_BF16):
        raise ExportError(f"'{path}' is a model file of version {h[1]}; this reads {hf.MODEL_VERSION_FP32} (fp32) and "
                          f"{MODEL_VERSION_BF16} (bf16)\n  hint: {MODEL_HINT}")
    cfg = {"maxT": h[2], "V": h[3], "L": h[4], "NH": h[5], "C": h[6], "Vp": h[7]}
    if min(cfg.values()) < 1 or cfg["C"] % cfg["NH"] or cfg["Vp"] < cfg["V"]:
        raise ExportError(f"'{path}': an impossible shape {cfg}\n  hint: {MODEL_HINT}")
    width = 4 if h[1] == hf.MODEL_VERSION_FP32 else 2
    want = 4 * hf.HEADER_INTS + width * hf.num_parameters(cfg)
    if size != want:
        raise ExportError(f"'{path}' is {size} bytes, but its header (L={cfg['L']} C={cfg['C']} V={cfg['V']}) implies "
                          f"{want}: truncated or corrupt\n  hint: {MODEL_HINT}")
    return cfg, width


def our_shape(ours, cfg):
    """the shape of one layer's slice of our tensor OURS (a Conv1D weight as (out, in))"""
    C, maxT, Vp = cfg["C"], cfg["maxT"], cfg["Vp"]
    return {"wte": [Vp, C], "wpe": [maxT, C], "ln1w": [C], "ln1b": [C], "qkvw": [3 * C, C], "qkvb": [3 * C],
            "attprojw": [C, C], "attprojb": [C], "ln2w": [C], "ln2b": [C], "fcw": [4 * C, C], "fcb": [4 * C],
            "fcprojw": [C, 4 * C], "fcprojb": [C], "lnfw": [C], "lnfb": [C]}[ours]


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def tensor_places(cfg, width):
    """HF name -> (byte offset in the model file, our shape, transpose?, wte?), for every tensor HF stores"""
    places, offset = {}, 4 * hf.HEADER_INTS
    for ours, hf_name, per_layer, is_conv1d in hf.TENSORS:
        shape = our_shape(ours, cfg)
        for l in range(cfg["L"] if per_layer else 1):
            places[PREFIX + hf_name.format(l=l)] = (offset, shape, is_conv1d, ours == "wte")
            offset += width * count(shape)
    return places


def read_tensor(f, place, cfg, width):
    """one tensor as HF stores it: (shape, array('f'))"""
    offset, shape, is_conv1d, is_wte = place
    n = count(shape)
    f.seek(offset)
    raw = f.read(width * n)
    data = array.array("f")
    if width == 4:
        data.frombytes(raw)
        if sys.byteorder == "big":
            data.byteswap()
    else:  # bf16: the top half of an fp32
        halves = array.array("H")
        halves.frombytes(raw)
        if sys.byteorder == "big":
            halves.byteswap()
        data.frombytes(array.array("I", (x << 16 for x in halves)).tobytes())
    if is_wte:  # drop the padding rows
        shape = [cfg["V"], shape[1]]
        data = data[:count(shape)]
    if is_conv1d:
        data = hf.transpose(shape, data)
        shape = [shape[1], shape[0]]
    return shape, data


# ----------------------------------------------------------------------------
# the Hugging Face folder

def hf_config(cfg):
    """config.json: GPT-2 as train_gpt computes it"""
    eot = cfg["V"] - 1  # GPT-2's <|endoftext|> is its last id; train_gpt's documents start with it
    return {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.0,
        "bos_token_id": eot, "embd_pdrop": 0.0, "eos_token_id": eot, "initializer_range": 0.02,
        "layer_norm_epsilon": hf.LAYERNORM_EPS, "model_type": "gpt2", "n_ctx": cfg["maxT"], "n_embd": cfg["C"],
        "n_head": cfg["NH"], "n_inner": None, "n_layer": cfg["L"], "n_positions": cfg["maxT"],
        "reorder_and_upcast_attn": False, "resid_pdrop": 0.0, "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True, "tie_word_embeddings": True, "torch_dtype": "float32", "use_cache": True,
        "vocab_size": cfg["V"],
    }


def safetensors_header(entries):
    """the length-prefixed JSON header of [(name, shape, bytes)] in that order, as the safetensors
    package writes it (its order: dtype, then name; here every tensor is F32)"""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, nbytes in entries:
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % SAFETENSORS_ALIGN)
    return struct.pack("<Q", len(text)) + text


def export(model_path, out_dir, bpe_dir):
    """writes out_dir/model.safetensors and config.json (and the tokenizer); returns the config"""
    cfg, width = read_header(model_path)
    places = tensor_places(cfg, width)
    names = sorted(places)
    shapes = {}
    for name in names:  # HF's shapes, from the table the converter checks them with
        shapes[name] = hf.hf_shape(name[len(PREFIX):], cfg)
    os.makedirs(out_dir, exist_ok=True)
    st_path = os.path.join(out_dir, "model.safetensors")
    written = []
    try:
        with open(model_path, "rb") as f, open(st_path + ".tmp", "wb") as out:
            written.append(st_path + ".tmp")
            out.write(safetensors_header([(n, shapes[n], 4 * count(shapes[n])) for n in names]))
            for name in names:
                shape, data = read_tensor(f, places[name], cfg, width)
                assert shape == shapes[name], f"{name}: {shape} vs {shapes[name]}"  # a bug here, not in the input
                out.write(hf.to_bytes(data))
            out.flush()
            os.fsync(out.fileno())
        write_text(os.path.join(out_dir, "config.json"), json.dumps(hf_config(cfg), indent=2) + "\n", written)
        if bpe_dir is not None:
            for src, dst in ((os.path.join(bpe_dir, "encoder.json"), "vocab.json"), (os.path.join(bpe_dir, "vocab.bpe"), "merges.txt")):
                shutil.copyfile(src, os.path.join(out_dir, dst) + ".tmp")
                written.append(os.path.join(out_dir, dst) + ".tmp")
            write_text(os.path.join(out_dir, "tokenizer_config.json"),
                       json.dumps({"tokenizer_class": "GPT2Tokenizer", "model_max_length": cfg["maxT"],
                                   "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                   "unk_token": "<|endoftext|>"}, indent=2) + "\n", written)
        for tmp in written:  # everything whole: now the names
            os.replace(tmp, tmp[:-len(".tmp")])
        written = []
    finally:
        for tmp in written:
            if os.path.exists(tmp):
                os.remove(tmp)
    return cfg


def write_text(path, text, written):
    with open(path + ".tmp", "w") as f:
        written.append(path + ".tmp")
        f.write(text)


def find_bpe(given, cfg):
    """the folder of GPT-2's encoder.json and vocab.bpe to copy, or None (with the reason printed)"""
    if given == "":
        return None
    if cfg["V"] != GPT2_VOCAB:
        print(f"no tokenizer: the vocabulary has {cfg['V']} tokens, not GPT-2's {GPT2_VOCAB}")
        return None
    for d in ([given] if given else ["data/gpt2", SHARED_BPE_DIR]):
        if all(os.path.isfile(os.path.join(d, n)) for n in ("encoder.json", "vocab.bpe")):
            return d
    if given:
        raise ExportError(f"--bpe '{given}' holds no encoder.json and vocab.bpe\n  hint: python3 dev/data/tinyshakespeare.py "
                          f"downloads them into data/gpt2; --bpe '' exports without the tokenizer")
    print("no tokenizer: GPT-2's encoder.json and vocab.bpe are in neither data/gpt2 nor ../shared/data/gpt2 (--bpe DIR)")
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description="train_gpt model file -> Hugging Face GPT-2 (model.safetensors + config.json)")
    ap.add_argument("model", help="a model file (.bin), or a run's output folder: its newest complete checkpoint")
    ap.add_argument("-o", "--out", help="the folder to write (default: the model file's name without .bin, + _hf)")
    ap.add_argument("--bpe", default=None, help="folder of GPT-2's encoder.json and vocab.bpe, copied as the tokenizer when "
                                                "V = 50257 (default: data/gpt2, else ../shared/data/gpt2; '' = none)")
    args = ap.parse_args(argv)
    try:
        if os.path.isdir(args.model):
            path = newest_checkpoint(args.model)
        elif os.path.isfile(args.model):
            path = args.model
        else:
            raise ExportError(f"'{args.model}' not found\n  hint: {MODEL_HINT}")
        out = args.out or os.path.splitext(os.path.basename(path))[0] + "_hf"
        cfg, _ = read_header(path)
        bpe = find_bpe(args.bpe, cfg)
        print(f"{path}: L={cfg['L']} C={cfg['C']} NH={cfg['NH']} V={cfg['V']} (padded {cfg['Vp']}) maxT={cfg['maxT']}")
        export(path, out, bpe)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}/model.safetensors, config.json{' and the tokenizer' if bpe else ''}: "
          f"GPT2LMHeadModel.from_pretrained('{out}')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
