"""
Writes a tiny random GPT-2 checkpoint as Hugging Face transformers saves one, and the logits
transformers computes with it, for tests/test_convert.py (dev/convert_hf_gpt2.py against the
trainer). CI never runs this script; its outputs are committed.

    pip install torch transformers safetensors
    python3 dev/reference/make_tiny_hf_gpt2.py

Outputs, in dev/reference/tiny_hf_gpt2/:
    config.json        GPT2Config: n_layer=2 n_embd=32 n_head=4 n_positions=32 vocab_size=101
    model.safetensors  GPT2LMHeadModel.save_pretrained's weights (keys "transformer.h.0...",
                       lm_head tied to wte and so not stored), fp32
    logits.bin         the logits of every batch, fp32 little-endian, (N, B, T, V), no header
    reference.json     B, T, V, N; the token stream; per batch the mean cross-entropy (computed
                       in fp64 from the logits in logits.bin) and the global L2 norm of the
                       gradient of that loss (fp64 over the fp32 gradients, the tied wte once);
                       the package versions

The batches are the ones train_gpt's data loader reads from a shard holding the token stream
(N*B*T + 1 tokens, llmc/dataloader.h): batch k, row b has inputs stream[k*B*T + b*T + t] and
targets stream[k*B*T + b*T + t + 1], t < T. T = n_positions, so every row of wpe is used.

The weights are not GPT-2's initialisation: with std 0.02 the logits are nearly uniform and the
attention nearly flat, and a converter that skipped a transpose or swapped two LayerNorms would
still give a loss within 1e-3 of ln V. Here matrices are N(0, 0.15), wte N(0, 0.4), biases and
LayerNorm biases N(0, 0.1), LayerNorm weights 1 + N(0, 0.1): sharp logits, peaked attention.
"""

import json
import os

import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_hf_gpt2")
SEED = 1337
N, B = 4, 2           # batches, rows per batch
MATRIX_STD, WTE_STD, WPE_STD, VECTOR_STD = 0.15, 0.4, 0.1, 0.1


def tiny_model():
    cfg = GPT2Config(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                     bos_token_id=100, eos_token_id=100,  # the last id, where train_gpt puts EOT for a small vocabulary
                     attn_implementation="eager")  # explicit softmax(q k^T / sqrt(hs)) v
    model = GPT2LMHeadModel(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("wte.weight"):
                p.normal_(0.0, WTE_STD)
            elif name.endswith("wpe.weight"):
                p.normal_(0.0, WPE_STD)
            elif p.dim() == 2:
                p.normal_(0.0, MATRIX_STD)
            elif ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + VECTOR_STD * torch.randn_like(p))
            else:
                p.normal_(0.0, VECTOR_STD)
    return model


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = tiny_model()
    V, T = model.config.vocab_size, model.config.n_positions
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head must be tied"
    stream = torch.randint(0, V, (N * B * T + 1,), generator=torch.Generator().manual_seed(SEED + 1))

    logits_all, losses, norms = [], [], []
    for k in range(N):
        start = k * B * T
        x = torch.stack([stream[start + b * T: start + b * T + T] for b in range(B)])
        y = torch.stack([stream[start + b * T + 1: start + b * T + T + 1] for b in range(B)])
        model.zero_grad()
        logits = model(input_ids=x).logits  # (B, T, V)
        F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).backward()
        norm2 = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters())
        loss64 = F.cross_entropy(logits.detach().double().reshape(-1, V), y.reshape(-1))
        logits_all.append(logits.detach().float())
        losses.append(float(loss64))
        norms.append(norm2 ** 0.5)
        print(f"batch {k}: loss {losses[-1]:.6f} (ln V = {torch.log(torch.tensor(float(V))):.4f}), "
              f"grad norm {norms[-1]:.6f}")

    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(OUT, extra)):
            os.remove(os.path.join(OUT, extra))
    with open(os.path.join(OUT, "logits.bin"), "wb") as f:
        f.write(torch.stack(logits_all).contiguous().numpy().astype("<f4").tobytes())
    ref = {"B": B, "T": T, "V": V, "N": N, "tokens": stream.tolist(), "loss": losses, "grad_norm": norms,
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    with open(os.path.join(OUT, "reference.json"), "w") as f:  # one key a line
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in ref.items()) + "\n}\n")
    for name in sorted(os.listdir(OUT)):
        print(f"wrote {os.path.join(OUT, name)} ({os.path.getsize(os.path.join(OUT, name)):,} bytes)")


if __name__ == "__main__":
    main()
