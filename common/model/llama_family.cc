#include "common/model/llama_family.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/model/hf_llama.h"
#include "common/model/rope.h"
#include "common/status_macros.h"

namespace pipetrain::model {
namespace {

using common::DType;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("model.", field, " ", what));
}

// The whole model's parameters times the 4 fp32 tensors of training state, in checked
// arithmetic: a shape that does not fit is refused naming the fields.
absl::Status CheckModelSize(const TransformerConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, L = c.n_layers, F = c.ffn_dim;
  const int64_t KV = int64_t{c.kv_heads()} * c.head_dim();
  ASSIGN_OR_RETURN(int64_t vc, common::CheckedMul(V, C, "model.vocab_size x model.d_model"));
  // A block: q and o C^2 each, k and v KV C each, gate, up and down F C each, 2 norms.
  ASSIGN_OR_RETURN(int64_t c2, common::CheckedMul(C, 2 * C + 2 * KV, "model.d_model"));
  ASSIGN_OR_RETURN(int64_t fc, common::CheckedMul(C, 3 * F, "model.ffn_dim x model.d_model"));
  ASSIGN_OR_RETURN(int64_t block, common::CheckedAdd(c2, fc + 2 * C, "model.d_model"));
  ASSIGN_OR_RETURN(int64_t total, common::CheckedMul(block, L, "model.n_layers x block parameters"));
  ASSIGN_OR_RETURN(total, common::CheckedAdd(total, 2 * vc + C, "model.vocab_size"));
  constexpr int64_t kStateBytes = 4 * 4;  // value, gradient and AdamW's moments, fp32
  return common::CheckedMul(total, kStateBytes, "model: training state bytes (16 per parameter)")
      .status();
}

absl::Status ValidateRopeScaling(const RopeScaling& r) {
  if (r == RopeScaling{}) return absl::OkStatus();
  if (!(r.factor >= 1) || !std::isfinite(r.factor)) {
    return Invalid("rope_scaling.factor", absl::StrCat("must be >= 1 (got ", r.factor, ")"));
  }
  if (!(r.low_freq_factor > 0) || !std::isfinite(r.low_freq_factor)) {
    return Invalid("rope_scaling.low_freq_factor",
                   absl::StrCat("must be > 0 (got ", r.low_freq_factor, ")"));
  }
  if (!(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
    return Invalid("rope_scaling.high_freq_factor",
                   absl::StrCat("must be > low_freq_factor (got ", r.high_freq_factor, " and ",
                                r.low_freq_factor, ")"));
  }
  if (r.original_context <= 0) {
    return Invalid("rope_scaling.original_max_position_embeddings",
                   absl::StrCat("must be > 0 (got ", r.original_context, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RopeScaling> RopeScalingFromProto(const pipetrain::v1::RopeScaling& p) {
  if (p.rope_type() != "llama3") {
    return Invalid("rope_scaling.rope_type",
                   absl::StrCat("is \"", p.rope_type(), "\"; the one implemented is \"llama3\""));
  }
  return RopeScaling{p.factor(), p.low_freq_factor(), p.high_freq_factor(),
                     p.original_max_position_embeddings()};
}

std::vector<ParamSpec> BlockParams(const TransformerConfig& c, int block) {
  const int64_t C = c.d_model, F = c.ffn_dim, hs = c.head_dim();
  const int64_t Q = int64_t{c.n_heads} * hs, KV = int64_t{c.kv_heads()} * hs;
  const std::string n = absl::StrCat("model.layers.", block, ".");
  using B = LlamaBlock;
  constexpr ParamInit kOnes = ParamInit::kOnes, kNormal = ParamInit::kNormal;
  constexpr ParamInit kResidual = ParamInit::kResidualNormal;
  std::vector<ParamSpec> p(B::kNumParams);
  p[B::kInputNorm] = {n + "input_layernorm.weight", {C}, false, "", kOnes};
  p[B::kQProj] = {n + "self_attn.q_proj.weight", {Q, C}, true, "", kNormal};
  p[B::kKProj] = {n + "self_attn.k_proj.weight", {KV, C}, true, "", kNormal};
  p[B::kVProj] = {n + "self_attn.v_proj.weight", {KV, C}, true, "", kNormal};
  p[B::kOProj] = {n + "self_attn.o_proj.weight", {C, Q}, true, "", kResidual};
  p[B::kPostNorm] = {n + "post_attention_layernorm.weight", {C}, false, "", kOnes};
  p[B::kGateProj] = {n + "mlp.gate_proj.weight", {F, C}, true, "", kNormal};
  p[B::kUpProj] = {n + "mlp.up_proj.weight", {F, C}, true, "", kNormal};
  p[B::kDownProj] = {n + "mlp.down_proj.weight", {C, F}, true, "", kResidual};
  return p;
}

class Llama : public ModelFamily {
 public:
  absl::string_view name() const override { return kLlamaFamily; }

  absl::Status Validate(const TransformerConfig& c) const override {
    if (c.d_model % c.n_heads != 0 || c.head_dim() % 2 != 0) {
      return Invalid("n_heads", absl::StrCat("(", c.n_heads, ") must divide model.d_model (",
                                             c.d_model, ") into heads of an even width (the "
                                             "rotary embeddings rotate pairs)"));
    }
    if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
      return Invalid("n_kv_heads", absl::StrCat("(", c.n_kv_heads, ") must be > 0 and divide "
                                                "model.n_heads (", c.n_heads, ")"));
    }
    if (c.ffn_dim <= 0 || c.ffn_dim > std::numeric_limits<int>::max() / 2) {
      return Invalid("ffn_dim", absl::StrCat("must be > 0 and <= ",
                                             std::numeric_limits<int>::max() / 2, " (got ",
                                             c.ffn_dim, ")"));
    }
    if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
      return Invalid("rope_theta", absl::StrCat("must be > 0 (got ", c.rope_theta, ")"));
    }
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) {
      return Invalid("norm_eps", absl::StrCat("must be > 0 (got ", c.norm_eps, ")"));
    }
    RETURN_IF_ERROR(ValidateRopeScaling(c.rope_scaling));
    return CheckModelSize(c);
  }

  int MlpDim(const TransformerConfig& c) const override { return c.ffn_dim; }

  absl::Status FieldsFromProto(const pipetrain::v1::ModelConfig& p,
                               TransformerConfig& c) const override {
    c.n_kv_heads = p.has_n_kv_heads() ? p.n_kv_heads() : c.n_heads;
    c.ffn_dim = p.has_ffn_dim() ? p.ffn_dim() : LlamaDefaultFfnDim(c.d_model);
    c.rope_theta = p.has_rope_theta() ? p.rope_theta() : kLlamaDefaultRopeTheta;
    c.norm_eps = p.has_norm_eps() ? p.norm_eps() : kLlamaDefaultNormEps;
    c.rope_scaling = {};
    if (p.has_rope_scaling()) {
      ASSIGN_OR_RETURN(c.rope_scaling, RopeScalingFromProto(p.rope_scaling()));
    }
    return absl::OkStatus();
  }

  void FieldsToProto(const TransformerConfig& c, pipetrain::v1::ModelConfig& p) const override {
    p.set_n_kv_heads(c.n_kv_heads);
    p.set_ffn_dim(c.ffn_dim);
    p.set_rope_theta(c.rope_theta);
    p.set_norm_eps(c.norm_eps);
    if (c.rope_scaling != RopeScaling{}) {
      pipetrain::v1::RopeScaling& r = *p.mutable_rope_scaling();
      r.set_rope_type("llama3");
      r.set_factor(c.rope_scaling.factor);
      r.set_low_freq_factor(c.rope_scaling.low_freq_factor);
      r.set_high_freq_factor(c.rope_scaling.high_freq_factor);
      r.set_original_max_position_embeddings(c.rope_scaling.original_context);
    }
  }

  std::vector<ParamSpec> LayerParams(const TransformerConfig& c, int layer) const override {
    const int64_t C = c.d_model, V = c.vocab_size;
    switch (KindOfLayer(c, layer)) {
      case LayerKind::kEmbedding:
        return {{kLlamaTokenEmbeddingName, {V, C}, true, "", ParamInit::kNormal}};
      case LayerKind::kHead:
        return {{"model.norm.weight", {C}, false, "", ParamInit::kOnes},
                {kLlamaOutputHeadName, {V, C}, true,
                 c.tie_embeddings ? kLlamaTokenEmbeddingName : "", ParamInit::kNormal}};
      case LayerKind::kBlock:
        return BlockParams(c, layer - 1);
    }
    return {};
  }

  int64_t ParamsOfLayer(const TransformerConfig& c, int layer) const override {
    const int64_t C = c.d_model, V = c.vocab_size, F = c.ffn_dim;
    const int64_t KV = int64_t{c.kv_heads()} * c.head_dim();
    switch (KindOfLayer(c, layer)) {
      case LayerKind::kEmbedding:
        return V * C;
      case LayerKind::kHead:
        return C + V * C;
      case LayerKind::kBlock:
        return 2 * C * C + 2 * KV * C + 3 * F * C + 2 * C;
    }
    return 0;
  }

  LayerCost CostOfLayer(const TransformerConfig& c, int layer, DType products) const override {
    LayerCost cost;
    cost.params = ParamsOfLayer(c, layer);
    const double a = common::DTypeSize(DType::kF32), p = common::DTypeSize(products);
    const double id = common::DTypeSize(DType::kI32);
    const double C = c.d_model, V = c.vocab_size;
    switch (KindOfLayer(c, layer)) {
      case LayerKind::kEmbedding:
        cost.backward_weight_flops = C;  // the scatter-add of the output gradient
        cost.activation_bytes = cost.activation_bytes_recompute = id;  // the token id
        cost.weight_grad_bytes = cost.output_bytes = C * a;
        break;
      case LayerKind::kBlock:
        BlockCost(c, a, p, cost);
        break;
      case LayerKind::kHead:
        cost.forward_flops = 2 * C * V + 5 * V;
        cost.backward_input_flops = 2 * C * V + 2 * V;
        cost.backward_weight_flops = 2 * C * V;
        // Input x, the norm's rstd, the probabilities (then the logits' gradient), the
        // target id, and the norm's output as a product copy.
        cost.activation_bytes = (C + 1 + V) * a + C * p + id;
        cost.activation_bytes_recompute = C * a;
        cost.output_bytes = a;
        cost.weight_grad_bytes = C * a;  // the gradient at the norm's output
        break;
    }
    return cost;
  }
  // The blocks of a chunk share one pair of rotary tables; the embedding and the head
  // read none.
  uint64_t ChunkTableBytes(const TransformerConfig& c, int begin, int end) const override {
    const int64_t first_block = std::max<int64_t>(begin, 1);
    const int64_t blocks_end = std::min<int64_t>(end, int64_t{c.n_layers} + 1);
    return first_block < blocks_end ? RotaryTableBytes(c) : 0;
  }

  absl::StatusOr<TransformerConfig> ParseHfConfig(absl::string_view json,
                                                  const std::string& source) const override {
    return ParseHfLlamaConfig(json, source);
  }
  std::string HfConfigJson(const TransformerConfig& c) const override {
    return HfLlamaConfigJson(c);
  }
  std::optional<std::string> ParamOfHfTensor(
      absl::string_view file_name, const std::set<std::string>& expected) const override {
    return LlamaParamOfHfTensor(file_name, expected);
  }
  absl::string_view hf_renamed_note() const override { return "names as Hugging Face's"; }
  std::string DescribeFields(const TransformerConfig& c) const override {
    return absl::StrCat(", llama: n_kv_heads ", c.kv_heads(), ", ffn_dim ", c.ffn_dim);
  }

 private:
  static void BlockCost(const TransformerConfig& c, double a, double p, LayerCost& cost) {
    const double C = c.d_model, T = c.seq_len, H = c.n_heads, F = c.ffn_dim;
    const double W = C + 2.0 * c.kv_heads() * c.head_dim();  // q|k|v's width
    // Products: q|k|v C W, o C^2, gate|up 2 C F, down F C; attention 4 T C.
    const double products = 2 * (C * W + C * C + 3 * C * F);
    cost.forward_flops = products + 4 * T * C;
    cost.backward_input_flops = products + 8 * T * C;
    cost.backward_weight_flops = products;
    // Kept for the backward: the input x, q|k|v after rotation, the attention
    // probabilities (H x T), the residual after attention, gate|up, the two norms' rstd;
    // and as product copies: the first norm's output, the attention output, the second
    // norm's output and the SwiGLU output.
    cost.activation_bytes = (C + W + H * T + C + 2 * F + 2) * a + (3 * C + F) * p;
    cost.activation_bytes_recompute = C * a;
    cost.output_bytes = C * a;
    // I keeps the gradients at the MLP's out (C), gate|up (2F), the second norm (C), the
    // residual (C), q|k|v (W) and the first norm (C), and frees gate|up (2F), q|k|v (W)
    // and the probabilities (H x T).
    cost.weight_grad_bytes = (4 * C - H * T) * a;
  }
};

}  // namespace

int LlamaDefaultFfnDim(int d_model) {
  const int64_t raw = 8 * int64_t{d_model} / 3;
  const int64_t rounded = (raw + kLlamaFfnMultiple - 1) / kLlamaFfnMultiple * kLlamaFfnMultiple;
  return static_cast<int>(std::min<int64_t>(rounded, std::numeric_limits<int>::max()));
}

const ModelFamily& LlamaFamily() {
  static const Llama* family = new Llama;
  return *family;
}

}  // namespace pipetrain::model
