#!/usr/bin/env python3
"""The PyTorch side of `pipetrain-bench compute`: trains the same GPT as the cpu backend
(pre-LayerNorm blocks, fused qkv, causal attention, tanh GELU, ln_f, untied lm_head,
mean cross-entropy; AdamW lr 3e-4, betas 0.9/0.999, eps 1e-8, no weight decay) in float32,
or with --precision bf16 under torch.autocast("cpu", dtype=torch.bfloat16), on the CPU
with a given thread count, and prints one JSON object: the median step time of
--steps steps after one warm-up step, and tokens/s.

With --model llama it trains a Llama instead, as Hugging Face's LlamaForCausalLM computes
it (tests/testdata/make_llama_fixture.py): no position embedding, pre-RMSNorm blocks,
rotary embeddings in rotate_half form with llama3 frequency scaling, grouped-query
attention (--kv-heads key/value heads repeated to the query heads), a SwiGLU MLP
down(silu(gate x) * up x) of width --ffn-dim, a final RMSNorm, no biases, and the lm_head
tied to the token embedding with --tie-embeddings; same optimizer, steps and timing.

With --device cuda it trains on the GPU instead (`pipetrain-bench cuda-train`): eager mode,
float32 products in TF32 with --tf32, bf16 under torch.autocast("cuda"), each step timed to
the device's last kernel (torch.cuda.synchronize).

Run with Debian's /usr/bin/python3 (python3-torch). Without torch it prints
{"error": "..."} and exits 0, so the C++ benchmark can label the comparison as skipped.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # ImportError, or a broken install
    print(json.dumps({"error": f"torch is not importable by {sys.executable}: {e}"}))
    sys.exit(0)


def attend(q, k, v):
    """Causal attention of (B, H, T, hs) heads: the fused kernel where torch has it."""
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        return self.c_proj(attend(q, k, v).transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, seq, d, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class RmsNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):  # Hugging Face's LlamaRMSNorm: in float32, then back
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotary_inv_freq(hs, theta, scaling):
    """inv_freq (hs / 2) with Llama 3.1's scaling (factor, low, high, original) or None."""
    inv = [1.0 / theta ** (2 * i / hs) for i in range(hs // 2)]
    if scaling is None:
        return torch.tensor(inv)
    factor, low, high, old = scaling
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn, eps):
        super().__init__()
        self.heads, self.kv_heads, self.hs = heads, kv_heads, d // heads
        self.input_layernorm = RmsNorm(d, eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.hs, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.hs, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RmsNorm(d, eps)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def attention(self, x, cos, sin):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads  # repeat_kv: query head h reads h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return self.o_proj(attend(q, k, v).transpose(1, 2).reshape(B, T, C))

    def forward(self, x, cos, sin):
        x = x + self.attention(self.input_layernorm(x), cos, sin)
        m = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


class Llama(nn.Module):
    def __init__(self, vocab, seq, d, heads, layers, kv_heads, ffn, theta, scaling, eps, tied):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)  # as HF's; N(0, 1) tied is huge
        self.layers = nn.ModuleList(LlamaBlock(d, heads, kv_heads, ffn, eps)
                                    for _ in range(layers))
        self.norm = RmsNorm(d, eps)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight
        angles = torch.arange(seq)[:, None] * rotary_inv_freq(d // heads, theta, scaling)[None]
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), dim=-1))
        self.register_buffer("sin", torch.cat((angles.sin(), angles.sin()), dim=-1))

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def rope_scaling(text):
    """--rope-scaling FACTOR,LOW,HIGH,ORIGINAL (llama3), or none."""
    if text == "none":
        return None
    factor, low, high, old = text.split(",")
    return float(factor), float(low), float(high), int(old)


def make_model(a):
    if a.model == "gpt2":
        return Gpt(a.vocab, a.seq, a.d_model, a.heads, a.layers)
    return Llama(a.vocab, a.seq, a.d_model, a.heads, a.layers, a.kv_heads or a.heads,
                 a.ffn_dim or 4 * a.d_model, a.rope_theta, a.rope_scaling, a.norm_eps,
                 a.tie_embeddings)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--kv-heads", type=int, default=0, help="llama: 0 = --heads")
    p.add_argument("--ffn-dim", type=int, default=0, help="llama: 0 = 4 x --d-model")
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--rope-scaling", type=rope_scaling, default=None,
                   help="llama3 scaling FACTOR,LOW,HIGH,ORIGINAL, or none")
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU (eager mode)")
    p.add_argument("--tf32", action="store_true",
                   help="cuda: float32 products on the tensor cores in TF32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device(a.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(json.dumps({"error": "torch sees no GPU (torch.cuda.is_available() is False)"}))
            sys.exit(0)
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    model = make_model(a).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    times, loss = [], None
    for step in range(a.steps + 1):
        rows = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the step ends when the GPU's work does
        if step > 0:  # the first step warms up allocations and kernels
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    print(json.dumps({
        "torch_version": torch.__version__,
        "threads": a.threads,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "tf32": a.tf32,
        "precision": a.precision,
        "attention": "scaled_dot_product_attention"
        if hasattr(F, "scaled_dot_product_attention") else "explicit softmax",
        "step_seconds": step_s,
        "tokens_per_s": a.batch * a.seq / step_s,
        "loss": loss.item(),
    }))


if __name__ == "__main__":
    main()
