#!/usr/bin/python3
"""Makes the golden Llama fixture in tests/testdata/llama_tiny/ with PyTorch.

A Llama written from the architecture's definition (Hugging Face's LlamaForCausalLM:
modeling_llama.py's math, not pipetrain's code): token embedding, no position
embedding; blocks x2 = x + o_proj(attn(rope(q_proj(n1), k_proj(n1)), v_proj(n1))),
y = x2 + down_proj(silu(gate_proj(n2)) * up_proj(n2)) with n = RMSNorm (x / sqrt(mean
x^2 + eps) * w); rotary embeddings in Hugging Face's rotate_half form (the first and
second halves of each head are the pairs) with llama3 frequency scaling; grouped-query
attention (n_kv_heads key/value heads repeated to the query heads, repeat_kv), causal,
scaled by 1/sqrt(head_dim); a final RMSNorm and an untied lm_head; no biases anywhere;
loss = mean cross-entropy. Weights are nn.Linear's [out, in].

As make_gpt_fixture.py: float32 weights (norm weights random too), the loss and every
gradient in float64, checked against PyTorch's own F.* path and finite differences.
Run with Debian's PyTorch: /usr/bin/python3 tests/testdata/make_llama_fixture.py
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt_fixture import (checked_loss_and_grads, make_batch, start_fixture,  # noqa: E402
                              summary, write_safetensors)

CONFIG = {"vocab_size": 256, "seq_len": 16, "d_model": 32, "n_heads": 4, "n_layers": 2}
LLAMA = {"architecture": "llama", "n_kv_heads": 2, "ffn_dim": 48, "rope_theta": 10000.0,
         "norm_eps": 1e-5,
         # Heads of 8: wavelengths 6.3, 63, 628 and 6283 positions; with an original
         # context of 128 the first is kept, the second blended, the last two stretched.
         "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 128}}
BATCH = 3
SEED = 20261203
TEXT = ("It was the best of times, it was the worst of times, it was the age of "
        "wisdom, it was the age of foolishness.")


def param_specs(cfg, llama):
    V, C, F_ = cfg["vocab_size"], cfg["d_model"], llama["ffn_dim"]
    hd = C // cfg["n_heads"]
    kv = llama["n_kv_heads"] * hd
    specs = [("model.embed_tokens.weight", (V, C), "embedding")]
    for i in range(cfg["n_layers"]):
        p = f"model.layers.{i}."
        specs += [(p + "input_layernorm.weight", (C,), "norm"),
                  (p + "self_attn.q_proj.weight", (C, C), "linear"),
                  (p + "self_attn.k_proj.weight", (kv, C), "linear"),
                  (p + "self_attn.v_proj.weight", (kv, C), "linear"),
                  (p + "self_attn.o_proj.weight", (C, C), "linear"),
                  (p + "post_attention_layernorm.weight", (C,), "norm"),
                  (p + "mlp.gate_proj.weight", (F_, C), "linear"),
                  (p + "mlp.up_proj.weight", (F_, C), "linear"),
                  (p + "mlp.down_proj.weight", (C, F_), "linear")]
    specs += [("model.norm.weight", (C,), "norm"), ("lm_head.weight", (V, C), "linear")]
    return specs


def init_weights(cfg, llama, seed):
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape, kind in param_specs(cfg, llama):
        r = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "linear":  # [out, in]
            w = r / math.sqrt(shape[1])
        elif kind == "embedding":
            w = 0.5 * r
        else:
            w = 1.0 + 0.2 * r
        weights[name] = w.to(torch.float32)
    return weights


# --- the model, from its definition (float64) ----------------------------------------

def inv_freq(cfg, llama):
    hd = cfg["d_model"] // cfg["n_heads"]
    base = torch.tensor([1.0 / llama["rope_theta"] ** (2 * i / hd) for i in range(hd // 2)],
                        dtype=torch.float64)
    s = llama["rope_scaling"]
    if s is None:
        return base
    old, low, high, factor = (s["original_max_position_embeddings"], s["low_freq_factor"],
                              s["high_freq_factor"], s["factor"])
    out = []
    for f in base.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, cos, sin):  # x (B, H, T, hd); cos, sin (T, hd)
    return x * cos + rotate_half(x) * sin


def attention(x, p, h, cfg, llama, cos, sin):
    B, T, C = x.shape
    H, KV = cfg["n_heads"], llama["n_kv_heads"]
    hd = C // H
    q = (x @ p[h + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
    k = (x @ p[h + "self_attn.k_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
    v = (x @ p[h + "self_attn.v_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv: head h reads h // (H / KV)
    v = v.repeat_interleave(H // KV, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    probs = probs / probs.sum(dim=-1, keepdim=True)
    y = (probs @ v).transpose(1, 2).reshape(B, T, C)
    return y @ p[h + "self_attn.o_proj.weight"].T


def forward_loss(p, cfg, llama, inputs, targets, torch_path=False):
    T = inputs.shape[1]
    eps = llama["norm_eps"]
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg, llama)[None, :]
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1)
    x = p["model.embed_tokens.weight"][inputs]
    for i in range(cfg["n_layers"]):
        h = f"model.layers.{i}."
        x = x + attention(rms_norm(x, p[h + "input_layernorm.weight"], eps), p, h, cfg, llama,
                          cos, sin)
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        if torch_path:
            g = F.silu(F.linear(m, p[h + "mlp.gate_proj.weight"]))
            m = F.linear(g * F.linear(m, p[h + "mlp.up_proj.weight"]), p[h + "mlp.down_proj.weight"])
        else:
            g = m @ p[h + "mlp.gate_proj.weight"].T
            m = ((g / (1 + (-g).exp())) * (m @ p[h + "mlp.up_proj.weight"].T)) @ \
                p[h + "mlp.down_proj.weight"].T
        x = x + m
    x = rms_norm(x, p["model.norm.weight"], eps)
    logits = x @ p["lm_head.weight"].T
    if torch_path:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    top = logits.amax(dim=-1, keepdim=True)
    log_z = top + (logits - top).exp().sum(dim=-1, keepdim=True).log()
    return -(logits - log_z).gather(-1, targets.unsqueeze(-1)).mean()


def main():
    out = start_fixture(__doc__.splitlines()[0], "llama_tiny")
    cfg, llama = CONFIG, LLAMA
    weights32 = init_weights(cfg, llama, SEED)
    text, inputs, targets = make_batch(cfg, BATCH, TEXT)
    loss, grads, loss_torch, worst = checked_loss_and_grads(
        weights32, lambda p: forward_loss(p, cfg, llama, inputs, targets),
        lambda p: forward_loss(p, cfg, llama, inputs, targets, torch_path=True), SEED + 1)

    os.makedirs(out, exist_ok=True)
    names = [n for n, _, _ in param_specs(cfg, llama)]
    model_json = json.dumps({**cfg, **llama}, separators=(",", ":"))
    meta = {"format": "pt", "pipetrain_format": "1",
            "pipetrain_layers": f"0:{cfg['n_layers'] + 2}",
            **{k: str(v) for k, v in cfg.items()}, "pipetrain_model": model_json,
            "generator": "tests/testdata/make_llama_fixture.py",
            "torch_version": torch.__version__}
    write_safetensors(os.path.join(out, "weights.safetensors"),
                      [(n, weights32[n]) for n in names], {**meta, "content": "weights"})
    write_safetensors(os.path.join(out, "grads.safetensors"),
                      [(n, grads[n].to(torch.float32)) for n in names],
                      {**meta, "content": "gradients of the loss in expected.json"})
    expected = {"config": {**cfg, **llama}, "batch": BATCH, "seed": SEED, "text": text,
                "inputs": inputs.tolist(), "targets": targets.tolist(), "loss": loss.item(),
                "reference_dtype": "float64", "torch_version": torch.__version__,
                "tensors": {n: {"shape": list(weights32[n].shape),
                                "weight": summary(weights32[n]),
                                "grad": summary(grads[n].to(torch.float32))} for n in names}}
    with open(os.path.join(out, "expected.json"), "w") as f:
        f.write(json.dumps(expected, indent=1) + "\n")
    print(f"loss {loss.item():.17g} (F path agrees to {abs(loss_torch - loss.item()):.1e}); "
          f"finite differences: worst rel. error {worst:.1e}; {len(names)} tensors -> {out}")


if __name__ == "__main__":
    main()
