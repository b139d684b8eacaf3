#include "common/model/gpt2_family.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/model/hf_gpt2.h"
#include "common/status_macros.h"

namespace pipetrain::model {
namespace {

using common::DType;

// A parameter's training state: its f32 value, gradient and AdamW's two moments.
constexpr int64_t kTrainingStateTensors = 4;

// The whole model's parameter count and its training state bytes in checked 64-bit
// arithmetic, so a shape whose count or bytes do not fit is refused here, naming the
// field, instead of wrapping in a planner estimate or an allocation size later.
absl::Status CheckModelSize(const TransformerConfig& c) {
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
  const int64_t state_bytes =
      kTrainingStateTensors * static_cast<int64_t>(common::DTypeSize(DType::kF32));
  return common::CheckedMul(
             total, state_bytes,
             absl::StrCat("model: training state bytes (", state_bytes, " per parameter)"))
      .status();
}

std::vector<ParamSpec> EmbeddingParams(const TransformerConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, T = c.seq_len;
  std::vector<ParamSpec> p(Gpt2Embedding::kNumParams);
  p[Gpt2Embedding::kWte] = {kTokenEmbeddingName, {V, C}, true, "", ParamInit::kNormal};
  p[Gpt2Embedding::kWpe] = {kPositionEmbeddingName, {T, C}, true, "", ParamInit::kNormal};
  p[Gpt2Embedding::kWpe].per_position = true;
  return p;
}

std::vector<ParamSpec> BlockParams(const TransformerConfig& c, int block) {
  const int64_t C = c.d_model, F = c.mlp_dim();
  const std::string n = absl::StrCat("transformer.h.", block, ".");
  using B = Gpt2Block;
  constexpr ParamInit kZeros = ParamInit::kZeros, kOnes = ParamInit::kOnes;
  constexpr ParamInit kNormal = ParamInit::kNormal, kResidual = ParamInit::kResidualNormal;
  std::vector<ParamSpec> p(B::kNumParams);
  p[B::kLn1Weight] = {n + "ln_1.weight", {C}, false, "", kOnes};
  p[B::kLn1Bias] = {n + "ln_1.bias", {C}, false, "", kZeros};
  p[B::kAttnWeight] = {n + "attn.c_attn.weight", {C, 3 * C}, true, "", kNormal};
  p[B::kAttnBias] = {n + "attn.c_attn.bias", {3 * C}, false, "", kZeros};
  p[B::kAttnProjWeight] = {n + "attn.c_proj.weight", {C, C}, true, "", kResidual};
  p[B::kAttnProjBias] = {n + "attn.c_proj.bias", {C}, false, "", kZeros};
  p[B::kLn2Weight] = {n + "ln_2.weight", {C}, false, "", kOnes};
  p[B::kLn2Bias] = {n + "ln_2.bias", {C}, false, "", kZeros};
  p[B::kFcWeight] = {n + "mlp.c_fc.weight", {C, F}, true, "", kNormal};
  p[B::kFcBias] = {n + "mlp.c_fc.bias", {F}, false, "", kZeros};
  p[B::kMlpProjWeight] = {n + "mlp.c_proj.weight", {F, C}, true, "", kResidual};
  p[B::kMlpProjBias] = {n + "mlp.c_proj.bias", {C}, false, "", kZeros};
  return p;
}

std::vector<ParamSpec> HeadParams(const TransformerConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size;
  std::vector<ParamSpec> p(Gpt2Head::kNumParams);
  p[Gpt2Head::kLnFWeight] = {"transformer.ln_f.weight", {C}, false, "", ParamInit::kOnes};
  p[Gpt2Head::kLnFBias] = {"transformer.ln_f.bias", {C}, false, "", ParamInit::kZeros};
  p[Gpt2Head::kLmHead] = {kOutputHeadName, {V, C}, true,
                          c.tie_embeddings ? kTokenEmbeddingName : "", ParamInit::kNormal};
  return p;
}

class Gpt2 : public ModelFamily {
 public:
  absl::string_view name() const override { return "gpt2"; }

  absl::Status Validate(const TransformerConfig& c) const override {
    if (c.n_kv_heads != 0 || c.ffn_dim != 0 || c.rope_theta != 0 || c.norm_eps != 0 ||
        c.rope_scaling != RopeScaling{}) {
      return absl::InvalidArgumentError(
          "model: a GPT-2 config holds Llama fields (n_kv_heads, ffn_dim, rope_theta, "
          "norm_eps or rope_scaling)");
    }
    if (c.d_model % c.n_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.n_heads (", c.n_heads, ") must divide model.d_model (", c.d_model, ")"));
    }
    // mlp_dim() is 4 x d_model in int.
    if (c.d_model > std::numeric_limits<int>::max() / kMlpWidth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.d_model must be <= ", std::numeric_limits<int>::max() / kMlpWidth, " (got ",
          c.d_model, "): the MLP's ", kMlpWidth, " x d_model would overflow"));
    }
    return CheckModelSize(c);
  }

  int MlpDim(const TransformerConfig& c) const override { return kMlpWidth * c.d_model; }

  absl::Status FieldsFromProto(const pipetrain::v1::ModelConfig& p,
                               TransformerConfig&) const override {
    for (auto [given, field] : {std::pair{p.has_n_kv_heads(), "n_kv_heads"},
                                {p.has_ffn_dim(), "ffn_dim"},
                                {p.has_rope_theta(), "rope_theta"},
                                {p.has_norm_eps(), "norm_eps"},
                                {p.has_rope_scaling(), "rope_scaling"}}) {
      if (given) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.", field, " is a field of model.architecture \"llama\", not of \"gpt2\""));
      }
    }
    return absl::OkStatus();
  }
  void FieldsToProto(const TransformerConfig&, pipetrain::v1::ModelConfig&) const override {}

  std::vector<ParamSpec> LayerParams(const TransformerConfig& c, int layer) const override {
    switch (KindOfLayer(c, layer)) {
      case LayerKind::kEmbedding:
        return EmbeddingParams(c);
      case LayerKind::kHead:
        return HeadParams(c);
      case LayerKind::kBlock:
        return BlockParams(c, layer - 1);
    }
    return {};
  }

  int64_t ParamsOfLayer(const TransformerConfig& c, int layer) const override {
    // LayerParams' tensors counted without building them (found by
    // tests/fuzz/configure_fuzz: a Configure that took over 10 s to refuse).
    const int64_t C = c.d_model, V = c.vocab_size, T = c.seq_len, F = MlpDim(c);
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

  LayerCost CostOfLayer(const TransformerConfig& c, int layer, DType products) const override {
    // Activations are held in fp32; those kept only for a product, as product copies:
    // in the products' dtype where it is not fp32.
    const DType activations = DType::kF32;
    LayerCost cost;
    cost.params = ParamsOfLayer(c, layer);
    switch (KindOfLayer(c, layer)) {
      case LayerKind::kEmbedding:
        EmbeddingCost(c, activations, cost);
        break;
      case LayerKind::kBlock:
        BlockCost(c, activations, products, cost);
        break;
      case LayerKind::kHead:
        HeadCost(c, activations, products, cost);
        break;
    }
    return cost;
  }
  // Learned positions are parameters: a GPT-2 chunk shares no tables.
  uint64_t ChunkTableBytes(const TransformerConfig&, int, int) const override { return 0; }

  absl::StatusOr<TransformerConfig> ParseHfConfig(absl::string_view json,
                                                  const std::string& source) const override {
    return ParseHfGpt2Config(json, source);
  }
  std::string HfConfigJson(const TransformerConfig& c) const override {
    return HfGpt2ConfigJson(c);
  }
  std::optional<std::string> ParamOfHfTensor(
      absl::string_view file_name, const std::set<std::string>& expected) const override {
    return Gpt2ParamOfHfTensor(file_name, expected);
  }
  absl::string_view hf_renamed_note() const override {
    return "names shown with the transformer. prefix";
  }
  std::string DescribeFields(const TransformerConfig&) const override { return ""; }

 private:
  static constexpr int kMlpWidth = 4;  // the MLP is 4 x d_model wide

  static void EmbeddingCost(const TransformerConfig& c, DType activations, LayerCost& cost) {
    const double C = c.d_model, a = common::DTypeSize(activations);
    const double id = common::DTypeSize(DType::kI32);
    cost.forward_flops = C;         // one add per channel
    cost.backward_input_flops = 0;  // token ids have no gradient
    cost.backward_weight_flops = 2 * C;
    cost.activation_bytes = id;  // the token id
    cost.activation_bytes_recompute = id;
    cost.weight_grad_bytes = C * a;  // the output gradient, for the scatter-add
    cost.output_bytes = C * a;
  }

  static void BlockCost(const TransformerConfig& c, DType activations, DType products,
                        LayerCost& cost) {
    const double C = c.d_model, T = c.seq_len, H = c.n_heads, F = c.mlp_dim();
    const double a = common::DTypeSize(activations), p = common::DTypeSize(products);
    // Matrix products: qkv 6C^2, proj 2C^2, mlp 16C^2; attention 4TC (scores, mix).
    cost.forward_flops = 24 * C * C + 4 * T * C;
    cost.backward_input_flops = 24 * C * C + 8 * T * C;
    cost.backward_weight_flops = 24 * C * C;
    // Kept for backward: input x, qkv, attention probabilities (H x T), residual after
    // attention, fc pre-GELU, two LayerNorms' mean and rstd; and as product copies, read
    // only by the weight gradients' products: ln_1 out, attention out, ln_2 out, and fc
    // post-GELU.
    cost.activation_bytes = (C + 3 * C + H * T + C + F + 4) * a + (C + C + C + F) * p;
    cost.activation_bytes_recompute = C * a;
    cost.output_bytes = C * a;
    // I keeps the gradients at the MLP out (C) and in (F), LayerNorm 2 (C), the
    // residual (C), qkv (3C) and LayerNorm 1 (C), and frees the pre-GELU values (F),
    // qkv (3C) and the attention probabilities (H x T): 4C - H x T.
    cost.weight_grad_bytes = (4 * C - H * T) * a;
  }

  static void HeadCost(const TransformerConfig& c, DType activations, DType products,
                       LayerCost& cost) {
    const double C = c.d_model, V = c.vocab_size, a = common::DTypeSize(activations);
    const double p = common::DTypeSize(products);
    const double id = common::DTypeSize(DType::kI32);
    cost.forward_flops = 2 * C * V + 5 * V;
    cost.backward_input_flops = 2 * C * V + 2 * V;
    cost.backward_weight_flops = 2 * C * V;
    // Input x, ln_f mean and rstd, softmax probabilities (overwritten by the logits'
    // gradient in backward), the target id, and ln_f out as a product copy (read only by
    // the products).
    cost.activation_bytes = (C + 2 + V) * a + C * p + id;
    cost.activation_bytes_recompute = C * a;
    cost.output_bytes = a;           // the loss
    cost.weight_grad_bytes = C * a;  // the gradient at ln_f's output
  }
};

}  // namespace

const ModelFamily& Gpt2Family() {
  static const Gpt2* family = new Gpt2;
  return *family;
}

}  // namespace pipetrain::model
