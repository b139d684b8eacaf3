#!/usr/bin/python3
"""Makes the Hugging Face Llama fixture folders in tests/testdata/hf_llama/ with PyTorch.

Two tiny Llamas with random weights (seeded; RMSNorm weights random too), saved the way
real Hugging Face folders look, and what the float64 Llama of make_llama_fixture.py
(written from the architecture's definition, not from transformers) computes on a fixed
byte sequence: the mean loss and every gradient.

  untied/  config.json as LlamaConfig.save_pretrained writes it for a Llama 3.2 model
           (num_key_value_heads < num_attention_heads, rope_scaling of rope_type llama3,
           head_dim, torch_dtype bfloat16, tie_word_embeddings false) with
           max_position_embeddings 64, four times the 16 positions the loss is computed on;
           BF16 weights in two shards named by model.safetensors.index.json, lm_head.weight
           present, and the rotary buffer model.layers.0.self_attn.rotary_emb.inv_freq
           (F32) that older files carry.
  tied/    config.json as older Llama uploads have it (no head_dim, no num_key_value_heads:
           every head has its own keys and values; rope_scaling null; rope_theta 500000;
           tie_word_embeddings true), max_position_embeddings 16, one model.safetensors in
           F32 without lm_head.weight.
  expected.json   per folder: the config as pipetrain reads it, the text (byte tokens),
           the rows, the float64 loss and per tensor its shape and exact sum.
  grads_<folder>.safetensors   the float64 gradients of that loss (stored F32) under the
           parameter names (Hugging Face's; a tied embedding's is the sum of both uses).

The weights are rounded to their stored dtype first and the reference is computed in
float64 from the rounded values, so a reader that widens them exactly computes the same
function. Run with Debian's PyTorch: /usr/bin/python3 tests/testdata/make_hf_llama_fixture.py
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt_fixture import start_fixture  # noqa: E402
from make_hf_fixture import write_json, write_safetensors  # noqa: E402
from make_llama_fixture import forward_loss, init_weights, param_specs  # noqa: E402

TEXT = ("It was the best of times, it was the worst of times, it was the age of "
        "wisdom, it was the age of foolishness.")
ROWS = 3
SEQ = 16  # the positions the loss is computed on
BASE = {"vocab_size": 256, "seq_len": SEQ, "d_model": 32, "n_heads": 4, "n_layers": 2}
VARIANTS = {
    "untied": {"max_positions": 64, "tied": False, "seed": 20261204, "dtype": torch.bfloat16,
               "llama": {"architecture": "llama", "n_kv_heads": 2, "ffn_dim": 48,
                         "rope_theta": 10000.0, "norm_eps": 1e-5,
                         "rope_scaling": {"rope_type": "llama3", "factor": 4.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 128}}},
    "tied": {"max_positions": 16, "tied": True, "seed": 20261205, "dtype": torch.float32,
             "llama": {"architecture": "llama", "n_kv_heads": 4, "ffn_dim": 40,
                       "rope_theta": 500000.0, "norm_eps": 1e-6, "rope_scaling": None}},
}


def hf_config(v):
    """config.json as transformers writes it (the fields a reader meets)."""
    llama = v["llama"]
    c = {"architectures": ["LlamaForCausalLM"], "attention_bias": False,
         "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
         "hidden_size": BASE["d_model"], "initializer_range": 0.02,
         "intermediate_size": llama["ffn_dim"], "max_position_embeddings": v["max_positions"],
         "model_type": "llama", "num_attention_heads": BASE["n_heads"],
         "num_hidden_layers": BASE["n_layers"], "pretraining_tp": 1,
         "rms_norm_eps": llama["norm_eps"], "rope_scaling": llama["rope_scaling"],
         "rope_theta": llama["rope_theta"], "tie_word_embeddings": v["tied"],
         "torch_dtype": "bfloat16" if v["dtype"] == torch.bfloat16 else "float32",
         "transformers_version": "4.46.0", "use_cache": True, "vocab_size": BASE["vocab_size"]}
    if v["tied"]:  # an older upload: neither head_dim nor num_key_value_heads
        assert llama["n_kv_heads"] == BASE["n_heads"]
    else:
        c.update({"head_dim": BASE["d_model"] // BASE["n_heads"], "mlp_bias": False,
                  "num_key_value_heads": llama["n_kv_heads"]})
    return dict(sorted(c.items()))


def save(out, v, weights, names):
    stored = [(n, weights[n].to(v["dtype"])) for n in names]
    if v["tied"]:
        write_safetensors(os.path.join(out, "model.safetensors"), stored, {"format": "pt"})
    else:  # like save_pretrained with max_shard_size: an index and two shards
        half = len(stored) // 2
        inv_freq = ("model.layers.0.self_attn.rotary_emb.inv_freq",
                    torch.arange(4, dtype=torch.float32))
        shards = {"model-00001-of-00002.safetensors": stored[:half] + [inv_freq],
                  "model-00002-of-00002.safetensors": stored[half:]}
        weight_map, total = {}, 0
        for file, members in shards.items():
            total += write_safetensors(os.path.join(out, file), members, {"format": "pt"})
            weight_map.update({n: file for n, _ in members})
        write_json(os.path.join(out, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total},
                    "weight_map": dict(sorted(weight_map.items()))})
    write_json(os.path.join(out, "config.json"), hf_config(v))


def main():
    out_dir = start_fixture(__doc__.splitlines()[0], "hf_llama")
    expected = {"generator": "tests/testdata/make_hf_llama_fixture.py",
                "reference_dtype": "float64", "torch_version": torch.__version__, "folders": {}}
    data = TEXT.encode("ascii")[:ROWS * (SEQ + 1)]
    rows = torch.tensor(list(data), dtype=torch.long).view(ROWS, SEQ + 1)
    inputs, targets = rows[:, :SEQ], rows[:, 1:]
    for variant, v in VARIANTS.items():
        llama = v["llama"]
        names = [n for n, _, _ in param_specs(BASE, llama) if not (v["tied"] and n == "lm_head.weight")]
        w32 = init_weights(BASE, llama, v["seed"])
        # The reference computes with the values as stored.
        rounded = {n: w32[n].to(v["dtype"]).to(torch.float32) for n in names}
        params = {n: rounded[n].to(torch.float64).requires_grad_(True) for n in names}
        if v["tied"]:
            params["lm_head.weight"] = params["model.embed_tokens.weight"]
        loss = forward_loss(params, BASE, llama, inputs, targets)
        loss.backward()
        check = forward_loss(params, BASE, llama, inputs, targets, torch_path=True).item()
        assert abs(check - loss.item()) <= 1e-12 * abs(loss.item()), (variant, check, loss)

        out = os.path.join(out_dir, variant)
        os.makedirs(out, exist_ok=True)
        save(out, v, rounded, names)
        write_safetensors(os.path.join(out_dir, f"grads_{variant}.safetensors"),
                          [(n, params[n].grad.to(torch.float32)) for n in names],
                          {"format": "pt", "content": f"gradients of {variant}'s loss in expected.json"})
        expected["folders"][variant] = {
            "config": {**BASE, **{k: x for k, x in llama.items() if x is not None},
                       "tie_embeddings": v["tied"]},
            "max_position_embeddings": v["max_positions"],
            "seed": v["seed"], "text": data.decode("ascii"), "rows": ROWS,
            "loss": loss.item(),
            "tensors": {n: {"shape": list(rounded[n].shape),
                            "sum": math.fsum(rounded[n].reshape(-1).tolist())} for n in names},
        }
        print(f"{variant}: loss {loss.item():.17g} (torch.nn.functional agrees to "
              f"{abs(check - loss.item()):.1e}), {len(names)} tensors -> {out}")
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        f.write(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
