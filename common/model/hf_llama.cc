#include "common/model/hf_llama.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/hf_config_json.h"
#include "common/model/llama_family.h"
#include "common/status_macros.h"

namespace pipetrain::model {
namespace {

using hf::Field;
using hf::Invalid;
using hf::Json;

constexpr char kMissingHint[] =
    "(a Llama config.json gives vocab_size, max_position_embeddings, hidden_size, "
    "intermediate_size, num_hidden_layers and num_attention_heads)";
constexpr double kHfDefaultRopeTheta = 10000;  // LlamaConfig's default
// Llama 3's vocabulary and its begin- and end-of-text ids (common/data/llama3_bpe.h).
constexpr int kLlama3Vocabulary = 128256;
constexpr int kLlama3BeginOfText = 128000;
constexpr int kLlama3EndOfText = 128001;

absl::StatusOr<int> PositiveInt(const Json& j, const char* name, absl::string_view source) {
  return hf::PositiveInt(j, name, source, kMissingHint);
}

// A field that must be absent or null: the model has nothing it could describe.
absl::Status RequireAbsent(const Json& j, const char* name, absl::string_view why,
                           absl::string_view source) {
  const Json* v = Field(j, name);
  if (v == nullptr) return absl::OkStatus();
  return Invalid(source, absl::StrCat(name, " is ", v->dump(), "; ", why));
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& j, absl::string_view source) {
  const Json* r = Field(j, "rope_scaling");
  if (r == nullptr) return RopeScaling{};
  if (!r->is_object()) return Invalid(source, "rope_scaling must be an object or null");
  const Json* type = Field(*r, "rope_type");
  if (type == nullptr) type = Field(*r, "type");  // its older name
  if (type == nullptr || *type != "llama3") {
    return Invalid(source, absl::StrCat("rope_scaling.rope_type is ",
                                        type == nullptr ? "missing" : type->dump(),
                                        "; the one implemented is \"llama3\""));
  }
  const std::string where = absl::StrCat(source, ": rope_scaling");
  RopeScaling s;
  ASSIGN_OR_RETURN(s.factor, hf::PositiveNumber(*r, "factor", 0, where));
  ASSIGN_OR_RETURN(s.low_freq_factor, hf::PositiveNumber(*r, "low_freq_factor", 0, where));
  ASSIGN_OR_RETURN(s.high_freq_factor, hf::PositiveNumber(*r, "high_freq_factor", 0, where));
  ASSIGN_OR_RETURN(s.original_context, hf::PositiveInt(*r, "original_max_position_embeddings",
                                                       where, "(llama3 scaling needs it)"));
  return s;
}

// What this model does not compute, refused naming the field.
absl::Status RefuseOtherArchitectures(const Json& j, const TransformerConfig& c,
                                      absl::string_view source) {
  RETURN_IF_ERROR(hf::RequireBool(j, "attention_bias", false, "this model has no biases", source));
  RETURN_IF_ERROR(hf::RequireBool(j, "mlp_bias", false, "this model has no biases", source));
  if (const Json* act = Field(j, "hidden_act"); act != nullptr && *act != "silu") {
    return Invalid(source, absl::StrCat("hidden_act is ", act->dump(),
                                        "; this model's MLP is SwiGLU (\"silu\")"));
  }
  if (const Json* hd = Field(j, "head_dim");
      hd != nullptr && !(hd->is_number_integer() && hd->get<int64_t>() == c.head_dim())) {
    return Invalid(source, absl::StrCat("head_dim is ", hd->dump(),
                                        "; this model's heads are hidden_size / "
                                        "num_attention_heads = ", c.head_dim(), " wide"));
  }
  if (const Json* tp = Field(j, "pretraining_tp");
      tp != nullptr && !(tp->is_number_integer() && tp->get<int64_t>() == 1)) {
    return Invalid(source, absl::StrCat("pretraining_tp is ", tp->dump(), "; only 1 is computed"));
  }
  RETURN_IF_ERROR(RequireAbsent(j, "sliding_window", "this model attends to every position",
                                source));
  return RequireAbsent(j, "num_local_experts", "this model has one MLP (no experts)", source);
}

}  // namespace

absl::StatusOr<TransformerConfig> ParseHfLlamaConfig(absl::string_view text,
                                                     const std::string& source) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(source, "is not a JSON object");
  if (const Json* type = Field(j, "model_type"); type == nullptr || *type != kLlamaFamily) {
    return Invalid(source, absl::StrCat("model_type is ",
                                        type == nullptr ? "missing" : type->dump(),
                                        "; this reader takes Llama folders (\"llama\")"));
  }
  TransformerConfig c;
  c.family = kLlamaFamily;
  ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(j, "vocab_size", source));
  ASSIGN_OR_RETURN(c.seq_len, PositiveInt(j, "max_position_embeddings", source));
  ASSIGN_OR_RETURN(c.d_model, PositiveInt(j, "hidden_size", source));
  ASSIGN_OR_RETURN(c.ffn_dim, PositiveInt(j, "intermediate_size", source));
  ASSIGN_OR_RETURN(c.n_layers, PositiveInt(j, "num_hidden_layers", source));
  ASSIGN_OR_RETURN(c.n_heads, PositiveInt(j, "num_attention_heads", source));
  c.n_kv_heads = c.n_heads;
  if (Field(j, "num_key_value_heads") != nullptr) {
    ASSIGN_OR_RETURN(c.n_kv_heads, PositiveInt(j, "num_key_value_heads", source));
  }
  ASSIGN_OR_RETURN(c.norm_eps, hf::PositiveNumber(j, "rms_norm_eps", 1e-6, source));
  ASSIGN_OR_RETURN(c.rope_theta, hf::PositiveNumber(j, "rope_theta", kHfDefaultRopeTheta, source));
  ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, source));
  ASSIGN_OR_RETURN(c.tie_embeddings, hf::OptionalBool(j, "tie_word_embeddings", false, source));
  RETURN_IF_ERROR(RefuseOtherArchitectures(j, c, source));
  if (absl::Status s = ValidateConfig(c); !s.ok()) {
    return Invalid(source, absl::StrCat(s.message(), " (from hidden_size, num_attention_heads, ...)"));
  }
  return c;
}

std::string HfLlamaConfigJson(const TransformerConfig& c) {
  nlohmann::ordered_json j = {
      {"model_type", kLlamaFamily},
      {"architectures", {"LlamaForCausalLM"}},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.seq_len},
      {"hidden_size", c.d_model},
      {"intermediate_size", c.ffn_dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.kv_heads()},
      {"head_dim", c.head_dim()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},
      {"pretraining_tp", 1},
      {"tie_word_embeddings", c.tie_embeddings},
      {"initializer_range", 0.02},
      {"torch_dtype", "float32"},
  };
  if (c.vocab_size == kLlama3Vocabulary) {
    // Llama 3's tokenizer (pipetrain tokenize --tokenizer llama3): generate() stops at its
    // end of text. LlamaConfig's own defaults (1 and 2) are Llama 2's.
    j["bos_token_id"] = kLlama3BeginOfText;
    j["eos_token_id"] = kLlama3EndOfText;
  }
  if (c.rope_scaling != RopeScaling{}) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_context}};
  }
  return j.dump(2) + "\n";
}

std::optional<std::string> LlamaParamOfHfTensor(absl::string_view file_name,
                                                const std::set<std::string>&) {
  if (absl::EndsWith(file_name, ".self_attn.rotary_emb.inv_freq")) return std::nullopt;
  return std::string(file_name);
}

}  // namespace pipetrain::model
