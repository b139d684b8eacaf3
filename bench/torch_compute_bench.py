#!/usr/bin/env python3
"""The PyTorch side of `pipetrain-bench compute`: trains the same GPT as the cpu backend
(pre-LayerNorm blocks, fused qkv, causal attention, tanh GELU, ln_f, untied lm_head,
mean cross-entropy; AdamW lr 3e-4, betas 0.9/0.999, eps 1e-8, no weight decay) in float32,
or with --precision bf16 under torch.autocast("cpu", dtype=torch.bfloat16), on the CPU
with a given thread count, and prints one JSON object: the median step time of
--steps steps after one warm-up step, and tokens/s.

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
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: the fused kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

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
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


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
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Gpt(a.vocab, a.seq, a.d_model, a.heads, a.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    times, loss = [], None
    for step in range(a.steps + 1):
        rows = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        opt.step()
        if step > 0:  # the first step warms up allocations and kernels
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    print(json.dumps({
        "torch_version": torch.__version__,
        "threads": a.threads,
        "precision": a.precision,
        "attention": "scaled_dot_product_attention"
        if hasattr(F, "scaled_dot_product_attention") else "explicit softmax",
        "step_seconds": step_s,
        "tokens_per_s": a.batch * a.seq / step_s,
        "loss": loss.item(),
    }))


if __name__ == "__main__":
    main()
