#!/usr/bin/env python3
"""Writes gpt_reference_tiny.txt: an independent float64 GPT-2 forward in pure Python
(no numpy or torch on the machine that made it) for a tiny config, with its weights,
batch, mean loss and central finite-difference gradients of a few elements of every
parameter. gpt_reference_test.cc loads it and holds the C++ model to it.

The model is pipetrain's GPT: pre-LN blocks, fused qkv (q|k|v, heads contiguous),
causal softmax attention scaled by 1/sqrt(head_dim), GELU (tanh form), LayerNorm with
biased variance and eps 1e-5, untied lm_head [vocab, d_model] without bias, mean
cross-entropy. Linear weights are [in, out] (y = x W + b).

Usage: python3 tests/testdata/make_gpt_reference.py > tests/testdata/gpt_reference_tiny.txt
"""
import math

V, T, C, NH, L, B = 13, 4, 8, 2, 2, 2
HS = C // NH

_state = [20261129]


def uniform():  # deterministic LCG in [-0.5, 0.5)
    _state[0] = (_state[0] * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    return (_state[0] >> 11) / float(1 << 53) - 0.5


def params():
    """(name, shape, values) in the pipeline-layer order of transformer_config.cc."""
    out = []

    def add(name, shape, scale, offset=0.0):
        n = 1
        for d in shape:
            n *= d
        out.append((name, shape, [offset + scale * uniform() for _ in range(n)]))

    add("transformer.wte.weight", (V, C), 0.5)
    add("transformer.wpe.weight", (T, C), 0.5)
    for i in range(L):
        p = "transformer.h.%d." % i
        add(p + "ln_1.weight", (C,), 0.2, 1.0)
        add(p + "ln_1.bias", (C,), 0.2)
        add(p + "attn.c_attn.weight", (C, 3 * C), 0.6)
        add(p + "attn.c_attn.bias", (3 * C,), 0.2)
        add(p + "attn.c_proj.weight", (C, C), 0.6)
        add(p + "attn.c_proj.bias", (C,), 0.2)
        add(p + "ln_2.weight", (C,), 0.2, 1.0)
        add(p + "ln_2.bias", (C,), 0.2)
        add(p + "mlp.c_fc.weight", (C, 4 * C), 0.6)
        add(p + "mlp.c_fc.bias", (4 * C,), 0.2)
        add(p + "mlp.c_proj.weight", (4 * C, C), 0.3)
        add(p + "mlp.c_proj.bias", (C,), 0.2)
    add("transformer.ln_f.weight", (C,), 0.2, 1.0)
    add("transformer.ln_f.bias", (C,), 0.2)
    add("lm_head.weight", (V, C), 0.6)
    return out


def layernorm(x, w, b):
    mu = sum(x) / len(x)
    var = sum((v - mu) ** 2 for v in x) / len(x)
    rs = 1.0 / math.sqrt(var + 1e-5)
    return [(v - mu) * rs * w[i] + b[i] for i, v in enumerate(x)]


def linear(x, w, b, n_in, n_out):  # x [n_in], w [n_in][n_out] flattened
    return [sum(x[i] * w[i * n_out + j] for i in range(n_in)) + (b[j] if b else 0.0)
            for j in range(n_out)]


def gelu(v):
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def loss(P, tokens, targets):
    total = 0.0
    for b in range(B):
        x = [[P["transformer.wte.weight"][tokens[b * T + t] * C + c] +
              P["transformer.wpe.weight"][t * C + c] for c in range(C)] for t in range(T)]
        for i in range(L):
            p = "transformer.h.%d." % i
            h = [layernorm(x[t], P[p + "ln_1.weight"], P[p + "ln_1.bias"]) for t in range(T)]
            qkv = [linear(h[t], P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"], C,
                          3 * C) for t in range(T)]
            y = [[0.0] * C for _ in range(T)]
            for hd in range(NH):
                o = hd * HS
                for t in range(T):
                    s = [sum(qkv[t][o + j] * qkv[u][C + o + j] for j in range(HS)) /
                         math.sqrt(HS) for u in range(t + 1)]
                    m = max(s)
                    e = [math.exp(v - m) for v in s]
                    z = sum(e)
                    for j in range(HS):
                        y[t][o + j] = sum(e[u] / z * qkv[u][2 * C + o + j]
                                          for u in range(t + 1))
            for t in range(T):
                a = linear(y[t], P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"], C, C)
                x[t] = [x[t][c] + a[c] for c in range(C)]
            for t in range(T):
                h2 = layernorm(x[t], P[p + "ln_2.weight"], P[p + "ln_2.bias"])
                f = [gelu(v) for v in linear(h2, P[p + "mlp.c_fc.weight"],
                                             P[p + "mlp.c_fc.bias"], C, 4 * C)]
                m = linear(f, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"], 4 * C, C)
                x[t] = [x[t][c] + m[c] for c in range(C)]
        for t in range(T):
            h = layernorm(x[t], P["transformer.ln_f.weight"], P["transformer.ln_f.bias"])
            logits = linear(h, [P["lm_head.weight"][v * C + c] for c in range(C)
                                for v in range(V)], None, C, V)
            m = max(logits)
            lse = m + math.log(sum(math.exp(l - m) for l in logits))
            total += lse - logits[targets[b * T + t]]
    return total / (B * T)


def main():
    spec = params()
    P = {name: vals for name, _, vals in spec}
    tokens = [int((uniform() + 0.5) * V) % V for _ in range(B * T)]
    targets = [int((uniform() + 0.5) * V) % V for _ in range(B * T)]
    print("# made by tests/testdata/make_gpt_reference.py (pure Python, float64)")
    print("config", V, T, C, NH, L)
    print("rows", B)
    print("tokens", *tokens)
    print("targets", *targets)
    for name, _, vals in spec:
        print("param", name, len(vals), *("%.17g" % v for v in vals))
    print("loss %.17g" % loss(P, tokens, targets))
    eps = 1e-6
    for name, _, vals in spec:
        for k in sorted({0, len(vals) // 2, len(vals) - 1}):
            saved = vals[k]
            vals[k] = saved + eps
            plus = loss(P, tokens, targets)
            vals[k] = saved - eps
            minus = loss(P, tokens, targets)
            vals[k] = saved
            print("grad %s %d %.17g" % (name, k, (plus - minus) / (2 * eps)))


if __name__ == "__main__":
    main()
