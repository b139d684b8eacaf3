#include "common/model/gpt_config.h"

#include <limits>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace pipetrain::model {
namespace {

// Past this many blocks, n_layers + 2 pipeline layers and the per-layer loops of every
// module would run close to int's range; no GPT has more than a few hundred.
constexpr int kMaxLayers = 1 << 20;

// The whole model's parameter count and its training state (f32 weight, gradient and
// AdamW's m and v: 16 bytes a parameter) in checked 64-bit arithmetic, so a shape whose
// count or bytes do not fit is refused here, naming the field, instead of wrapping in a
// planner estimate or an allocation size later.
absl::Status CheckModelSize(const GptConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, T = c.seq_len, L = c.n_layers;
  ASSIGN_OR_RETURN(int64_t wte, common::CheckedMul(V, C, "model.vocab_size x model.d_model"));
  ASSIGN_OR_RETURN(int64_t wpe, common::CheckedMul(T, C, "model.seq_len x model.d_model"));
  // A block: 12 C^2 + 13 C parameters (attention 4 C^2 + 4 C, MLP 8 C^2 + 5 C, two
  // LayerNorms 4 C).
  ASSIGN_OR_RETURN(int64_t c2, common::CheckedMul(C, C, "model.d_model x model.d_model"));
  ASSIGN_OR_RETURN(int64_t c2x12, common::CheckedMul(c2, 12, "model.d_model (12 d_model^2)"));
  ASSIGN_OR_RETURN(int64_t block, common::CheckedAdd(c2x12, 13 * C, "model.d_model"));
  ASSIGN_OR_RETURN(int64_t blocks,
                   common::CheckedMul(block, L, "model.n_layers x block parameters"));
  ASSIGN_OR_RETURN(int64_t total, common::CheckedAdd(blocks, wte, "model.vocab_size"));
  ASSIGN_OR_RETURN(total, common::CheckedAdd(total, wpe, "model.seq_len"));
  // The head: ln_f (2 C) and lm_head (V x C, a copy when tied).
  ASSIGN_OR_RETURN(total, common::CheckedAdd(total, wte, "model.vocab_size"));
  ASSIGN_OR_RETURN(total, common::CheckedAdd(total, 2 * C, "model.d_model"));
  return common::CheckedMul(total, 16, "model: training state bytes (16 per parameter)")
      .status();
}

}  // namespace

absl::Status ValidateConfig(const GptConfig& c) {
  auto positive = [](int v, const char* field) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model.", field, " must be > 0 (got ", v, ")"));
  };
  for (auto [v, f] : {std::pair{c.vocab_size, "vocab_size"},
                      {c.seq_len, "seq_len"},
                      {c.d_model, "d_model"},
                      {c.n_heads, "n_heads"},
                      {c.n_layers, "n_layers"}}) {
    if (absl::Status s = positive(v, f); !s.ok()) return s;
  }
  if (c.d_model % c.n_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.n_heads (", c.n_heads, ") must divide model.d_model (", c.d_model, ")"));
  }
  if (c.n_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_layers must be <= ", kMaxLayers, " (got ", c.n_layers, ")"));
  }
  // mlp_dim() is 4 x d_model in int, and the attention scores per token H x T.
  if (c.d_model > std::numeric_limits<int>::max() / 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_model must be <= ", std::numeric_limits<int>::max() / 4, " (got ", c.d_model,
        "): the MLP's 4 x d_model would overflow"));
  }
  return CheckModelSize(c);
}

absl::StatusOr<GptConfig> ConfigFromProto(const pipetrain::v1::ModelConfig& p) {
  GptConfig c{p.vocab_size(), p.seq_len(), p.d_model(), p.n_heads(), p.n_layers(),
              p.tie_embeddings()};
  if (absl::Status s = ValidateConfig(c); !s.ok()) return s;
  return c;
}

pipetrain::v1::ModelConfig ConfigToProto(const GptConfig& c) {
  pipetrain::v1::ModelConfig p;
  p.set_vocab_size(c.vocab_size);
  p.set_seq_len(c.seq_len);
  p.set_d_model(c.d_model);
  p.set_n_heads(c.n_heads);
  p.set_n_layers(c.n_layers);
  p.set_tie_embeddings(c.tie_embeddings);
  return p;
}

LayerKind KindOfLayer(const GptConfig& c, int layer) {
  if (layer == 0) return LayerKind::kEmbedding;
  if (layer == c.n_layers + 1) return LayerKind::kHead;
  return LayerKind::kBlock;
}

std::string LayerName(const GptConfig& c, int layer) {
  switch (KindOfLayer(c, layer)) {
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kHead:
      return "head";
    case LayerKind::kBlock:
      return absl::StrCat("block ", layer - 1);
  }
  return "?";
}

int64_t ParamSpec::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamSpec> LayerParams(const GptConfig& c, int layer) {
  const int64_t C = c.d_model, V = c.vocab_size, T = c.seq_len, F = c.mlp_dim();
  switch (KindOfLayer(c, layer)) {
    case LayerKind::kEmbedding:
      return {{kTokenEmbeddingName, {V, C}, true}, {kPositionEmbeddingName, {T, C}, true}};
    case LayerKind::kHead:
      return {{"transformer.ln_f.weight", {C}, false},
              {"transformer.ln_f.bias", {C}, false},
              {kOutputHeadName, {V, C}, true, c.tie_embeddings ? kTokenEmbeddingName : ""}};
    case LayerKind::kBlock: {
      const std::string p = absl::StrCat("transformer.h.", layer - 1, ".");
      return {{p + "ln_1.weight", {C}, false},
              {p + "ln_1.bias", {C}, false},
              {p + "attn.c_attn.weight", {C, 3 * C}, true},
              {p + "attn.c_attn.bias", {3 * C}, false},
              {p + "attn.c_proj.weight", {C, C}, true},
              {p + "attn.c_proj.bias", {C}, false},
              {p + "ln_2.weight", {C}, false},
              {p + "ln_2.bias", {C}, false},
              {p + "mlp.c_fc.weight", {C, F}, true},
              {p + "mlp.c_fc.bias", {F}, false},
              {p + "mlp.c_proj.weight", {F, C}, true},
              {p + "mlp.c_proj.bias", {C}, false}};
    }
  }
  return {};
}

std::vector<ParamSpec> RangeParams(const GptConfig& c, int begin, int end) {
  std::vector<ParamSpec> out;
  for (int l = begin; l < end; ++l) {
    for (ParamSpec& p : LayerParams(c, l)) out.push_back(std::move(p));
  }
  return out;
}

std::vector<ParamSpec> CheckpointParams(const GptConfig& c, int begin, int end) {
  std::vector<ParamSpec> all = RangeParams(c, begin, end);
  // The names first: the loop below moves the specs out of `all`.
  std::set<std::string> names;
  for (const ParamSpec& p : all) names.insert(p.name);
  std::vector<ParamSpec> out;
  for (ParamSpec& p : all) {
    if (p.tied_to.empty() || !names.count(p.tied_to)) out.push_back(std::move(p));
  }
  return out;
}

int64_t ParamsOfLayer(const GptConfig& c, int layer) {
  // LayerParams' tensors counted without building them (no names): a check of a model
  // of a million layers costs arithmetic, not a million lists of strings (found by
  // tests/fuzz/configure_fuzz: a Configure that took over 10 s to refuse).
  const int64_t C = c.d_model, V = c.vocab_size, T = c.seq_len, F = c.mlp_dim();
  switch (KindOfLayer(c, layer)) {
    case LayerKind::kEmbedding:
      return V * C + T * C;
    case LayerKind::kHead:
      return 2 * C + V * C;
    case LayerKind::kBlock:
      // ln_1 2C, c_attn 3C^2 + 3C, c_proj C^2 + C, ln_2 2C, c_fc CF + F, c_proj FC + C.
      return 4 * C * C + 2 * C * F + 9 * C + F;
  }
  return 0;
}

LayerCost CostOfLayer(const GptConfig& c, int layer) {
  const double C = c.d_model, V = c.vocab_size, T = c.seq_len, H = c.n_heads;
  constexpr double kF = 4;  // bytes per float
  LayerCost cost;
  cost.params = ParamsOfLayer(c, layer);
  switch (KindOfLayer(c, layer)) {
    case LayerKind::kEmbedding:
      cost.forward_flops = C;         // one add per channel
      cost.backward_input_flops = 0;  // token ids have no gradient
      cost.backward_weight_flops = 2 * C;
      cost.activation_bytes = 4;  // the token id
      cost.activation_bytes_recompute = 4;
      cost.weight_grad_bytes = C * kF;  // the output gradient, for the scatter-add
      cost.output_bytes = C * kF;
      break;
    case LayerKind::kBlock:
      // Matrix products: qkv 6C^2, proj 2C^2, mlp 16C^2; attention 4TC (scores, mix).
      cost.forward_flops = 24 * C * C + 4 * T * C;
      cost.backward_input_flops = 24 * C * C + 8 * T * C;
      cost.backward_weight_flops = 24 * C * C;
      // Kept for backward: input x, ln_1 out, qkv, attention probabilities (H x T),
      // attention out, residual after attention, ln_2 out, fc pre- and post-GELU,
      // and two LayerNorms' mean and rstd.
      cost.activation_bytes = (C + C + 3 * C + H * T + C + C + C + 4 * C + 4 * C + 4) * kF;
      cost.activation_bytes_recompute = C * kF;
      cost.output_bytes = C * kF;
      // I keeps the gradients at the MLP out (C) and in (4C), LayerNorm 2 (C), the
      // residual (C), qkv (3C) and LayerNorm 1 (C), and frees the pre-GELU values
      // (4C), qkv (3C) and the attention probabilities (H x T).
      cost.weight_grad_bytes = (4 * C - H * T) * kF;
      break;
    case LayerKind::kHead:
      cost.forward_flops = 2 * C * V + 5 * V;
      cost.backward_input_flops = 2 * C * V + 2 * V;
      cost.backward_weight_flops = 2 * C * V;
      // Input x, ln_f out, ln_f mean and rstd, softmax probabilities (overwritten by
      // the logits' gradient in backward), and the int32 target id.
      cost.activation_bytes = (C + C + 2 + V + 1) * kF;
      cost.activation_bytes_recompute = C * kF;
      cost.output_bytes = kF;           // the loss
      cost.weight_grad_bytes = C * kF;  // the gradient at ln_f's output
      break;
  }
  return cost;
}

ChunkMemory ChunkActivationBytes(const GptConfig& config, int begin, int end, bool recompute) {
  ChunkMemory m;
  double full = 0;
  for (int l = begin; l < end; ++l) {
    const LayerCost c = CostOfLayer(config, l);
    full += c.activation_bytes;  // each layer's stash and its input
    m.weight_grad += c.weight_grad_bytes;
  }
  if (!recompute) {
    m.stored = full;
    return m;
  }
  // Recomputing, the chunk keeps its input, and the targets when it holds the head.
  const bool holds_head = end == config.num_pipeline_layers();
  const double input = CostOfLayer(config, begin).activation_bytes_recompute;
  m.stored = input + (holds_head ? 4 : 0);
  m.backward_extra = full - input;
  return m;
}

}  // namespace pipetrain::model
