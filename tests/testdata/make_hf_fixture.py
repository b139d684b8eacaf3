#!/usr/bin/python3
"""Makes the Hugging Face GPT-2 fixture folders in tests/testdata/hf_gpt2/ with PyTorch.

Two tiny GPT-2 models with random weights (seeded; LayerNorm weights and biases random
too, not 1 and 0), saved the way real Hugging Face folders look, and what an independent
float64 GPT-2 forward, written here from the GPT-2 equations (not from transformers),
computes on a fixed token sequence:

  tied/     config.json like the original gpt2 upload (n_ctx and n_positions, no
            tie_word_embeddings: the default, true), model.safetensors in F32 with names
            without the "transformer." prefix, the attention buffers h.N.attn.bias (the
            causal mask) and h.N.attn.masked_bias present, no lm_head.weight.
  untied/   config.json as save_pretrained writes it (tie_word_embeddings false, no n_ctx),
            two shards named by model.safetensors.index.json, names with the prefix,
            lm_head.weight present and different from wte; the first shard F16, the second
            BF16.
  expected.json  per folder: its config, the text (byte-level tokens), the rows used, the
            float64 mean loss, per tensor its shape and exact sum (to check the values
            read, F16/BF16 conversion included), and the logits of row 0 at a few positions.

GPT-2 as computed: x = wte[tokens] + wpe[positions]; per block x += attn(ln_1(x)),
x += mlp(ln_2(x)); logits = ln_f(x) wte^T (or lm_head^T when untied). LayerNorm with
biased variance and eps 1e-5; Conv1D y = x W + b with W stored (in, out); attention with
q|k|v along c_attn's output (heads contiguous), scores scaled by 1/sqrt(head_dim), causal;
MLP c_proj(gelu_new(c_fc(x))), gelu_new = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
The weights are rounded to their stored dtype first and the reference is computed in
float64 from the rounded values, so a reader that widens them exactly computes the same
function.

Run with Debian's PyTorch (apt-get install python3-torch, or
deploy/install-deps.sh --with-torch):  /usr/bin/python3 tests/testdata/make_hf_fixture.py
No other package is needed: the safetensors files are written with struct and json.
"""

import argparse
import json
import math
import os
import re
import struct

import torch
import torch.nn.functional as F

LN_EPS = 1e-5
# Byte-level tokens, all below the vocabulary of 128 (ASCII).
TEXT = ("It was the best of times, it was the worst of times, it was the age of "
        "wisdom, it was the age of foolishness.")
ROWS = 2                   # rows of n_positions + 1 bytes, from the start of TEXT
LOGIT_POSITIONS = [0, 5]   # and the last one: the logits of row 0 kept in expected.json

VARIANTS = {
    "tied": {"vocab_size": 128, "n_positions": 16, "n_embd": 16, "n_head": 2, "n_layer": 2,
             "tied": True, "seed": 20261201},
    "untied": {"vocab_size": 128, "n_positions": 16, "n_embd": 8, "n_head": 2, "n_layer": 1,
               "tied": False, "seed": 20261202},
}


def param_specs(cfg):
    """(name, shape, kind) of every weight in GPT2LMHeadModel's order, transformer.* names."""
    V, T, C = cfg["vocab_size"], cfg["n_positions"], cfg["n_embd"]
    specs = [("transformer.wte.weight", (V, C), "embedding"),
             ("transformer.wpe.weight", (T, C), "embedding")]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        specs += [(p + "ln_1.weight", (C,), "ln_weight"), (p + "ln_1.bias", (C,), "bias"),
                  (p + "attn.c_attn.weight", (C, 3 * C), "conv1d"),
                  (p + "attn.c_attn.bias", (3 * C,), "bias"),
                  (p + "attn.c_proj.weight", (C, C), "conv1d"),
                  (p + "attn.c_proj.bias", (C,), "bias"),
                  (p + "ln_2.weight", (C,), "ln_weight"), (p + "ln_2.bias", (C,), "bias"),
                  (p + "mlp.c_fc.weight", (C, 4 * C), "conv1d"),
                  (p + "mlp.c_fc.bias", (4 * C,), "bias"),
                  (p + "mlp.c_proj.weight", (4 * C, C), "conv1d"),
                  (p + "mlp.c_proj.bias", (C,), "bias")]
    specs += [("transformer.ln_f.weight", (C,), "ln_weight"),
              ("transformer.ln_f.bias", (C,), "bias")]
    if not cfg["tied"]:
        specs.append(("lm_head.weight", (V, C), "embedding"))
    return specs


def random_weights(cfg, dtype_of):
    """Random weights scaled so activations stay O(1), rounded to each one's stored dtype
    and returned in float64 (the exact stored values)."""
    gen = torch.Generator().manual_seed(cfg["seed"])
    weights = {}
    for name, shape, kind in param_specs(cfg):
        r = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "conv1d":
            w = r / math.sqrt(shape[0])
        elif kind == "embedding":
            w = 0.5 * r
        elif kind == "ln_weight":
            w = 1.0 + 0.2 * r
        else:
            w = 0.1 * r
        weights[name] = w.to(dtype_of(name)).to(torch.float64)
    return weights


# --- GPT-2, from its equations (float64) ----------------------------------------------

def layer_norm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, w_attn, b_attn, w_proj, b_proj, n_head):
    B, T, C = x.shape
    hd = C // n_head
    qkv = x @ w_attn + b_attn
    q, k, v = (t.reshape(B, T, n_head, hd).permute(0, 2, 1, 3)
               for t in (qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    probs = probs / probs.sum(dim=-1, keepdim=True)
    y = (probs @ v).permute(0, 2, 1, 3).reshape(B, T, C)
    return y @ w_proj + b_proj


def logits_of(p, cfg, inputs):
    T = inputs.shape[1]
    x = p["transformer.wte.weight"][inputs] + p["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        h = f"transformer.h.{i}."
        x = x + attention(layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]),
                          p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"],
                          p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"], cfg["n_head"])
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        m = gelu_new(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    head = p["transformer.wte.weight"] if cfg["tied"] else p["lm_head.weight"]
    return x @ head.T


def mean_loss(logits, targets):
    top = logits.amax(dim=-1, keepdim=True)
    log_z = top + (logits - top).exp().sum(dim=-1, keepdim=True).log()
    return -(logits - log_z).gather(-1, targets.unsqueeze(-1)).mean()


def loss_from_functional(p, cfg, inputs, targets):
    """The same model from torch.nn.functional's layers: the script checks itself."""
    B, T = inputs.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    x = F.embedding(inputs, p["transformer.wte.weight"]) + p["transformer.wpe.weight"][:T]
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    for i in range(cfg["n_layer"]):
        h = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], LN_EPS)
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
    head = p["transformer.wte.weight"] if cfg["tied"] else p["lm_head.weight"]
    logits = F.linear(x, head)
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


# --- files ----------------------------------------------------------------------------

SAFETENSORS_DTYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
RAW_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def write_safetensors(path, tensors, metadata):
    """safetensors without the package: 8-byte little-endian header length, the JSON
    header padded with spaces to 8-byte alignment, then the raw little-endian data."""
    header = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name, t in tensors:
        raw = t.contiguous().reshape(-1).view(RAW_VIEW[t.dtype]).numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * ((8 - (8 + len(js)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for c in chunks:
            f.write(c)
    return offset


def write_json(path, value):
    with open(path, "w") as f:
        f.write(json.dumps(value, indent=2) + "\n")


def hf_config(cfg, with_n_ctx, tie_field):
    """config.json as Hugging Face writes it for GPT-2 (the fields a reader meets)."""
    c = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
         "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
         "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
         "n_embd": cfg["n_embd"], "n_head": cfg["n_head"], "n_inner": None,
         "n_layer": cfg["n_layer"], "n_positions": cfg["n_positions"], "resid_pdrop": 0.1,
         "summary_activation": None, "summary_first_dropout": 0.1,
         "summary_proj_to_labels": True, "summary_type": "cls_index",
         "summary_use_proj": True, "vocab_size": cfg["vocab_size"]}
    if with_n_ctx:
        c["n_ctx"] = cfg["n_positions"]
    if tie_field is not None:
        c["tie_word_embeddings"] = tie_field
    return dict(sorted(c.items()))


def save_tied(out, cfg, w):
    """Like the original gpt2 upload: no prefix, the attention buffers, no lm_head."""
    T = cfg["n_positions"]
    tensors = []
    for name, _, _ in param_specs(cfg):
        tensors.append((name[len("transformer."):], w[name].to(torch.float32)))
        if name.endswith(".attn.c_proj.bias"):
            block = name[len("transformer."):-len("c_proj.bias")]
            tensors.append((block + "bias", torch.ones(T, T).tril().view(1, 1, T, T)))
            tensors.append((block + "masked_bias", torch.tensor(-1e4)))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
    write_json(os.path.join(out, "config.json"), hf_config(cfg, True, None))


def save_untied(out, cfg, w, dtype_of):
    """Like save_pretrained with max_shard_size: prefixed names, an index, two shards."""
    names = [n for n, _, _ in param_specs(cfg)]
    shards = {"model-00001-of-00002.safetensors": [n for n in names if dtype_of(n) == torch.float16],
              "model-00002-of-00002.safetensors": [n for n in names if dtype_of(n) == torch.bfloat16]}
    weight_map, total = {}, 0
    for file, members in shards.items():
        total += write_safetensors(os.path.join(out, file),
                                   [(n, w[n].to(dtype_of(n))) for n in members], {"format": "pt"})
        weight_map.update({n: file for n in members})
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(os.path.join(out, "config.json"), hf_config(cfg, False, False))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "hf_gpt2"))
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    expected = {"generator": "tests/testdata/make_hf_fixture.py", "reference_dtype": "float64",
                "torch_version": torch.__version__, "folders": {}}
    for variant, cfg in VARIANTS.items():
        if cfg["tied"]:
            dtype_of = lambda name: torch.float32
        else:  # the head's shard in BF16, everything else in F16
            dtype_of = lambda name: (torch.bfloat16 if name.startswith(("transformer.ln_f", "lm_head"))
                                     else torch.float16)
        w = random_weights(cfg, dtype_of)
        T = cfg["n_positions"]
        data = TEXT.encode("ascii")[:ROWS * (T + 1)]
        assert max(data) < cfg["vocab_size"]
        rows = torch.tensor(list(data), dtype=torch.long).view(ROWS, T + 1)
        inputs, targets = rows[:, :T], rows[:, 1:]
        logits = logits_of(w, cfg, inputs)
        loss = mean_loss(logits, targets).item()
        check = loss_from_functional(w, cfg, inputs, targets).item()
        assert abs(check - loss) <= 1e-12 * abs(loss), (variant, check, loss)

        out = os.path.join(args.out, variant)
        os.makedirs(out, exist_ok=True)
        if cfg["tied"]:
            save_tied(out, cfg, w)
        else:
            save_untied(out, cfg, w, dtype_of)
        positions = LOGIT_POSITIONS + [T - 1]
        expected["folders"][variant] = {
            "config": {k: v for k, v in cfg.items() if k != "seed"},
            "seed": cfg["seed"],
            "text": data.decode("ascii"),
            "rows": ROWS,
            "loss": loss,
            "tensors": {n: {"shape": list(w[n].shape), "sum": math.fsum(w[n].reshape(-1).tolist())}
                        for n, _, _ in param_specs(cfg)},
            "logits_row0": {str(t): [float(f"{v:.9g}") for v in logits[0, t].tolist()]
                            for t in positions},
        }
        print(f"{variant}: loss {loss:.17g} (torch.nn.functional agrees to "
              f"{abs(check - loss):.1e}), {sum(v.numel() for v in w.values())} parameters -> {out}")
    text = json.dumps(expected, indent=1)
    # One line per array of numbers, for a readable diff.
    text = re.sub(r"\[\s+([-+.\deE,\s]+?)\s+\]",
                  lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)
    assert json.loads(text) == expected
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
