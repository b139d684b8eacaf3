#include "common/model/hf_gpt2.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model/gpt2_family.h"
#include "common/model/hf_config_json.h"
#include "common/status_macros.h"

namespace pipetrain::model {
namespace {

using hf::Field;
using hf::Invalid;
using hf::Json;
using hf::OptionalBool;
using hf::RequireBool;

constexpr char kMissingHint[] =
    "(a GPT-2 config.json gives vocab_size, n_positions, n_embd, n_layer and n_head)";

absl::StatusOr<int> PositiveInt(const Json& j, const char* name, absl::string_view source) {
  return hf::PositiveInt(j, name, source, kMissingHint);
}

constexpr char kPrefix[] = "transformer.";
// GELU's tanh form under the names Hugging Face gives it (gelu_fast rounds sqrt(2/pi) to
// ten digits, 4e-12 relative: the same function at float precision). "gelu" is erf's form.
constexpr const char* kTanhGeluNames[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"};

// ---- tensor names ------------------------------------------------------------------

// h.N.attn.bias and h.N.attn.masked_bias (either prefix): the causal mask and the value
// masked scores get, buffers older transformers saved with the weights.
bool IsAttentionBuffer(absl::string_view name) {
  absl::ConsumePrefix(&name, kPrefix);
  if (!absl::ConsumePrefix(&name, "h.")) return false;
  const size_t dot = name.find('.');
  if (dot == 0 || dot == absl::string_view::npos) return false;
  for (char c : name.substr(0, dot)) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  name.remove_prefix(dot);
  return name == ".attn.bias" || name == ".attn.masked_bias";
}

}  // namespace

absl::StatusOr<TransformerConfig> ParseHfGpt2Config(absl::string_view text,
                                                    const std::string& source) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(source, "is not a JSON object");
  if (const Json* type = Field(j, "model_type");
      type != nullptr && !(type->is_string() && type->get<std::string>() == "gpt2")) {
    return Invalid(source, absl::StrCat("model_type is ", type->dump(),
                                        "; only GPT-2 folders (\"gpt2\") can be read"));
  }
  TransformerConfig c;
  ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(j, "vocab_size", source));
  ASSIGN_OR_RETURN(c.d_model, PositiveInt(j, "n_embd", source));
  ASSIGN_OR_RETURN(c.n_layers, PositiveInt(j, "n_layer", source));
  ASSIGN_OR_RETURN(c.n_heads, PositiveInt(j, "n_head", source));
  // n_positions sizes wpe; n_ctx is its older name, used by files that lack it.
  ASSIGN_OR_RETURN(
      c.seq_len,
      PositiveInt(j, Field(j, "n_positions") || !Field(j, "n_ctx") ? "n_positions" : "n_ctx",
                  source));
  ASSIGN_OR_RETURN(c.tie_embeddings, OptionalBool(j, "tie_word_embeddings", true, source));

  if (const Json* act = Field(j, "activation_function"); act != nullptr) {
    bool known = false;
    for (const char* name : kTanhGeluNames) known = known || *act == name;
    if (!known) {
      return Invalid(source, absl::StrCat("activation_function is ", act->dump(),
                                          "; this model computes GELU in its tanh form (",
                                          absl::StrJoin(kTanhGeluNames, ", "), ")"));
    }
  }
  if (const Json* eps = Field(j, "layer_norm_epsilon"); eps != nullptr) {
    if (!eps->is_number() ||
        std::abs(eps->get<double>() - kLayerNormEpsilon) > 1e-9 * kLayerNormEpsilon) {
      return Invalid(source, absl::StrCat("layer_norm_epsilon is ", eps->dump(),
                                          "; this model's LayerNorm uses ", kLayerNormEpsilon));
    }
  }
  if (const Json* inner = Field(j, "n_inner"); inner != nullptr) {
    if (!inner->is_number_integer() || inner->get<int64_t>() != c.mlp_dim()) {
      return Invalid(source, absl::StrCat("n_inner is ", inner->dump(),
                                          "; this model's MLP is 4 * n_embd = ", c.mlp_dim(),
                                          " wide (give null)"));
    }
  }
  RETURN_IF_ERROR(RequireBool(j, "scale_attn_weights", true,
                              "this model scales attention scores by 1 / sqrt(head_dim)", source));
  RETURN_IF_ERROR(RequireBool(j, "scale_attn_by_inverse_layer_idx", false,
                              "this model does not scale attention by the layer index", source));
  RETURN_IF_ERROR(
      RequireBool(j, "add_cross_attention", false, "this model has no cross-attention", source));
  if (absl::Status s = ValidateConfig(c); !s.ok()) {
    return Invalid(source, absl::StrCat(s.message(), " (from n_embd, n_head, n_layer, ...)"));
  }
  return c;
}

std::string HfGpt2ConfigJson(const TransformerConfig& c) {
  nlohmann::ordered_json j = {
      {"model_type", "gpt2"},
      {"architectures", {"GPT2LMHeadModel"}},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.seq_len},
      {"n_ctx", c.seq_len},
      {"n_embd", c.d_model},
      {"n_layer", c.n_layers},
      {"n_head", c.n_heads},
      {"n_inner", nullptr},  // 4 * n_embd
      {"activation_function", kHfActivation},
      {"layer_norm_epsilon", kLayerNormEpsilon},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"tie_word_embeddings", c.tie_embeddings},
      {"initializer_range", 0.02},
      // pipetrain trains without dropout, so the exported model continues as it was
      // trained; GPT-2's own 0.1 would change a fine-tune's dynamics. Set them for
      // regularised training.
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"summary_first_dropout", 0.0},
      {"torch_dtype", "float32"},
  };
  return j.dump(2) + "\n";
}

std::optional<std::string> Gpt2ParamOfHfTensor(absl::string_view file_name,
                                               const std::set<std::string>& expected) {
  if (IsAttentionBuffer(file_name)) return std::nullopt;
  std::string name(file_name);
  if (std::string prefixed = absl::StrCat(kPrefix, file_name);
      !expected.count(name) && expected.count(prefixed)) {
    return prefixed;
  }
  return name;
}

}  // namespace pipetrain::model
