#!/usr/bin/python3
"""Makes the golden GPT fixture in tests/testdata/gpt_tiny/ with PyTorch.

An implementation of the model independent of the C++ one, written from the model's
description alone: GPT-2 style, pre-LayerNorm blocks, fused qkv projection (q|k|v along the
output dimension, heads contiguous), causal attention scaled by 1/sqrt(head_dim), GELU in
its tanh form, LayerNorm with biased variance and eps 1e-5, final ln_f, untied lm_head
without bias, loss = mean cross-entropy over all B*T positions. Parameters use the
Hugging Face GPT-2 names and layouts: linear weights [in, out] (y = x W + b), lm_head
[vocab, d_model] (y = x W^T), wte [vocab, d_model], wpe [seq_len, d_model].

Weights are random (seeded; biases and LayerNorm parameters too, so that every one is
exercised), stored as float32; the loss and gradients are computed in float64 from those
float32 values, so the C++ model, which reads the same float32 weights, computes the
same function. Outputs:
  weights.safetensors  float32 weights, config in __metadata__ (a pipetrain checkpoint)
  grads.safetensors    float32 gradient of the loss for every parameter, same names
  expected.json        config, batch, the text used, inputs, targets, the float64 loss,
                       and per-tensor first/last/sum values for byte-exact checks

Run with Debian's PyTorch (apt-get install python3-torch, or
deploy/install-deps.sh --with-torch):  /usr/bin/python3 tests/testdata/make_gpt_fixture.py
The output is deterministic for a given PyTorch version; the files are committed so the
test suite never needs PyTorch.
"""

import argparse
import json
import math
import os
import re
import struct

import torch
import torch.nn.functional as F

CONFIG = {"vocab_size": 256, "seq_len": 16, "d_model": 16, "n_heads": 4, "n_layers": 2}
BATCH = 3
SEED = 20261129
# Byte-level tokens: B rows of T+1 bytes are taken from the start of this text.
TEXT = ("It was the best of times, it was the worst of times, it was the age of "
        "wisdom, it was the age of foolishness.")
LN_EPS = 1e-5


def param_specs(cfg):
    """(name, shape, kind) of every parameter, in pipeline-layer order (as the C++
    RangeParams lists them)."""
    V, T, C = cfg["vocab_size"], cfg["seq_len"], cfg["d_model"]
    specs = [("transformer.wte.weight", (V, C), "embedding"),
             ("transformer.wpe.weight", (T, C), "embedding")]
    for i in range(cfg["n_layers"]):
        p = f"transformer.h.{i}."
        specs += [(p + "ln_1.weight", (C,), "ln_weight"),
                  (p + "ln_1.bias", (C,), "bias"),
                  (p + "attn.c_attn.weight", (C, 3 * C), "linear"),
                  (p + "attn.c_attn.bias", (3 * C,), "bias"),
                  (p + "attn.c_proj.weight", (C, C), "linear"),
                  (p + "attn.c_proj.bias", (C,), "bias"),
                  (p + "ln_2.weight", (C,), "ln_weight"),
                  (p + "ln_2.bias", (C,), "bias"),
                  (p + "mlp.c_fc.weight", (C, 4 * C), "linear"),
                  (p + "mlp.c_fc.bias", (4 * C,), "bias"),
                  (p + "mlp.c_proj.weight", (4 * C, C), "linear"),
                  (p + "mlp.c_proj.bias", (C,), "bias")]
    specs += [("transformer.ln_f.weight", (C,), "ln_weight"),
              ("transformer.ln_f.bias", (C,), "bias"),
              ("lm_head.weight", (V, C), "linear_t")]
    return specs


def init_weights(cfg, seed):
    """Random float32 weights, scaled so activations stay O(1) and the softmaxes are
    neither uniform nor saturated."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape, kind in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "linear":        # [in, out]
            w = r / math.sqrt(shape[0])
        elif kind == "linear_t":    # [out, in]
            w = r / math.sqrt(shape[1])
        elif kind == "embedding":
            w = 0.5 * r
        elif kind == "ln_weight":
            w = 1.0 + 0.2 * r
        else:                       # biases, LayerNorm shifts
            w = 0.1 * r
        weights[name] = w.to(torch.float32)
    return weights


def make_batch(cfg, batch, text):
    data = text.encode("ascii")
    T = cfg["seq_len"]
    need = batch * (T + 1)
    assert len(data) >= need, f"the text has {len(data)} bytes, {need} needed"
    used = data[:need]
    rows = [list(used[b * (T + 1):(b + 1) * (T + 1)]) for b in range(batch)]
    inputs = torch.tensor([r[:T] for r in rows], dtype=torch.long)
    targets = torch.tensor([r[1:] for r in rows], dtype=torch.long)
    return used.decode("ascii"), inputs, targets


# --- the model, from its definition (float64) ----------------------------------------

def layer_norm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, w_attn, b_attn, w_proj, b_proj, n_heads):
    B, T, C = x.shape
    hd = C // n_heads
    qkv = x @ w_attn + b_attn                           # (B, T, 3C): q | k | v
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    # Heads contiguous: head h owns channels [h*hd, (h+1)*hd) of each of q, k, v.
    q = q.reshape(B, T, n_heads, hd).permute(0, 2, 1, 3)  # (B, H, T, hd)
    k = k.reshape(B, T, n_heads, hd).permute(0, 2, 1, 3)
    v = v.reshape(B, T, n_heads, hd).permute(0, 2, 1, 3)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)    # (B, H, T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    scores = scores - scores.amax(dim=-1, keepdim=True)
    probs = scores.exp()
    probs = probs / probs.sum(dim=-1, keepdim=True)
    y = (probs @ v).permute(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C)
    return y @ w_proj + b_proj


def forward_loss(p, cfg, inputs, targets):
    T = inputs.shape[1]
    x = p["transformer.wte.weight"][inputs] + p["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layers"]):
        h = f"transformer.h.{i}."
        x = x + attention(layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]),
                          p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"],
                          p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"],
                          cfg["n_heads"])
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        m = gelu_tanh(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        x = x + (m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"])
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    logits = x @ p["lm_head.weight"].T                   # (B, T, V)
    top = logits.amax(dim=-1, keepdim=True)
    log_z = top + (logits - top).exp().sum(dim=-1, keepdim=True).log()
    log_probs = logits - log_z
    return -log_probs.gather(-1, targets.unsqueeze(-1)).mean()


# --- the same model from PyTorch's own building blocks, to check the one above --------

def forward_loss_torch(p, cfg, inputs, targets):
    B, T = inputs.shape
    C, H = cfg["d_model"], cfg["n_heads"]
    x = F.embedding(inputs, p["transformer.wte.weight"]) + p["transformer.wpe.weight"][:T]
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    for i in range(cfg["n_layers"]):
        h = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], LN_EPS)
        # nn.functional.linear wants [out, in].
        qkv = F.linear(a, p[h + "attn.c_attn.weight"].T, p[h + "attn.c_attn.bias"])
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = torch.softmax(q @ k.transpose(-1, -2) * (C // H) ** -0.5 + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[h + "attn.c_proj.weight"].T, p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], LN_EPS)
        m = F.gelu(F.linear(m, p[h + "mlp.c_fc.weight"].T, p[h + "mlp.c_fc.bias"]),
                   approximate="tanh")
        x = x + F.linear(m, p[h + "mlp.c_proj.weight"].T, p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], LN_EPS)
    logits = F.linear(x, p["lm_head.weight"])
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def check_against_finite_differences(params, loss_of, grads, gen):
    """Central differences on a few entries of every parameter (float64): loss_of(params)
    is the loss, grads the gradients autograd gave. Returns the worst relative error."""
    h = 1e-6
    worst = 0.0
    for name, value in params.items():
        flat = value.detach().view(-1)
        for idx in torch.randint(flat.numel(), (3,), generator=gen).tolist():
            orig = flat[idx].item()
            with torch.no_grad():
                flat[idx] = orig + h
                up = loss_of(params).item()
                flat[idx] = orig - h
                down = loss_of(params).item()
                flat[idx] = orig
            numeric = (up - down) / (2 * h)
            analytic = grads[name].view(-1)[idx].item()
            err = abs(numeric - analytic) / max(1e-3, abs(numeric) + abs(analytic))
            worst = max(worst, err)
            assert err < 1e-5, f"{name}[{idx}]: finite difference {numeric} vs autograd {analytic}"
    return worst


def checked_loss_and_grads(weights32, loss_of, torch_loss_of, seed):
    """The loss of the float32 weights computed in float64 by loss_of(params) and its
    gradient by autograd; the script checks itself: PyTorch's own layers
    (torch_loss_of(params)) agree to 1e-12, and so do finite differences (entries drawn
    with `seed`). Returns the loss, the gradients, the F.* path's loss and the worst
    finite-difference error."""
    params = {n: w.to(torch.float64).requires_grad_(True) for n, w in weights32.items()}
    loss = loss_of(params)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    loss_torch = torch_loss_of(params).item()
    assert abs(loss_torch - loss.item()) <= 1e-12 * abs(loss.item()), (loss_torch, loss.item())
    worst = check_against_finite_differences(params, loss_of, grads,
                                             torch.Generator().manual_seed(seed))
    return loss, grads, loss_torch, worst


# --- output ---------------------------------------------------------------------------

def write_safetensors(path, tensors, metadata):
    """A minimal safetensors writer (Debian has no safetensors package): 8-byte
    little-endian header length, JSON header padded with spaces to 8-byte alignment,
    raw little-endian data in the order given."""
    header = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name, t in tensors:
        assert t.dtype == torch.float32
        raw = t.contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * ((8 - (8 + len(js)) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


def summary(t):
    """First, last and exact sum of a float32 tensor's values, for byte-exact checks."""
    values = t.reshape(-1).tolist()
    return {"first": values[0], "last": values[-1], "sum": math.fsum(values)}


def start_fixture(description, folder):
    """What every fixture script does first: reads --out (by default `folder` next to
    this script) and makes PyTorch deterministic, on one thread. Returns the folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      folder))
    out = parser.parse_args().out
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    return out


def main():
    out = start_fixture(__doc__.splitlines()[0], "gpt_tiny")
    cfg = CONFIG
    weights32 = init_weights(cfg, SEED)
    text, inputs, targets = make_batch(cfg, BATCH, TEXT)

    loss, grads, loss_torch, worst = checked_loss_and_grads(
        weights32, lambda p: forward_loss(p, cfg, inputs, targets),
        lambda p: forward_loss_torch(p, cfg, inputs, targets), SEED + 1)

    os.makedirs(out, exist_ok=True)
    names = [n for n, _, _ in param_specs(cfg)]
    n_pipeline_layers = cfg["n_layers"] + 2
    base_meta = {"format": "pt", "pipetrain_format": "1",
                 "pipetrain_layers": f"0:{n_pipeline_layers}",
                 **{k: str(v) for k, v in cfg.items()},
                 "generator": "tests/testdata/make_gpt_fixture.py",
                 "torch_version": torch.__version__}
    grads32 = {n: g.to(torch.float32) for n, g in grads.items()}
    write_safetensors(os.path.join(out, "weights.safetensors"),
                      [(n, weights32[n]) for n in names], {**base_meta, "content": "weights"})
    write_safetensors(os.path.join(out, "grads.safetensors"),
                      [(n, grads32[n]) for n in names],
                      {**base_meta, "content": "gradients of the loss in expected.json"})
    expected = {
        "config": cfg,
        "batch": BATCH,
        "seed": SEED,
        "text": text,
        "inputs": inputs.tolist(),
        "targets": targets.tolist(),
        "loss": loss.item(),
        "reference_dtype": "float64",
        "torch_version": torch.__version__,
        "tensors": {n: {"shape": list(weights32[n].shape),
                        "weight": summary(weights32[n]),
                        "grad": summary(grads32[n])} for n in names},
    }
    text_json = json.dumps(expected, indent=1)
    # One line per array of numbers (shapes, token rows), for a readable diff.
    text_json = re.sub(r"\[\s+([-+.\deE,\s]+?)\s+\]",
                       lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]",
                       text_json)
    assert json.loads(text_json) == expected
    with open(os.path.join(out, "expected.json"), "w") as f:
        f.write(text_json + "\n")
    print(f"loss {loss.item():.17g} (torch.nn.functional path agrees to "
          f"{abs(loss_torch - loss.item()):.1e}); finite differences: worst rel. error "
          f"{worst:.1e}; {len(names)} tensors, "
          f"{sum(w.numel() for w in weights32.values())} parameters -> {out}")


if __name__ == "__main__":
    main()
