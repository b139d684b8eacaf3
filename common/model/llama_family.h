// Llama (Llama 2 and 3, and the small models built like them: TinyLlama, SmolLM, Llama
// 3.2 1B/3B), a model family (model_family.h): a token embedding and no position
// embedding, blocks of pre-RMSNorm causal self-attention with rotary position embeddings
// and grouped-query attention (n_kv_heads key/value heads shared by the query heads; no
// biases) and a SwiGLU MLP (down(silu(gate x) * up x)), a final RMSNorm and the lm_head.
// Parameters carry Hugging Face LlamaForCausalLM's names and layouts: every linear weight
// [out, in] (nn.Linear, y = x W^T), embed_tokens and lm_head [vocab, d_model], norm
// weights [d_model]. Rotary embeddings rotate the two halves of each head as Hugging
// Face's rotate_half does, so its q_proj and k_proj load without a permutation (Meta's
// original checkpoints interleave the pairs and need one).
#pragma once

#include "common/model/model_family.h"

namespace pipetrain::model {

inline constexpr char kLlamaFamily[] = "llama";
inline constexpr int kLlamaDefaultRopeTheta = 500000;  // Llama 3's
inline constexpr double kLlamaDefaultNormEps = 1e-5;
inline constexpr int kLlamaFfnMultiple = 256;

inline constexpr char kLlamaTokenEmbeddingName[] = "model.embed_tokens.weight";
inline constexpr char kLlamaOutputHeadName[] = "lm_head.weight";

// Each layer kind's parameters, as indices into its LayerParams. q, k and v are adjacent,
// and so are gate and up, so each group is one (rows, d_model) matrix in memory that one
// product multiplies: q|k|v and gate|up come out side by side.
struct LlamaEmbedding {
  enum Param : int { kEmbedTokens, kNumParams };
};
struct LlamaBlock {
  enum Param : int {
    kInputNorm,  // input_layernorm (C)
    kQProj,      // (NH hs, C)
    kKProj,      // (NKV hs, C)
    kVProj,      // (NKV hs, C)
    kOProj,      // (C, NH hs)
    kPostNorm,   // post_attention_layernorm (C)
    kGateProj,   // (F, C)
    kUpProj,     // (F, C)
    kDownProj,   // (C, F)
    kNumParams
  };
};
struct LlamaHead {
  enum Param : int { kNorm, kLmHead, kNumParams };
};

// Llama's rule for the SwiGLU width when ffn_dim is not given: 8 d_model / 3, rounded up
// to a multiple of 256.
int LlamaDefaultFfnDim(int d_model);

const ModelFamily& LlamaFamily();

}  // namespace pipetrain::model
