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
Checked before anything is written: the CRC-32 that train_gpt's model files record of their weights
(llmc/checkpoint.h, slots 16-17; llm.c's files have none), so a damaged file is named, not exported
(a run's folder falls back to its newest intact checkpoint, saying so), and every weight finite.
The output folder must be new, empty, or an earlier export's (only the files this script writes):
transformers would load another model's pytorch_model.bin or tokenizer.json beside the new one.
Failure: a missing, foreign or damaged file, NaN weights, a folder without a complete checkpoint, or
an output that is a file or holds other files, stops with what is wrong and how to make a right one;
files are written to temporary names and renamed, so a failed run leaves none half written.
"""

import argparse
import array
import json
import math
import os
import re
import shutil
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_hf_gpt2 as hf  # noqa: E402  (the tensor table, the transpose, the header's numbers)

MODEL_VERSION_BF16 = 5    # llmc/checkpoint.h: bf16 weights (the top half of each fp32)
MODEL_HINT = "a model file comes from ./train_gpt (-o: out/model_00000200.bin) or from dev/convert_hf_gpt2.py"
SHARED_BPE_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "gpt2"))
GPT2_VOCAB = 50257        # with this vocabulary the tokenizer is GPT-2's and goes along
SAFETENSORS_ALIGN = 8     # the format pads its JSON header with spaces to this
PREFIX = "transformer."   # save_pretrained's names for GPT2LMHeadModel's body
SLOT_CHECKSUM_KIND, SLOT_CHECKSUM = 16, 17  # llmc/checkpoint.h: MODEL_SLOT_CHECKSUM_KIND, MODEL_SLOT_CHECKSUM
CHECKSUM_CRC32 = 0x32335243                 # MODEL_CHECKSUM_CRC32: slot 17 is the CRC-32 of the weights' bytes
CHECK_READ_BYTES = 1 << 24                  # read at a time for the checksum
# every file this script writes into its output folder; an earlier export's folder holds only these
EXPORT_FILES = ("model.safetensors", "config.json", "vocab.json", "merges.txt", "tokenizer_config.json")


class ExportError(Exception):
    """a wrong input: the message names the file, what is wrong and the fix"""


# ----------------------------------------------------------------------------
# the model file (llmc/checkpoint.h)

def newest_checkpoint(folder):
    """the model file of the newest complete checkpoint (DONE_<step> marker) in FOLDER that is whole and
    intact (read_header, check_sum); newer damaged ones are named and skipped, as train_gpt -y 1 does"""
    steps = sorted((int(m.group(1)) for m in (re.fullmatch(r"DONE_(\d{8})", n) for n in os.listdir(folder)) if m), reverse=True)
    if not steps:
        raise ExportError(f"'{folder}' holds no complete checkpoint (no DONE_<step> marker)\n"
                          f"  hint: give a model file, or a run's output folder (./train_gpt -o {folder})")
    problems = []
    for step in steps:
        path = os.path.join(folder, f"model_{step:08d}.bin")
        try:
            if not os.path.isfile(path):
                raise ExportError(f"'{folder}' marks step {step} complete but has no {os.path.basename(path)}\n  hint: {MODEL_HINT}")
            check_sum(path, read_header(path)[0])
        except ExportError as e:
            problems.append(str(e).split("\n")[0])
            print(f"skipped the checkpoint of step {step}: {problems[-1]}")
            continue
        return path
    raise ExportError(f"none of the {len(steps)} complete checkpoint(s) in '{folder}' is intact; the newest: {problems[0]}\n"
                      f"  hint: export a model file from a copy, or train again")


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


def check_sum(path, cfg):
    """stops if the model file PATH records the CRC-32 of its weights (train_gpt's files) and they no longer have it"""
    with open(path, "rb") as f:
        h = struct.unpack(f"<{hf.HEADER_INTS}i", f.read(4 * hf.HEADER_INTS))
        if h[1] != hf.MODEL_VERSION_FP32 or h[SLOT_CHECKSUM_KIND] != CHECKSUM_CRC32:
            return  # llm.c's files, bf16 files: none recorded
        crc = 0
        while True:
            chunk = f.read(CHECK_READ_BYTES)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
    recorded = h[SLOT_CHECKSUM] & 0xFFFFFFFF
    if crc != recorded:
        raise ExportError(f"'{path}' is damaged: its weights' CRC-32 is 0x{crc:08x}, but its header recorded 0x{recorded:08x} "
                          f"when train_gpt wrote it\n  hint: the file was changed after it was written (a disk or copy error, or an "
                          f"edit); export an earlier checkpoint, or a copy of this one")


def check_finite(name, data):
    """stops if a weight of the tensor NAME (array of floats) is NaN or infinite, naming the first"""
    if math.isfinite(sum(data)):  # a NaN or an infinity anywhere makes the sum one
        return
    i = next((i for i, x in enumerate(data) if not math.isfinite(x)), None)
    if i is None:
        return  # finite weights whose sum overflowed
    raise ExportError(f"{name}: element {i} is {data[i]}: a model with non-finite weights cannot be used\n"
                      f"  hint: it was written after its run diverged; export an earlier checkpoint")


def check_out_dir(out):
    """OUT is a folder to write into: new, empty, or an earlier export's (only EXPORT_FILES)"""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"-o '{out}' is a file, not a folder\n  hint: -o names the folder to write the Hugging Face files into")
    if os.path.isdir(out):
        others = sorted(n for n in os.listdir(out) if n not in EXPORT_FILES)
        if others:
            raise ExportError(f"-o '{out}' holds files this export does not write ({', '.join(others[:5])}"
                              f"{', ...' if len(others) > 5 else ''}): transformers would load them beside the new model\n"
                              f"  hint: choose a new or empty folder, or remove them")


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
                check_finite(f"'{model_path}': {name}", data)
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
        if bpe_dir is None:  # an earlier export's tokenizer is not this model's
            for stale in ("vocab.json", "merges.txt", "tokenizer_config.json"):
                if os.path.exists(os.path.join(out_dir, stale)):
                    os.remove(os.path.join(out_dir, stale))
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
        check_out_dir(out)
        cfg, _ = read_header(path)
        check_sum(path, cfg)
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
