// GPT-2, a model family (model_family.h): learned token and position embeddings,
// blocks of pre-LayerNorm causal self-attention (one fused q|k|v projection, biases) and
// a 4 x d_model GELU MLP, a final LayerNorm and the lm_head. Parameters carry Hugging
// Face GPT-2's names and layouts: linear weights [in, out] (Conv1D, y = x W + b),
// lm_head.weight [vocab, d_model] (y = x W^T), wte [vocab, d_model], wpe [seq_len,
// d_model], LayerNorm weight and bias [d_model].
#pragma once

#include "common/model/model_family.h"

namespace pipetrain::model {

// The math every backend computes for GPT-2, as figures that files describing the model
// (Hugging Face's config.json) are checked against: LayerNorm's epsilon (the compute
// library's reference::kLayerNormEps; a test holds them equal). GELU is the tanh form and
// attention scores are scaled by 1 / sqrt(head_dim).
inline constexpr double kLayerNormEpsilon = 1e-5;

inline constexpr char kTokenEmbeddingName[] = "transformer.wte.weight";
inline constexpr char kPositionEmbeddingName[] = "transformer.wpe.weight";
inline constexpr char kOutputHeadName[] = "lm_head.weight";

// Each layer kind's parameters, as indices into its LayerParams (the compute library
// addresses them so; LayerParams is built from these, so the two cannot disagree).
struct Gpt2Embedding {
  enum Param : int { kWte, kWpe, kNumParams };
};
struct Gpt2Block {
  enum Param : int {
    kLn1Weight,
    kLn1Bias,
    kAttnWeight,  // c_attn: (C, 3C), q|k|v
    kAttnBias,
    kAttnProjWeight,  // attn.c_proj: (C, C)
    kAttnProjBias,
    kLn2Weight,
    kLn2Bias,
    kFcWeight,  // mlp.c_fc: (C, 4C)
    kFcBias,
    kMlpProjWeight,  // mlp.c_proj: (4C, C)
    kMlpProjBias,
    kNumParams
  };
};
struct Gpt2Head {
  enum Param : int { kLnFWeight, kLnFBias, kLmHead, kNumParams };
};

const ModelFamily& Gpt2Family();

}  // namespace pipetrain::model
