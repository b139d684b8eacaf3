#include "common/model/hf_gpt2.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/atomic_file.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

namespace fs = std::filesystem;
using common::DType;
using Json = nlohmann::json;

constexpr char kPrefix[] = "transformer.";
// The dtypes GPT-2 weights come in; F16 and BF16 are widened to F32 on reading.
constexpr DType kWeightDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
// GELU's tanh form under the names Hugging Face gives it (gelu_fast rounds sqrt(2/pi) to
// ten digits, 4e-12 relative: the same function at float precision). "gelu" is erf's form.
constexpr const char* kTanhGeluNames[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"};

absl::Status Invalid(absl::string_view source, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

// Whether an index's file name stays inside the folder: not absolute, no '..' (a job
// allowed one folder must not read another through its index).
bool InFolder(const std::string& name) {
  if (name.empty() || fs::path(name).is_absolute()) return false;
  for (const fs::path& part : fs::path(name)) {
    if (part == "..") return false;
  }
  return true;
}

// config.json and index files: bounded JSON, never a FIFO or device.
absl::StatusOr<std::string> ReadText(const fs::path& path) {
  return common::ReadRegularFile(path.string(), common::kMaxJsonFileBytes, "");
}

// ---- config.json -------------------------------------------------------------------

// An optional field of a given JSON kind; absent and null read as nullopt.
const Json* Field(const Json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<int> PositiveInt(const Json& j, const char* name, absl::string_view source) {
  const Json* v = Field(j, name);
  if (v == nullptr) {
    return Invalid(source, absl::StrCat(name,
                                        " is missing (a GPT-2 config.json gives vocab_size, "
                                        "n_positions, n_embd, n_layer and n_head)"));
  }
  if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > (int64_t{1} << 30)) {
    return Invalid(source, absl::StrCat(name, " must be a positive integer (got ", v->dump(), ")"));
  }
  return static_cast<int>(v->get<int64_t>());
}

absl::StatusOr<bool> OptionalBool(const Json& j, const char* name, bool fallback,
                                  absl::string_view source) {
  const Json* v = Field(j, name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    return Invalid(source, absl::StrCat(name, " must be true or false (got ", v->dump(), ")"));
  }
  return v->get<bool>();
}

// A boolean that must hold `required` (when present) because the model computes only that.
absl::Status RequireBool(const Json& j, const char* name, bool required, absl::string_view why,
                         absl::string_view source) {
  ASSIGN_OR_RETURN(const bool value, OptionalBool(j, name, required, source));
  if (value == required) return absl::OkStatus();
  return Invalid(source, absl::StrCat(name, " is ", value ? "true" : "false", "; ", why));
}

// ---- tensors -----------------------------------------------------------------------

// IEEE half to float, exactly (every half is a float).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof bits);
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// bfloat16 is the top half of a float.
float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

absl::StatusOr<common::Tensor> ToF32(common::Tensor t) {
  if (t.dtype() == DType::kF32) return t;
  ASSIGN_OR_RETURN(common::Tensor out, common::Tensor::Create(DType::kF32, t.shape()));
  std::span<float> to = out.data<float>();
  std::span<const uint16_t> from = t.data<uint16_t>();
  for (size_t i = 0; i < from.size(); ++i) {
    to[i] = t.dtype() == DType::kF16 ? HalfToFloat(from[i]) : BFloat16ToFloat(from[i]);
  }
  return out;
}

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

// One tensor of the folder, under the name our checkpoints give it.
struct Entry {
  std::string file;       // the shard's path
  std::string file_name;  // as the file spells it
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
};

using Entries = std::map<std::string, Entry>;  // by our name

// The safetensors files of the folder: model.safetensors, else the shards of the index.
absl::StatusOr<std::vector<std::string>> WeightFiles(const fs::path& dir, std::string& what) {
  std::error_code ec;
  const fs::path single = dir / kHfWeightsFileName;
  if (fs::exists(single, ec)) {
    what = single.string();
    return std::vector<std::string>{single.string()};
  }
  const fs::path index = dir / kCheckpointIndexFileName;
  if (!fs::exists(index, ec)) {
    return Invalid(dir.string(),
                   absl::StrCat("has a ", kHfConfigFileName, " but neither ", kHfWeightsFileName,
                                " nor ", kCheckpointIndexFileName));
  }
  what = index.string();
  ASSIGN_OR_RETURN(const std::string text, ReadText(index));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object()) {
    return Invalid(index.string(), "is not a Hugging Face index (no weight_map object)");
  }
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || !InFolder(file.get<std::string>())) {
      return Invalid(index.string(), absl::StrCat("weight_map['", name, "'] is ", file.dump(),
                                                  ", not a file name in the folder"));
    }
    files.insert(file.get<std::string>());
  }
  if (files.empty()) return Invalid(index.string(), "weight_map names no files");
  std::vector<std::string> out;
  for (const std::string& f : files) out.push_back((dir / f).string());
  return out;
}

// Reads every entry's header, under our names where the name (with the prefix added) is one
// we expect, else as the file spells it (so that an unexpected name reads as written).
absl::StatusOr<Entries> ReadEntries(const std::vector<std::string>& files,
                                    const std::set<std::string>& expected, absl::string_view what,
                                    bool& unprefixed) {
  Entries entries;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(const common::SafetensorsHeader header, common::ReadSafetensorsHeader(file));
    for (const common::SafetensorsEntry& e : header.entries) {
      if (IsAttentionBuffer(e.name)) continue;
      std::string name = e.name;
      const std::string with_prefix = absl::StrCat(kPrefix, e.name);
      if (!expected.count(name) && expected.count(with_prefix)) {
        name = with_prefix;
        unprefixed = true;
      }
      auto [it, inserted] = entries.emplace(name, Entry{file, e.name, e.dtype, e.shape});
      if (!inserted) {
        return Invalid(what,
                       absl::StrCat("tensor ", name, " is given twice: as '", it->second.file_name,
                                    "' in ", it->second.file, " and as '", e.name, "' in ", file));
      }
    }
  }
  return entries;
}

bool SameValues(const common::Tensor& a, const common::Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.bytes().data(), b.bytes().data(), a.num_bytes()) == 0;
}

}  // namespace

absl::StatusOr<GptConfig> ParseHfGpt2Config(absl::string_view text, const std::string& source) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(source, "is not a JSON object");
  if (const Json* type = Field(j, "model_type");
      type != nullptr && !(type->is_string() && type->get<std::string>() == "gpt2")) {
    return Invalid(source, absl::StrCat("model_type is ", type->dump(),
                                        "; only GPT-2 folders (\"gpt2\") can be read"));
  }
  GptConfig c;
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

std::string HfGpt2ConfigJson(const GptConfig& c) {
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

bool IsHfFolder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !fs::exists(fs::path(dir) / kHfConfigFileName, ec)) {
    return false;
  }
  const fs::path index = fs::path(dir) / kCheckpointIndexFileName;
  if (!fs::exists(index, ec)) return true;
  // An index of pipetrain checkpoints names files whose metadata says so; any other index
  // (or one that cannot be read: the reader will say why) is Hugging Face's.
  absl::StatusOr<std::string> text = ReadText(index);
  if (!text.ok()) return true;
  const Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object() || j["weight_map"].empty() ||
      !j["weight_map"].begin()->is_string()) {
    return true;
  }
  const std::string first = j["weight_map"].begin()->get<std::string>();
  if (!InFolder(first)) return true;  // the reader refuses it, naming the entry
  return !ReadCheckpointInfo((fs::path(dir) / first).string()).ok();
}

absl::StatusOr<Checkpoint> LoadHfGpt2Folder(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / kHfConfigFileName;
  ASSIGN_OR_RETURN(const std::string config_text, ReadText(config_path));
  Checkpoint c;
  ASSIGN_OR_RETURN(c.config, ParseHfGpt2Config(config_text, config_path.string()));
  c.layer_begin = 0;
  c.layer_end = c.config.num_pipeline_layers();

  std::string what;  // the file errors name: model.safetensors or the index
  ASSIGN_OR_RETURN(const std::vector<std::string> files, WeightFiles(fs::path(dir), what));
  std::vector<ParamSpec> expected = CheckpointParams(c.config, c.layer_begin, c.layer_end);
  std::set<std::string> names;
  for (const ParamSpec& p : expected) names.insert(p.name);
  // Tied, lm_head.weight may be there too (a copy of wte); it is checked like the others.
  const bool tied = c.config.tie_embeddings;
  if (tied) names.insert(kOutputHeadName);
  bool unprefixed = false;
  ASSIGN_OR_RETURN(const Entries entries, ReadEntries(files, names, what, unprefixed));
  const bool head_present = entries.count(kOutputHeadName) > 0;
  if (tied && head_present) {
    std::vector<ParamSpec> head = LayerParams(c.config, c.config.n_layers + 1);
    expected.push_back(head.back());
  }
  std::vector<TensorDescription> described;
  for (const auto& [name, e] : entries) described.push_back({name, e.dtype, e.shape});
  RETURN_IF_ERROR(CheckTensorSet(
      expected, described,
      absl::StrCat(what, unprefixed ? " (names shown with the transformer. prefix)" : ""),
      kWeightDTypes));

  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(common::SafetensorsContents contents,
                     common::ReadSafetensorsFile(
                         file, [&](const std::string& name) { return !IsAttentionBuffer(name); }));
    for (common::NamedTensor& t : contents.tensors) {
      const std::string name = entries.count(t.name) ? t.name : absl::StrCat(kPrefix, t.name);
      ASSIGN_OR_RETURN(common::Tensor f32, ToF32(std::move(t.tensor)));
      c.params.emplace(name, std::move(f32));
    }
  }
  if (tied && head_present) {
    if (!SameValues(c.params.at(kOutputHeadName), c.params.at(kTokenEmbeddingName))) {
      return Invalid(
          what,
          absl::StrCat(kOutputHeadName, " ('", entries.at(kOutputHeadName).file_name,
                       "') differs from ", kTokenEmbeddingName, " ('",
                       entries.at(kTokenEmbeddingName).file_name, "') but ", config_path.string(),
                       " has tie_word_embeddings true (the default when "
                       "absent); set it to false for an untied head"));
    }
    c.params.erase(kOutputHeadName);
  }
  RETURN_IF_ERROR(ValidateParams(c.config, c.layer_begin, c.layer_end, c.params, what));
  return c;
}

absl::Status ExportHfGpt2Folder(const Checkpoint& checkpoint, const std::string& dir) {
  const GptConfig& config = checkpoint.config;
  if (checkpoint.layer_begin != 0 || checkpoint.layer_end != config.num_pipeline_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint holds pipeline layers [", checkpoint.layer_begin, ", ",
                     checkpoint.layer_end, ") of ", config.num_pipeline_layers(),
                     "; a Hugging Face folder needs the whole model"));
  }
  RETURN_IF_ERROR(
      ValidateParams(config, 0, config.num_pipeline_layers(), checkpoint.params, "the checkpoint"));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::vector<common::SafetensorsView> views;
  for (const ParamSpec& p : CheckpointParams(config, 0, config.num_pipeline_layers())) {
    views.push_back(common::ViewOf(p.name, checkpoint.params.at(p.name)));
  }
  RETURN_IF_ERROR(common::WriteSafetensorsFile((fs::path(dir) / kHfWeightsFileName).string(), views,
                                               {{"format", "pt"}}));
  return common::WriteFileAtomically((fs::path(dir) / kHfConfigFileName).string(),
                                     HfGpt2ConfigJson(config));
}

}  // namespace pipetrain::model
