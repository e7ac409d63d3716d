"""
Writes the reference files the C tests compare against, from an independent PyTorch GPT-2.

    pip install torch transformers came-pytorch
    python3 dev/reference/make_reference.py

Outputs (all little-endian, described slot by slot in dev/reference/README.md):
    tiny_model.bin             llm.c checkpoint (magic 20240326, version 3: fp32, padded vocab)
    tiny_adamw.bin             debug state + 10 training steps with AdamW        (optimizer id 0)
    tiny_adafactor.bin         same, Adafactor with relative step               (optimizer id 1)
    tiny_adafactor_beta1.bin   same, Adafactor with beta1=0.9 and a fixed lr     (optimizer id 1)
    tiny_came.bin              same, CAME                                        (optimizer id 2)
    tiny_came_wd.bin           same, CAME with weight decay 0.01                 (optimizer id 2)
The script is deterministic: re-running it rewrites bitwise-identical files.

The model. nanoGPT's GPT-2 at toy size: L=2, C=48, NH=4, maxT=16, V=101 (Vp=128 in the files).
Pre-LN blocks, LayerNorm eps 1e-5, explicit causal attention, GELU tanh approximation, final LN,
lm_head tied to wte, no dropout, all fp32. GPT-2 init (normal(0, 0.02) for wte, wpe and Linear
weights, normal(0, 0.02/sqrt(2L)) for both c_proj weights, zero biases, LN weight 1 bias 0) and
THEN every bias and every LayerNorm weight and bias gets + normal(0, PERTURB_STD): with exact
zeros and ones a C forward that skipped a bias add or read ln1b in place of ln2b would still pass.

The batch. B=3, T=11 (T < maxT on purpose: wpe rows T..maxT-1 get zero gradient), x and y
uniform in [0, V). The training loop runs n_steps=10 steps on that same batch:
    loss_i = forward; backward; norm_i = global L2 norm over all grads (before clipping);
    if norm_i > grad_clip: every grad *= grad_clip / norm_i   (by hand: no +1e-6 as in clip_grad_norm_)
    optimizer step
Each optimizer "parameter" below is one torch tensor: the per-layer tensors are separate
nn.Linear / nn.LayerNorm parameters, so a C optimizer must treat layer l's slice of qkvw,
(3C, C), as its own matrix (its own row/col factors and its own RMS), and likewise each layer's
slice of every 1-D tensor (its own RMS). wte is one (V, C) matrix on the UNPADDED V rows; the
padded rows V..Vp-1 do not exist on the torch side and are written as zeros.

AdamW (torch.optim.AdamW, single-tensor path): lr 1e-3, betas (0.9, 0.95), eps 1e-8, bias
corrected; decoupled weight decay 0.1 only on the 2-D weights (wte, wpe, qkvw, attprojw, fcw,
fcprojw): p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).

Adafactor (transformers.optimization.Adafactor; Shazeer & Stern 2018), per parameter p with
gradient g, step t = 1, 2, ...:
    rms_p   = RMS(p)                                  (before any change to p this step)
    lr_t    = relative_step ? min(1e-2, 1/sqrt(t)) : lr
    lr_t   *= scale_parameter ? max(eps2, rms_p) : 1
    beta2_t = 1 - t^decay_rate                        (decay_rate -0.8; beta2_1 = 0)
    G       = g^2 + eps1
    if p is 2-D (n, m):  R = beta2_t*R + (1-beta2_t)*mean(G, over cols)   (n,)
                         Cc = beta2_t*Cc + (1-beta2_t)*mean(G, over rows)  (m,)
                         U = g * rsqrt(R / mean(R))[:, None] * rsqrt(Cc)[None, :]
                         (U = g / sqrt(V), V = R Cc^T / mean(R): the paper's R C^T / sum(R)
                         with row/col sums, written with means; the two are equal)
    else:                V = beta2_t*V + (1-beta2_t)*G;  U = g * rsqrt(V)
    U      /= max(1, RMS(U) / clip_threshold)
    U      *= lr_t
    if beta1: M = beta1*M + (1-beta1)*U; U = M        (the momentum holds lr-scaled updates)
    if wd:    p -= wd * lr_t * p                      (after U is formed, before p -= U)
    p      -= U
The relative-step file uses relative_step=True, scale_parameter=True, warmup_init=False,
lr=None, beta1=None, clip_threshold 1.0, decay_rate -0.8, eps (EPS1, 1e-3), weight_decay 0;
the beta1 file uses relative_step=False, scale_parameter=False, lr=1e-3, beta1=0.9.
AdafactorTranscription below writes this out; the script checks it equals HF's class.

CAME (came_pytorch.CAME 0.1.3; Luo et al. 2023), per parameter, no bias correction anywhere:
    G       = g^2 + eps1
    2-D:  R, Cc EMAs of G's row/col means with beta2;  U = g * rsqrt(R/mean(R))[:,None] * rsqrt(Cc)[None,:]
    else: V = beta2*V + (1-beta2)*G;  U = g * rsqrt(V)
    U      /= max(1, RMS(U) / clip_threshold)         (clip_threshold 1.0, the package default)
    M       = beta1*M + (1-beta1)*U
    2-D:  Res = (U - M)^2 + eps2;  Rr, Rc EMAs of Res's row/col means with beta3
          U = M * rsqrt(Rr/mean(Rr))[:,None] * rsqrt(Rc)[None,:]
    else: U = M                                       (1-D tensors get no confidence factor)
    if wd:    p -= wd * lr * p                        (on every tensor, biases and LN included)
    p      -= lr * U
lr 2e-4, betas (0.9, 0.999, 0.9999), eps (EPS1, 1e-16), weight_decay 0 (and 0.01 in _wd).
CAMETranscription below writes this out; the script checks it equals the package.

EPS1 = 1e-12 in place of the libraries' default 1e-30: see the comment at EPS1 (the key-bias
gradient is rounding noise, and 1e-30 would amplify it into +-lr updates).
"""

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 1337
PERTURB_STD = 0.02     # noise added to every bias and LayerNorm weight/bias after GPT-2 init
LN_EPS = 1e-5
B, T = 3, 11
N_STEPS = 10

MODEL_MAGIC, MODEL_VERSION = 20240326, 3    # as llm.c: version 3 = fp32 params, padded vocab
STATE_MAGIC, STATE_VERSION = 20240327, 2    # as llm.c's debug state, extended (see README)
HEADER_INTS = 256
OPT_ADAMW, OPT_ADAFACTOR, OPT_CAME = 0, 1, 2
# float32 slots of the state header
SLOT_LR, SLOT_BETA1, SLOT_BETA2, SLOT_EPS, SLOT_WD, SLOT_GRAD_CLIP, SLOT_EXTRA0, SLOT_EXTRA1 = range(8, 16)

# -----------------------------------------------------------------------------
# the model (nanoGPT-like; every per-layer tensor is its own parameter)

@dataclass
class GPTConfig:
    max_seq_len: int = 16        # maxT, wpe rows
    vocab_size: int = 101        # V, real tokens
    num_layers: int = 2          # L
    num_heads: int = 4           # NH
    channels: int = 48           # C

    @property
    def padded_vocab_size(self):  # Vp: V rounded up to a multiple of 128, as llm.c
        return (self.vocab_size + 127) // 128 * 128


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.nh = cfg.num_heads
        self.c_attn = nn.Linear(cfg.channels, 3 * cfg.channels)   # rows: q (C), k (C), v (C)
        self.c_proj = nn.Linear(cfg.channels, cfg.channels)

    def forward(self, x):
        Bx, Tx, C = x.size()
        hs = C // self.nh
        q, k, v = self.c_attn(x).split(C, dim=2)                          # 3 x (B, T, C)
        q = q.view(Bx, Tx, self.nh, hs).transpose(1, 2)                   # (B, nh, T, hs)
        k = k.view(Bx, Tx, self.nh, hs).transpose(1, 2)                   # (B, nh, T, hs)
        v = v.view(Bx, Tx, self.nh, hs).transpose(1, 2)                   # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))           # (B, nh, T, T)
        causal = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
        att = att.masked_fill(~causal, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v                                                       # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(Bx, Tx, C)                # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.channels, 4 * cfg.channels)
        self.c_proj = nn.Linear(4 * cfg.channels, cfg.channels)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.channels, eps=LN_EPS)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.channels, eps=LN_EPS)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.channels)    # (V, C), also the lm_head
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.channels)   # (maxT, C)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.ln_f = nn.LayerNorm(cfg.channels, eps=LN_EPS)

    def forward(self, idx, targets):
        Tx = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(Tx))           # (B, T, C)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()                         # (B, T, V), tied lm_head
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


@torch.no_grad()
def init_gpt2(model):
    """GPT-2 init, then small noise on biases and LayerNorms (see PERTURB_STD)."""
    L = model.cfg.num_layers
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            p.normal_(0.0, 0.02 / math.sqrt(2 * L))
        elif p.dim() == 2:                          # wte, wpe, c_attn, c_fc
            p.normal_(0.0, 0.02)
        elif "ln_" in name and name.endswith("weight"):
            p.fill_(1.0)
        else:                                       # Linear and LayerNorm biases
            p.zero_()
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.add_(torch.randn_like(p) * PERTURB_STD)

# -----------------------------------------------------------------------------
# the 16 llm.c tensors, in checkpoint order, as lists of per-layer torch tensors

def llmc_tensors(model):
    """[(name, [torch params making up that tensor, layer-major])] in llm.c checkpoint order."""
    h = model.h
    return [
        ("wte",      [model.wte.weight]),                    # (V, C), padded to (Vp, C) in files
        ("wpe",      [model.wpe.weight]),                    # (maxT, C)
        ("ln1w",     [b.ln_1.weight for b in h]),            # (L, C)
        ("ln1b",     [b.ln_1.bias for b in h]),              # (L, C)
        ("qkvw",     [b.attn.c_attn.weight for b in h]),     # (L, 3C, C)
        ("qkvb",     [b.attn.c_attn.bias for b in h]),       # (L, 3C)
        ("attprojw", [b.attn.c_proj.weight for b in h]),     # (L, C, C)
        ("attprojb", [b.attn.c_proj.bias for b in h]),       # (L, C)
        ("ln2w",     [b.ln_2.weight for b in h]),            # (L, C)
        ("ln2b",     [b.ln_2.bias for b in h]),              # (L, C)
        ("fcw",      [b.mlp.c_fc.weight for b in h]),        # (L, 4C, C)
        ("fcb",      [b.mlp.c_fc.bias for b in h]),          # (L, 4C)
        ("fcprojw",  [b.mlp.c_proj.weight for b in h]),      # (L, C, 4C)
        ("fcprojb",  [b.mlp.c_proj.bias for b in h]),        # (L, C)
        ("lnfw",     [model.ln_f.weight]),                   # (C,)
        ("lnfb",     [model.ln_f.bias]),                     # (C,)
    ]

DECAYED_TENSORS = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}   # AdamW weight decay


def llmc_arrays(model, use_grad):
    """The 16 tensors (or their grads) as flat fp32 numpy arrays, wte padded with zero rows."""
    cfg = model.cfg
    out = []
    for name, params in llmc_tensors(model):
        flat = torch.cat([(p.grad if use_grad else p).detach().reshape(-1) for p in params])
        a = flat.numpy().astype("<f4")
        if name == "wte":
            pad = np.zeros((cfg.padded_vocab_size - cfg.vocab_size) * cfg.channels, dtype="<f4")
            a = np.concatenate([a, pad])
        out.append(a)
    return out


def llmc_sizes(cfg):
    """Element counts of the 16 tensors in the files (padded layout)."""
    L, C, maxT, Vp = cfg.num_layers, cfg.channels, cfg.max_seq_len, cfg.padded_vocab_size
    return [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
            L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]

# -----------------------------------------------------------------------------
# optimizers: transcriptions of HF Adafactor and of came_pytorch.CAME (checked against them)

def rms(x):
    return x.norm(2) / (x.numel() ** 0.5)


def factored_rsqrt(row, col):
    """rsqrt of the rank-1 estimate R Cc^T / mean(R), as an (n, m) matrix."""
    return (row / row.mean()).rsqrt().unsqueeze(-1) * col.unsqueeze(-2).rsqrt()


def ema_(avg, x, beta):
    avg.mul_(beta).add_(x, alpha=1.0 - beta)


class AdafactorTranscription:
    def __init__(self, params, lr, beta1, eps1, eps2, clip_threshold, decay_rate, weight_decay,
                 relative_step, scale_parameter):
        self.params = list(params)
        self.hp = dict(lr=lr, beta1=beta1, eps1=eps1, eps2=eps2, clip_threshold=clip_threshold,
                       decay_rate=decay_rate, wd=weight_decay, relative_step=relative_step,
                       scale_parameter=scale_parameter)
        self.state = {p: {} for p in self.params}
        self.t = 0

    @torch.no_grad()
    def step(self):
        hp = self.hp
        self.t += 1
        t = self.t
        for p in self.params:
            g, s = p.grad, self.state[p]
            if not s:
                s.update(row=p.new_zeros(p.shape[0]), col=p.new_zeros(p.shape[1])) if p.dim() == 2 \
                    else s.update(v=torch.zeros_like(p))
                if hp["beta1"]:
                    s["m"] = torch.zeros_like(p)
            lr_t = min(1e-2, 1.0 / math.sqrt(t)) if hp["relative_step"] else hp["lr"]
            if hp["scale_parameter"]:
                lr_t *= max(hp["eps2"], rms(p))
            beta2_t = 1.0 - math.pow(t, hp["decay_rate"])
            g2 = g * g + hp["eps1"]
            if p.dim() == 2:
                ema_(s["row"], g2.mean(dim=-1), beta2_t)
                ema_(s["col"], g2.mean(dim=-2), beta2_t)
                u = factored_rsqrt(s["row"], s["col"]) * g
            else:
                ema_(s["v"], g2, beta2_t)
                u = s["v"].rsqrt() * g
            u /= (rms(u) / hp["clip_threshold"]).clamp(min=1.0)
            u *= lr_t
            if hp["beta1"]:
                ema_(s["m"], u, hp["beta1"])
                u = s["m"]
            if hp["wd"]:
                p.add_(p, alpha=-hp["wd"] * lr_t)
            p.sub_(u)


class CAMETranscription:
    def __init__(self, params, lr, betas, eps, weight_decay, clip_threshold=1.0):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.wd, self.clip = lr, betas, eps, weight_decay, clip_threshold
        self.state = {p: {} for p in self.params}

    @torch.no_grad()
    def step(self):
        beta1, beta2, beta3 = self.betas
        for p in self.params:
            g, s = p.grad, self.state[p]
            if not s:
                s["m"] = torch.zeros_like(p)
                if p.dim() == 2:
                    for k, n in (("row", p.shape[0]), ("col", p.shape[1]),
                                 ("res_row", p.shape[0]), ("res_col", p.shape[1])):
                        s[k] = p.new_zeros(n)
                else:
                    s["v"] = torch.zeros_like(p)
            g2 = g * g + self.eps[0]
            if p.dim() == 2:
                ema_(s["row"], g2.mean(dim=-1), beta2)
                ema_(s["col"], g2.mean(dim=-2), beta2)
                u = factored_rsqrt(s["row"], s["col"]) * g
            else:
                ema_(s["v"], g2, beta2)
                u = s["v"].rsqrt() * g
            u /= (rms(u) / self.clip).clamp(min=1.0)
            ema_(s["m"], u, beta1)
            if p.dim() == 2:
                res = (u - s["m"]) ** 2 + self.eps[1]
                ema_(s["res_row"], res.mean(dim=-1), beta3)
                ema_(s["res_col"], res.mean(dim=-2), beta3)
                u = factored_rsqrt(s["res_row"], s["res_col"]) * s["m"]
            else:
                u = s["m"].clone()
            if self.wd:
                p.add_(p, alpha=-self.wd * self.lr)
            p.sub_(u * self.lr)

# -----------------------------------------------------------------------------
# the runs: one dict per state file, holding the optimizer and its header floats

# eps1 (the floor under g^2) is 1e-12 here, not the libraries' 1e-30. The key bias (rows C..2C-1
# of qkvb) has a gradient that is exactly zero in exact arithmetic (adding q.b to every score of a
# softmax row changes nothing), so in fp32 it is rounding noise of about 1e-11. With eps1 = 1e-30,
# Adafactor and CAME normalise that noise to updates of +-lr, its random signs feed RMS(U) of the
# whole qkvb slice, and a correct fp32 run then differs from the same run in fp64 by 2e-5 in the
# loss and 3e-3 in qkvb after 10 steps. With 1e-12 (far below every real g^2 here, which are
# >= 1e-9) fp32 and fp64 agree to about 1e-6 (checked by precision_check below), so a C
# implementation can be held to tight tolerances. The C code reads eps1 from the header.
EPS1 = 1e-12
ADAFACTOR_COMMON = dict(eps1=EPS1, eps2=1e-3, clip_threshold=1.0, decay_rate=-0.8, weight_decay=0.0)
CAME_COMMON = dict(lr=2e-4, betas=(0.9, 0.999, 0.9999), eps=(EPS1, 1e-16))

# grad_clip per run, chosen by looking at the norms (1.5..2.0 here) so that some of the 10 steps
# clip and some do not, each norm at least CLIP_MARGIN away from the threshold (run_training
# asserts both); the norms are printed when the script runs
CLIP_MARGIN = 1e-3     # relative; fp32 rounding cannot flip a clip decision
RUNS = [
    dict(file="tiny_adamw.bin", opt=OPT_ADAMW, grad_clip=1.6,
         hp=dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)),
    dict(file="tiny_adafactor.bin", opt=OPT_ADAFACTOR, grad_clip=1.85,
         hp=dict(ADAFACTOR_COMMON, lr=None, beta1=None, relative_step=True, scale_parameter=True)),
    dict(file="tiny_adafactor_beta1.bin", opt=OPT_ADAFACTOR, grad_clip=1.8,
         hp=dict(ADAFACTOR_COMMON, lr=1e-3, beta1=0.9, relative_step=False, scale_parameter=False)),
    dict(file="tiny_came.bin", opt=OPT_CAME, grad_clip=1.65, hp=dict(CAME_COMMON, weight_decay=0.0)),
    dict(file="tiny_came_wd.bin", opt=OPT_CAME, grad_clip=1.65, hp=dict(CAME_COMMON, weight_decay=0.01)),
]


def make_optimizer(model, run, transcription=False):
    hp = run["hp"]
    if run["opt"] == OPT_ADAMW:
        decay, no_decay = [], []
        for name, params in llmc_tensors(model):
            (decay if name in DECAYED_TENSORS else no_decay).extend(params)
        groups = [dict(params=decay, weight_decay=hp["weight_decay"]),
                  dict(params=no_decay, weight_decay=0.0)]
        return torch.optim.AdamW(groups, lr=hp["lr"], betas=hp["betas"], eps=hp["eps"],
                                 foreach=False, fused=False)
    params = [p for _, ps in llmc_tensors(model) for p in ps]
    if run["opt"] == OPT_ADAFACTOR:
        if transcription:
            return AdafactorTranscription(params, **hp)
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=hp["lr"], eps=(hp["eps1"], hp["eps2"]),
                         clip_threshold=hp["clip_threshold"], decay_rate=hp["decay_rate"],
                         beta1=hp["beta1"], weight_decay=hp["weight_decay"],
                         scale_parameter=hp["scale_parameter"], relative_step=hp["relative_step"],
                         warmup_init=False)
    if transcription:
        return CAMETranscription(params, **hp)
    from came_pytorch import CAME
    return CAME(params, **hp)


def header_floats(run):
    """The 8 float32 slots [8..15] of the state header for this run."""
    hp = run["hp"]
    if run["opt"] == OPT_ADAMW:
        vals = [hp["lr"], hp["betas"][0], hp["betas"][1], hp["eps"], hp["weight_decay"],
                run["grad_clip"], 0.0, 0.0]
    elif run["opt"] == OPT_ADAFACTOR:   # lr 0 = relative step with scale_parameter
        vals = [hp["lr"] or 0.0, hp["beta1"] or 0.0, hp["decay_rate"], hp["eps1"],
                hp["weight_decay"], run["grad_clip"], hp["eps2"], hp["clip_threshold"]]
    else:
        vals = [hp["lr"], hp["betas"][0], hp["betas"][1], hp["eps"][0], hp["weight_decay"],
                run["grad_clip"], hp["betas"][2], hp["eps"][1]]
    return vals

# -----------------------------------------------------------------------------
# training loop

def build_model(cfg):
    torch.manual_seed(SEED)
    model = GPT(cfg)
    init_gpt2(model)
    return model


def make_batch(cfg):
    g = torch.Generator().manual_seed(SEED + 1)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    y = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    return x, y


def run_training(cfg, run, x, y, transcription=False, dtype=torch.float32):
    """Returns (logits, loss, grads) of step 0, losses, norms, and the final model."""
    model = build_model(cfg).to(dtype)     # init always in fp32, so every dtype starts equal
    opt = make_optimizer(model, run, transcription)
    params = [p for _, ps in llmc_tensors(model) for p in ps]
    losses, norms, first = [], [], None
    for step in range(N_STEPS):
        for p in params:
            p.grad = None
        logits, loss = model(x, y)
        loss.backward()
        if step == 0:
            first = (logits.detach().clone(), loss.item(), llmc_arrays(model, use_grad=True))
        norm = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in params))
        if norm > run["grad_clip"]:
            with torch.no_grad():
                for p in params:
                    p.grad.mul_(run["grad_clip"] / norm)
        opt.step()
        losses.append(loss.item())
        norms.append(norm)
    clipped = [n > run["grad_clip"] for n in norms]
    margin = min(abs(n / run["grad_clip"] - 1.0) for n in norms)
    assert any(clipped) and not all(clipped) and margin > CLIP_MARGIN, \
        f"{run['file']}: choose a grad_clip that clips some steps, not near any of the norms {norms}"
    return first, losses, norms, model

# -----------------------------------------------------------------------------
# file writers and readers

def int_header(values):
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:len(values)] = values
    return h


def write_model_file(path, model):
    cfg = model.cfg
    h = int_header([MODEL_MAGIC, MODEL_VERSION, cfg.max_seq_len, cfg.vocab_size, cfg.num_layers,
                    cfg.num_heads, cfg.channels, cfg.padded_vocab_size])
    with open(path, "wb") as f:
        f.write(h.tobytes())
        for a in llmc_arrays(model, use_grad=False):
            f.write(a.tobytes())


def write_state_file(path, run, x, y, first, losses, norms, final_model):
    logits, loss, grads = first
    h = int_header([STATE_MAGIC, STATE_VERSION, B, T, N_STEPS, run["opt"]])
    h[SLOT_LR:SLOT_EXTRA1 + 1] = np.array(header_floats(run), dtype="<f4").view("<i4")
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(x.numpy().astype("<i4").tobytes())                   # (B, T)
        f.write(y.numpy().astype("<i4").tobytes())                   # (B, T)
        f.write(logits.numpy().astype("<f4").tobytes())              # (B, T, V) unpadded
        f.write(np.array([loss], dtype="<f4").tobytes())             # (1,)
        for a in grads:                                              # 16 tensors, padded
            f.write(a.tobytes())
        f.write(np.array(losses, dtype="<f4").tobytes())             # (n_steps,)
        f.write(np.array(norms, dtype="<f4").tobytes())              # (n_steps,)
        for a in llmc_arrays(final_model, use_grad=False):           # 16 tensors, padded
            f.write(a.tobytes())


def read_model_file(path):
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:4 * HEADER_INTS], dtype="<i4")
    assert h[0] == MODEL_MAGIC and h[1] == MODEL_VERSION, f"{path}: bad magic/version"
    cfg = GPTConfig(max_seq_len=int(h[2]), vocab_size=int(h[3]), num_layers=int(h[4]),
                    num_heads=int(h[5]), channels=int(h[6]))
    assert h[7] == cfg.padded_vocab_size and not h[8:].any(), f"{path}: bad header"
    body = np.frombuffer(raw[4 * HEADER_INTS:], dtype="<f4")
    assert body.size == sum(llmc_sizes(cfg)), f"{path}: {body.size} floats, expected {sum(llmc_sizes(cfg))}"
    return cfg, np.split(body, np.cumsum(llmc_sizes(cfg))[:-1])


def read_state_file(path, cfg):
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:4 * HEADER_INTS], dtype="<i4")
    assert h[0] == STATE_MAGIC and h[1] == STATE_VERSION, f"{path}: bad magic/version"
    nb, nt, n_steps = int(h[2]), int(h[3]), int(h[4])
    assert not h[6:8].any() and not h[16:].any(), f"{path}: nonzero reserved header slots"
    hf = h[8:16].view("<f4")
    n_params = sum(llmc_sizes(cfg))
    ints = np.frombuffer(raw, dtype="<i4", offset=4 * HEADER_INTS, count=2 * nb * nt)
    floats = np.frombuffer(raw, dtype="<f4", offset=4 * (HEADER_INTS + 2 * nb * nt))
    expected = nb * nt * cfg.vocab_size + 1 + n_params + 2 * n_steps + n_params
    assert floats.size == expected, f"{path}: {floats.size} floats after x/y, expected {expected}"
    parts = np.split(floats, np.cumsum([nb * nt * cfg.vocab_size, 1, n_params, n_steps, n_steps]))
    logits, loss, grads, losses, norms, final = parts
    return dict(header=h, floats=hf, x=ints[:nb * nt].reshape(nb, nt), y=ints[nb * nt:].reshape(nb, nt),
                logits=logits.reshape(nb, nt, cfg.vocab_size), loss=float(loss[0]), grads=grads,
                losses=losses, norms=norms, final=final)

# -----------------------------------------------------------------------------
# main

def max_abs_diff(model_a, model_b):
    return max((pa.double() - pb.double()).abs().max().item()
               for pa, pb in zip(model_a.parameters(), model_b.parameters()))


def precision_check(cfg, run, x, y, losses, model):
    """Reruns in fp64: how closely a different but correct fp32 implementation can match."""
    transcription = run["opt"] != OPT_ADAMW    # the libraries' state is fp32-only in places
    _, losses64, _, model64 = run_training(cfg, run, x, y, transcription, dtype=torch.float64)
    dloss = max(abs(a - b) for a, b in zip(losses, losses64))
    dparam = max_abs_diff(model, model64)
    print(f"  fp32 vs fp64: max |loss diff| {dloss:.1e}, max |param diff| {dparam:.1e}")
    assert dloss < 1e-5 and dparam < 2e-5, f"{run['file']}: reference too sensitive to rounding"


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cfg = GPTConfig()
    x, y = make_batch(cfg)

    model_path = os.path.join(HERE, "tiny_model.bin")
    write_model_file(model_path, build_model(cfg))
    cfg_read, tensors = read_model_file(model_path)
    assert cfg_read == cfg
    assert not tensors[0][cfg.vocab_size * cfg.channels:].any(), "padded wte rows must be zero"
    print(f"wrote {model_path} ({os.path.getsize(model_path)} bytes)")

    for run in RUNS:
        first, losses, norms, model = run_training(cfg, run, x, y)
        path = os.path.join(HERE, run["file"])
        write_state_file(path, run, x, y, first, losses, norms, model)
        st = read_state_file(path, cfg)
        assert st["header"][5] == run["opt"] and np.array_equal(st["x"], x.numpy())
        assert st["loss"] == np.float32(first[1]) == st["losses"][0]
        assert np.array_equal(st["final"], np.concatenate(llmc_arrays(model, use_grad=False)))
        print(f"wrote {path} ({os.path.getsize(path)} bytes) grad_clip {run['grad_clip']}")
        print("  losses " + " ".join(f"{v:.6f}" for v in losses))
        print("  norms  " + " ".join(f"{v:.4f}" for v in norms))
        if run["opt"] != OPT_ADAMW:
            # the transcription in this file must agree with the library it documents
            _, losses_t, _, model_t = run_training(cfg, run, x, y, transcription=True)
            diff = max_abs_diff(model, model_t)
            assert diff < 1e-6, f"{run['file']}: transcription differs from library by {diff}"
            print(f"  transcription vs library: max |param diff| {diff:.1e}, "
                  f"max |loss diff| {max(abs(a - b) for a, b in zip(losses, losses_t)):.1e}")
        precision_check(cfg, run, x, y, losses, model)

if __name__ == "__main__":
    main()
