"""
convert_hf_gpt2.py: a Hugging Face GPT-2 checkpoint (model.safetensors + config.json, as
published for gpt2, gpt2-medium, gpt2-large and gpt2-xl) into this project's model file, so
that ./train_gpt -e gpt2_124M.bin fine-tunes GPT-2 from OpenAI's weights, as llm.c does.

    python3 dev/convert_hf_gpt2.py gpt2/ -o gpt2_124M.bin     # a folder with both files
    python3 dev/convert_hf_gpt2.py gpt2/model.safetensors     # config.json beside it; writes gpt2.bin

The model file (llmc/checkpoint.h, llm.c's format): 256 int32 header [0] magic 20240326,
[1] version 3 (fp32), [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp, then the 16 tensors in
llm.c's order, every per-layer tensor layer-major. What the conversion does:
  - HF's Conv1D stores a linear layer's weight as (in, out); ours (and nn.Linear's) is
    (out, in), so c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are transposed;
  - the vocabulary is padded to Vp (V rounded up to a multiple of 128, llm.c's 50304 for
    GPT-2's 50257) with zero rows of wte;
  - the output layer is wte itself (tied); a checkpoint whose lm_head differs is refused;
  - the attention-mask buffers (h.N.attn.bias, .masked_bias) are not weights and are skipped;
  - F16 and BF16 tensors are widened to fp32 exactly.
The config must describe the model train_gpt computes: GELU with the tanh approximation
(gelu_new), LayerNorm eps 1e-5, an MLP of 4C, attention scaled by 1/sqrt(head size) only.

safetensors is read with the standard library: an 8-byte little-endian header length, a JSON
header {name: {"dtype", "shape", "data_offsets": [begin, end]}}, then the raw little-endian
tensors (the file is mapped and converted one tensor at a time, so memory stays near the
largest tensor: wte, 0.3 GB for gpt2-xl). With the `safetensors` and `numpy` packages installed, --reader auto (the
default) uses them instead, which is faster for the large models; --reader stdlib forces the
standard library. A sharded checkpoint (model.safetensors.index.json) is read shard by shard.

Failure: a missing or foreign file, a tensor missing or of the wrong shape, or a config this
trainer cannot compute stops with the file, what is wrong, and how to get a right one; the
output is written to a temporary name and renamed, so a failed run leaves no model file.
"""

import argparse
import array
import json
import mmap
import os
import struct
import sys
import zlib

MODEL_MAGIC = 20240326    # llmc/checkpoint.h
MODEL_VERSION_FP32 = 3
HEADER_INTS = 256
VOCAB_PAD_MULTIPLE = 128  # llmc/model_config.h: Vp = V rounded up to this
LAYERNORM_EPS = 1e-5      # cpu/layers.h
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # HF's names for GPT-2's tanh GELU

DOWNLOAD_HINT = ("a checkpoint is a folder with model.safetensors (not pytorch_model.bin) and config.json, e.g.\n"
                 "    hf download openai-community/gpt2 model.safetensors config.json --local-dir gpt2\n"
                 "  (or gpt2-medium, gpt2-large, gpt2-xl; doc/files.md: 'GPT-2's own weights' shows a download without pip)")


class ConvertError(Exception):
    """a wrong input: the message names the file, what is wrong and the fix"""


# ----------------------------------------------------------------------------
# the mapping: our 16 tensors in file order, each from HF's tensor(s)

# (our name, HF name ({l}: the layer), per layer, Conv1D weight to transpose)
TENSORS = [
    ("wte", "wte.weight", False, False),
    ("wpe", "wpe.weight", False, False),
    ("ln1w", "h.{l}.ln_1.weight", True, False),
    ("ln1b", "h.{l}.ln_1.bias", True, False),
    ("qkvw", "h.{l}.attn.c_attn.weight", True, True),
    ("qkvb", "h.{l}.attn.c_attn.bias", True, False),
    ("attprojw", "h.{l}.attn.c_proj.weight", True, True),
    ("attprojb", "h.{l}.attn.c_proj.bias", True, False),
    ("ln2w", "h.{l}.ln_2.weight", True, False),
    ("ln2b", "h.{l}.ln_2.bias", True, False),
    ("fcw", "h.{l}.mlp.c_fc.weight", True, True),
    ("fcb", "h.{l}.mlp.c_fc.bias", True, False),
    ("fcprojw", "h.{l}.mlp.c_proj.weight", True, True),
    ("fcprojb", "h.{l}.mlp.c_proj.bias", True, False),
    ("lnfw", "ln_f.weight", False, False),
    ("lnfb", "ln_f.bias", False, False),
]
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not weights
LM_HEAD = "lm_head.weight"


def hf_shape(hf_name, cfg):
    """the shape HF stores HF_NAME in (Conv1D weights as (in, out))"""
    C, V, maxT = cfg["C"], cfg["V"], cfg["maxT"]
    leaf = hf_name.split(".", 2)[-1] if hf_name.startswith("h.") else hf_name
    return {
        "wte.weight": [V, C], "wpe.weight": [maxT, C], "ln_f.weight": [C], "ln_f.bias": [C],
        "ln_1.weight": [C], "ln_1.bias": [C], "ln_2.weight": [C], "ln_2.bias": [C],
        "attn.c_attn.weight": [C, 3 * C], "attn.c_attn.bias": [3 * C],
        "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C],
        "mlp.c_fc.weight": [C, 4 * C], "mlp.c_fc.bias": [4 * C],
        "mlp.c_proj.weight": [4 * C, C], "mlp.c_proj.bias": [C],
    }[leaf]


# ----------------------------------------------------------------------------
# config.json: the shape, and what this trainer can compute

def read_config(path):
    """the model shape from HF's config.json: {"L", "C", "NH", "V", "Vp", "maxT"}"""
    if not os.path.isfile(path):
        raise ConvertError(f"'{path}' not found: the converter needs the checkpoint's config.json beside "
                           f"model.safetensors (or --config PATH)\n  hint: {DOWNLOAD_HINT}")
    try:
        with open(path) as f:
            c = json.load(f)
    except (OSError, ValueError) as e:
        raise ConvertError(f"'{path}' is not a readable JSON config: {e}\n  hint: {DOWNLOAD_HINT}")
    if not isinstance(c, dict):
        raise ConvertError(f"'{path}' is not a Hugging Face config (a JSON object)\n  hint: {DOWNLOAD_HINT}")
    if c.get("model_type", "gpt2") != "gpt2":
        raise ConvertError(f"'{path}' describes a '{c.get('model_type')}' model, not GPT-2 (model_type \"gpt2\")\n"
                           f"  hint: {DOWNLOAD_HINT}")
    missing = [k for k in ("n_layer", "n_embd", "n_head", "vocab_size") if k not in c]
    if "n_positions" not in c and "n_ctx" not in c:
        missing.append("n_positions")
    if missing:
        raise ConvertError(f"'{path}' lacks {', '.join(missing)}: not a GPT-2 config.json\n  hint: {DOWNLOAD_HINT}")

    def refuse(what):
        raise ConvertError(f"'{path}': {what}; train_gpt computes GPT-2 exactly as published (tanh GELU, "
                           f"LayerNorm eps 1e-5, MLP 4*n_embd, attention scaled by 1/sqrt(head size), tied lm_head)")
    act = c.get("activation_function", "gelu_new")
    if act not in TANH_GELUS:
        refuse(f"activation_function is '{act}', not the tanh GELU ({', '.join(TANH_GELUS)})")
    if abs(c.get("layer_norm_epsilon", LAYERNORM_EPS) - LAYERNORM_EPS) > 1e-12:
        refuse(f"layer_norm_epsilon is {c['layer_norm_epsilon']}, not {LAYERNORM_EPS}")
    if c.get("n_inner") not in (None, 4 * c["n_embd"]):
        refuse(f"n_inner is {c['n_inner']}, not 4 * n_embd = {4 * c['n_embd']}")
    if not c.get("scale_attn_weights", True) or c.get("scale_attn_by_inverse_layer_idx", False):
        refuse("the attention scores are not scaled by 1/sqrt(head size) alone (scale_attn_weights, "
               "scale_attn_by_inverse_layer_idx)")
    if c.get("add_cross_attention", False):
        refuse("add_cross_attention is set")
    if not c.get("tie_word_embeddings", True):
        refuse("tie_word_embeddings is false")
    cfg = {"L": c["n_layer"], "C": c["n_embd"], "NH": c["n_head"], "V": c["vocab_size"],
           "maxT": c.get("n_positions", c.get("n_ctx"))}
    if any(not isinstance(v, int) or v < 1 for v in cfg.values()) or cfg["C"] % cfg["NH"]:
        raise ConvertError(f"'{path}': impossible shape n_layer={cfg['L']} n_embd={cfg['C']} n_head={cfg['NH']} "
                           f"vocab_size={cfg['V']} n_positions={cfg['maxT']} (positive, n_embd divisible by n_head)")
    cfg["Vp"] = (cfg["V"] + VOCAB_PAD_MULTIPLE - 1) // VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE
    return cfg


# ----------------------------------------------------------------------------
# safetensors with the standard library

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit


def not_safetensors(path, why):
    return ConvertError(f"'{path}' is not a safetensors file ({why})\n  hint: {DOWNLOAD_HINT}")


class SafetensorsFile:
    """one .safetensors file, mapped; tensor(name) -> (shape, array('f'))"""

    def __init__(self, path):
        self.path = path
        try:
            self.file = open(path, "rb")
        except OSError as e:
            raise ConvertError(f"cannot open '{path}': {e.strerror}\n  hint: {DOWNLOAD_HINT}")
        size = os.fstat(self.file.fileno()).st_size
        if size < 8:
            raise not_safetensors(path, f"{size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", self.file.read(8))
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise not_safetensors(path, f"a header length of {n} bytes in a file of {size}")
        try:
            header = json.loads(self.file.read(n))
        except ValueError:
            raise not_safetensors(path, "its header is not JSON")
        if not isinstance(header, dict):
            raise not_safetensors(path, "its header is not a JSON object")
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        self.entries = {}
        for name, e in header.items():
            try:
                dtype, shape, (begin, end) = e["dtype"], list(e["shape"]), e["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise not_safetensors(path, f"entry '{name}' lacks dtype, shape or data_offsets")
            count = 1
            for d in shape:
                count *= d
            if dtype in DTYPE_BYTES and end - begin != count * DTYPE_BYTES[dtype]:
                raise not_safetensors(path, f"'{name}' ({dtype} {shape}) spans {end - begin} bytes, not "
                                            f"{count * DTYPE_BYTES[dtype]}")
            if not 0 <= begin <= end <= size - self.data_start:
                raise ConvertError(f"'{path}' is truncated: tensor '{name}' ends at byte {self.data_start + end}, "
                                   f"the file has {size}\n  hint: download it again; {DOWNLOAD_HINT}")
            self.entries[name] = (dtype, shape, begin, end)
        self.map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ) if size > self.data_start else b""

    def names(self):
        return list(self.entries)

    def tensor(self, name):
        """(shape, flat array('f')) of NAME, widened to fp32"""
        dtype, shape, begin, end = self.entries[name]
        raw = self.map[self.data_start + begin:self.data_start + end]
        if dtype == "F32":
            data = array.array("f")
            data.frombytes(raw)
            if sys.byteorder == "big":
                data.byteswap()
        elif dtype == "F64":
            data = array.array("f", struct.unpack(f"<{len(raw) // 8}d", raw))
        elif dtype == "F16":
            data = array.array("f", struct.unpack(f"<{len(raw) // 2}e", raw))
        elif dtype == "BF16":  # bf16 is the top half of an fp32
            halves = array.array("H")
            halves.frombytes(raw)
            if sys.byteorder == "big":
                halves.byteswap()
            words = array.array("I", (h << 16 for h in halves))
            data = array.array("f")
            data.frombytes(words.tobytes())
        else:
            raise ConvertError(f"'{self.path}': tensor '{name}' has dtype {dtype}; this converter reads F32, F16, "
                               f"BF16 and F64\n  hint: {DOWNLOAD_HINT}")
        return shape, data

    def close(self):
        if isinstance(self.map, mmap.mmap):
            self.map.close()
        self.file.close()


class PackageSafetensorsFile:
    """the same through the `safetensors` package (numpy arrays): the fast path"""

    def __init__(self, path):
        import numpy as np
        from safetensors import safe_open
        self.np, self.path = np, path
        try:
            self.f = safe_open(path, framework="numpy")
        except Exception as e:  # the package's own error types vary between versions
            raise not_safetensors(path, f"the safetensors package says: {e}")
        self.keys = list(self.f.keys())

    def names(self):
        return self.keys

    def tensor(self, name):
        try:
            a = self.f.get_tensor(name)
        except Exception as e:  # numpy has no bfloat16, for one
            raise ConvertError(f"'{self.path}': the safetensors package cannot read '{name}' as numpy ({e})\n"
                               f"  hint: --reader stdlib")
        if a.dtype.kind != "f" and str(a.dtype) != "bfloat16":
            raise ConvertError(f"'{self.path}': tensor '{name}' has dtype {a.dtype}, not a float\n  hint: {DOWNLOAD_HINT}")
        return list(a.shape), a.astype("<f4").reshape(-1)

    def close(self):
        self.f = None


def package_reader_available():
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        return True
    except ImportError:
        return False


class Checkpoint:
    """the tensors of a checkpoint, over one file or the shards an index names, by HF name
    without the "transformer." prefix that GPT2LMHeadModel.save_pretrained adds"""

    def __init__(self, paths, reader):
        opener = PackageSafetensorsFile if reader == "safetensors" else SafetensorsFile
        self.files = [opener(p) for p in paths]
        self.where = {}
        for f in self.files:
            for name in f.names():
                self.where[name] = f
        self.paths = paths
        if "wte.weight" in self.where:
            self.prefix = ""
        elif "transformer.wte.weight" in self.where:
            self.prefix = "transformer."
        else:
            some = ", ".join(sorted(self.where)[:6]) or "no tensors"
            raise ConvertError(f"'{paths[0]}' has no GPT-2 token embedding 'wte.weight' (it holds {some}): "
                               f"not a GPT-2 checkpoint\n  hint: {DOWNLOAD_HINT}")

    def key(self, name):
        """NAME as stored: lm_head sits beside "transformer.", not under it"""
        return name if name == LM_HEAD else self.prefix + name

    def has(self, name):
        return self.key(name) in self.where

    def tensor(self, name):
        return self.where[self.key(name)].tensor(self.key(name))

    def names(self):
        """every tensor name, without the prefix"""
        n = len(self.prefix)
        return [k[n:] if k.startswith(self.prefix) else k for k in self.where]

    def close(self):
        for f in self.files:
            f.close()


def checkpoint_files(path):
    """the .safetensors file(s) and the config.json of PATH (a folder or a file)"""
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    if os.path.isdir(path):
        single, index = os.path.join(path, "model.safetensors"), os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(single):
            path = single
        elif os.path.isfile(index):
            path = index
        else:
            raise ConvertError(f"'{folder}' holds neither model.safetensors nor model.safetensors.index.json\n"
                               f"  hint: {DOWNLOAD_HINT}")
    elif not os.path.isfile(path):
        raise ConvertError(f"'{path}' not found\n  hint: {DOWNLOAD_HINT}")
    if path.endswith(".index.json"):
        try:
            with open(path) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConvertError(f"'{path}' is not a safetensors index (a JSON weight_map): {e!r}\n  hint: {DOWNLOAD_HINT}")
        paths = [os.path.join(folder, s) for s in shards]
        lost = [p for p in paths if not os.path.isfile(p)]
        if lost:
            raise ConvertError(f"'{path}' names shards that are not there: {', '.join(lost)}\n  hint: {DOWNLOAD_HINT}")
        return paths, os.path.join(folder, "config.json")
    return [path], os.path.join(folder, "config.json")


# ----------------------------------------------------------------------------
# the conversion

def transpose(shape, data):
    """(rows, cols) -> (cols, rows), row-major, for array('f') or a numpy array"""
    rows, cols = shape
    if not isinstance(data, array.array):
        return data.reshape(rows, cols).T.reshape(-1)
    out = array.array("f")
    for j in range(cols):  # row j of the result is column j of data (a strided slice, in C)
        out.extend(data[j::cols])
    return out


def to_bytes(data):
    if isinstance(data, array.array):
        if sys.byteorder == "big":
            data = array.array("f", data)
            data.byteswap()
        return data.tobytes()
    return data.astype("<f4").tobytes()


def check_names(ck, cfg):
    """every tensor there, with HF's shape; nothing we would silently drop"""
    wanted = {}
    for _, hf, per_layer, _ in TENSORS:
        for l in range(cfg["L"] if per_layer else 1):
            wanted[hf.format(l=l)] = hf_shape(hf, cfg)
    files = ", ".join(ck.paths)
    missing = [n for n in wanted if not ck.has(n)]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ConvertError(f"'{files}' lacks {len(missing)} tensor(s) that config.json's GPT-2 (L={cfg['L']}) needs: "
                           f"{', '.join(missing[:5])}{more}\n  hint: is config.json the one of this checkpoint? "
                           f"{DOWNLOAD_HINT}")
    extra = [n for n in ck.names() if n not in wanted and n != LM_HEAD and not n.endswith(BUFFER_SUFFIXES)]
    if extra:
        raise ConvertError(f"'{files}' holds tensors a GPT-2 of config.json's shape has not: {', '.join(extra[:5])}\n"
                           f"  hint: is config.json the one of this checkpoint (n_layer={cfg['L']})? {DOWNLOAD_HINT}")
    return wanted


def checked_tensor(ck, name, want_shape):
    shape, data = ck.tensor(name)
    if list(shape) != want_shape:
        raise ConvertError(f"'{ck.paths[0]}': tensor '{name}' has shape {list(shape)}, config.json implies "
                           f"{want_shape}\n  hint: is config.json the one of this checkpoint? {DOWNLOAD_HINT}")
    return shape, data


def convert(ck, cfg, out, progress):
    """writes the model file's body (after the header) to OUT, tensor by tensor"""
    wanted = check_names(ck, cfg)
    L, C, V, Vp = cfg["L"], cfg["C"], cfg["V"], cfg["Vp"]
    for ours, hf, per_layer, is_conv1d in TENSORS:
        for l in range(L if per_layer else 1):
            name = hf.format(l=l)
            shape, data = checked_tensor(ck, name, wanted[name])
            if is_conv1d:
                data = transpose(shape, data)
            out.write(to_bytes(data))
        if ours == "wte":  # the padded rows V..Vp-1
            out.write(bytes(4 * (Vp - V) * C))
        progress(ours)
    if ck.has(LM_HEAD):  # tied: the output layer must be wte
        lm_shape, lm = ck.tensor(LM_HEAD)
        _, wte = ck.tensor("wte.weight")
        if list(lm_shape) != [V, C] or to_bytes(lm) != to_bytes(wte):
            raise ConvertError(f"'{ck.paths[0]}': lm_head.weight differs from wte.weight; this model file ties "
                               f"the output layer to the token embedding (as GPT-2 does)")


def model_header(cfg):
    h = [0] * HEADER_INTS
    h[0:8] = [MODEL_MAGIC, MODEL_VERSION_FP32, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    return struct.pack(f"<{HEADER_INTS}i", *h)


SLOT_CHECKSUM_KIND, SLOT_CHECKSUM = 16, 17   # llmc/checkpoint.h: the CRC-32 of the weights, as train_gpt's files record it
CHECKSUM_CRC32 = 0x32335243
CHECKSUM_READ_BYTES = 1 << 24


def stamp_checksum(path):
    """records the CRC-32 of the model file's weights in its header, as train_gpt writes its own (llm.c ignores these slots)"""
    crc = 0
    with open(path, "r+b") as f:
        f.seek(4 * HEADER_INTS)
        while True:
            chunk = f.read(CHECKSUM_READ_BYTES)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
        f.seek(4 * SLOT_CHECKSUM_KIND)
        f.write(struct.pack("<iI", CHECKSUM_CRC32, crc))
        f.flush()
        os.fsync(f.fileno())


def num_parameters(cfg):
    L, C, Vp, maxT = cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


def main(argv=None):
    ap = argparse.ArgumentParser(description="Hugging Face GPT-2 (model.safetensors + config.json) -> "
                                             "train_gpt model file (fp32, version 3)")
    ap.add_argument("checkpoint", help="a folder with model.safetensors (or model.safetensors.index.json) and "
                                       "config.json, or the .safetensors file")
    ap.add_argument("-o", "--out", help="the model file to write (default: the folder's name + .bin)")
    ap.add_argument("--config", help="config.json (default: beside the checkpoint)")
    ap.add_argument("--reader", choices=("auto", "stdlib", "safetensors"), default="auto",
                    help="auto: the safetensors package (with numpy) when installed, else the standard library")
    args = ap.parse_args(argv)

    reader = args.reader
    if reader == "auto":
        reader = "safetensors" if package_reader_available() else "stdlib"
    elif reader == "safetensors" and not package_reader_available():
        print("error: --reader safetensors needs the safetensors and numpy packages (pip install safetensors numpy)",
              file=sys.stderr)
        return 1
    out_path = tmp = None
    try:
        paths, config_path = checkpoint_files(args.checkpoint)
        ck = Checkpoint(paths, reader)
        cfg = read_config(args.config or config_path)
        folder = os.path.dirname(os.path.abspath(paths[0]))
        out_path = args.out or os.path.basename(folder) + ".bin"
        P = num_parameters(cfg)
        print(f"{', '.join(paths)} ({reader} reader): L={cfg['L']} C={cfg['C']} NH={cfg['NH']} V={cfg['V']} "
              f"(padded to {cfg['Vp']}) maxT={cfg['maxT']}, {P:,} parameters")
        tmp = out_path + ".tmp"
        with open(tmp, "wb") as out:
            out.write(model_header(cfg))
            convert(ck, cfg, out, lambda name: print(f"  {name}", end="", flush=True))
            out.flush()
            os.fsync(out.fileno())
        print()
        ck.close()
        expected = 4 * HEADER_INTS + 4 * P
        if os.path.getsize(tmp) != expected:  # a bug here, not in the input
            raise ConvertError(f"wrote {os.path.getsize(tmp)} bytes, the header implies {expected}")
        stamp_checksum(tmp)
        os.replace(tmp, out_path)
        tmp = None
    except ConvertError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the output cannot be written: -o in a folder that does not exist, a full disk
        print(f"\nerror: cannot write '{e.filename or out_path}': {e.strerror}\n"
              f"  hint: -o a path in a folder that exists and is writable", file=sys.stderr)
        return 1
    finally:
        if tmp and os.path.exists(tmp):
            os.remove(tmp)
    print(f"wrote {out_path} ({os.path.getsize(out_path):,} bytes): ./train_gpt -e {out_path} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
