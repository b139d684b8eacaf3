#include "common/model/hf_folder.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/bf16.h"
#include "common/model/model_family.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

namespace fs = std::filesystem;
using common::DType;
using Json = nlohmann::json;

// The dtypes Hugging Face weights come in; F16 and BF16 are widened to F32 on reading.
constexpr DType kWeightDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

absl::Status Invalid(absl::string_view source, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

// config.json: bounded JSON, never a FIFO or device.
absl::StatusOr<std::string> ReadText(const fs::path& path) {
  return common::ReadRegularFile(path.string(), common::kMaxJsonFileBytes, "");
}

// The family config.json's model_type names; a file without one is GPT-2's.
absl::StatusOr<const ModelFamily*> FamilyOfHfConfig(absl::string_view text,
                                                    const std::string& source) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid(source, "is not a JSON object");
  auto it = j.find("model_type");
  if (it == j.end() || it->is_null()) return FindFamily(kDefaultFamily);
  const ModelFamily* family = it->is_string() ? FindFamily(it->get<std::string>()) : nullptr;
  if (family == nullptr) {
    return Invalid(source, absl::StrCat("model_type is ", it->dump(),
                                        "; the model types this build reads are: ",
                                        FamilyNames()));
  }
  return family;
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


absl::StatusOr<common::Tensor> ToF32(common::Tensor t) {
  if (t.dtype() == DType::kF32) return t;
  ASSIGN_OR_RETURN(common::Tensor out, common::Tensor::Create(DType::kF32, t.shape()));
  std::span<float> to = out.data<float>();
  std::span<const uint16_t> from = t.data<uint16_t>();
  for (size_t i = 0; i < from.size(); ++i) {
    to[i] = t.dtype() == DType::kF16 ? HalfToFloat(from[i]) : common::Bf16BitsToFloat(from[i]);
  }
  return out;
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
// `what` becomes the file errors name.
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
  return IndexShardFiles(dir.string());
}

// What a folder's tensors are read against: the parameters of the whole model, and
// whether some names were spelt otherwise in the files.
struct Reading {
  const ModelFamily* family = nullptr;
  std::set<std::string> names;  // every name the files may give
  std::string what;             // the file errors name
  bool renamed = false;
};

// Reads every entry's header, under our names (a tensor that is no parameter skipped).
absl::StatusOr<Entries> ReadEntries(const std::vector<std::string>& files, Reading& r) {
  Entries entries;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(const common::SafetensorsHeader header, common::ReadSafetensorsHeader(file));
    for (const common::SafetensorsEntry& e : header.entries) {
      std::optional<std::string> name = r.family->ParamOfHfTensor(e.name, r.names);
      if (!name) continue;
      r.renamed = r.renamed || *name != e.name;
      auto [it, inserted] = entries.emplace(*name, Entry{file, e.name, e.dtype, e.shape});
      if (!inserted) {
        return Invalid(r.what,
                       absl::StrCat("tensor ", *name, " is given twice: as '", it->second.file_name,
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

// Reads the tensors' values, under our names, as F32.
absl::Status ReadValues(const std::vector<std::string>& files, const Reading& r, ParamMap& out) {
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(common::SafetensorsContents contents,
                     common::ReadSafetensorsFile(file, [&](const std::string& name) {
                       return r.family->ParamOfHfTensor(name, r.names).has_value();
                     }));
    for (common::NamedTensor& t : contents.tensors) {
      const std::string name = *r.family->ParamOfHfTensor(t.name, r.names);
      ASSIGN_OR_RETURN(common::Tensor f32, ToF32(std::move(t.tensor)));
      out.emplace(name, std::move(f32));
    }
  }
  return absl::OkStatus();
}

// A tied head's copy found in the files must equal the original, and goes.
absl::Status DropTiedCopy(const TiedParams& tied, const Entries& entries,
                          const std::string& config_path, const Reading& r, ParamMap& params) {
  if (!SameValues(params.at(tied.head), params.at(tied.embedding))) {
    return Invalid(r.what,
                   absl::StrCat(tied.head, " ('", entries.at(tied.head).file_name,
                                "') differs from ", tied.embedding, " ('",
                                entries.at(tied.embedding).file_name, "') but ", config_path,
                                " has tie_word_embeddings true (the default when "
                                "absent); set it to false for an untied head"));
  }
  params.erase(tied.head);
  return absl::OkStatus();
}

// ---- out ---------------------------------------------------------------------------

// Each weight as the folder stores it: the checkpoint's own tensors in F32 (no copy),
// else rounded copies, which `rounded` keeps alive while the views are written.
absl::StatusOr<std::vector<common::SafetensorsView>> WeightViews(
    const Checkpoint& checkpoint, DType dtype, std::vector<common::Tensor>& rounded) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights cannot be exported as ", common::DTypeName(dtype)));
  }
  const std::vector<ParamSpec> params =
      CheckpointParams(checkpoint.config, 0, checkpoint.config.num_pipeline_layers());
  rounded.reserve(params.size());
  std::vector<common::SafetensorsView> views;
  for (const ParamSpec& p : params) {
    const common::Tensor& weight = checkpoint.params.at(p.name);
    if (dtype == DType::kF32) {
      views.push_back(common::ViewOf(p.name, weight));
      continue;
    }
    ASSIGN_OR_RETURN(common::Tensor bf16, common::Tensor::Create(DType::kBF16, weight.shape()));
    std::span<const float> from = weight.data<float>();
    std::span<uint16_t> to = bf16.data<uint16_t>();
    for (size_t i = 0; i < from.size(); ++i) to[i] = common::FloatToBf16Bits(from[i]);
    views.push_back(common::ViewOf(p.name, rounded.emplace_back(std::move(bf16))));
  }
  return views;
}

// The family's config.json with torch_dtype saying what the weights are in.
absl::StatusOr<std::string> WithTorchDType(const std::string& config_json,
                                           absl::string_view torch_dtype) {
  auto j = nlohmann::ordered_json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError("the model family's config.json is not a JSON object");
  }
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace

const std::vector<HfWeightsDType>& HfWeightsDTypes() {
  static const auto* table = new std::vector<HfWeightsDType>{
      {"fp32", DType::kF32, "float32"},
      {"bf16", DType::kBF16, "bfloat16"},
  };
  return *table;
}

absl::StatusOr<HfWeightsDType> HfWeightsDTypeNamed(absl::string_view name) {
  std::vector<absl::string_view> names;
  for (const HfWeightsDType& d : HfWeightsDTypes()) {
    if (d.name == name) return d;
    names.push_back(d.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'; accepted: ",
                                                 absl::StrJoin(names, ", ")));
}

bool IsHfFolder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !fs::exists(fs::path(dir) / kHfConfigFileName, ec)) {
    return false;
  }
  if (!fs::exists(fs::path(dir) / kCheckpointIndexFileName, ec)) return true;
  // An index of pipetrain checkpoints names files whose metadata says so; any other index
  // (or one that cannot be read: the reader will say why) is Hugging Face's.
  absl::StatusOr<std::vector<std::string>> files = IndexShardFiles(dir);
  return !files.ok() || !ReadCheckpointInfo(files->front()).ok();
}

absl::StatusOr<Checkpoint> LoadHfFolder(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / kHfConfigFileName;
  ASSIGN_OR_RETURN(const std::string config_text, ReadText(config_path));
  Reading r;
  ASSIGN_OR_RETURN(r.family, FamilyOfHfConfig(config_text, config_path.string()));
  Checkpoint c;
  ASSIGN_OR_RETURN(c.config, r.family->ParseHfConfig(config_text, config_path.string()));
  c.layer_begin = 0;
  c.layer_end = c.config.num_pipeline_layers();

  ASSIGN_OR_RETURN(const std::vector<std::string> files, WeightFiles(fs::path(dir), r.what));
  std::vector<ParamSpec> expected = CheckpointParams(c.config, c.layer_begin, c.layer_end);
  for (const ParamSpec& p : expected) r.names.insert(p.name);
  // Tied, the head's copy may be there too; it is checked like the others.
  const std::optional<TiedParams> tied = TiedParamsOf(c.config);
  if (tied) r.names.insert(tied->head);
  ASSIGN_OR_RETURN(const Entries entries, ReadEntries(files, r));
  const bool copy_present = tied && entries.count(tied->head) > 0;
  if (copy_present) {
    for (ParamSpec& p : LayerParams(c.config, c.layer_end - 1)) {
      if (p.name == tied->head) expected.push_back(std::move(p));
    }
  }
  std::vector<TensorDescription> described;
  for (const auto& [name, e] : entries) described.push_back({name, e.dtype, e.shape});
  RETURN_IF_ERROR(CheckTensorSet(
      expected, described,
      absl::StrCat(r.what, r.renamed ? absl::StrCat(" (", r.family->hf_renamed_note(), ")") : ""),
      kWeightDTypes));
  RETURN_IF_ERROR(ReadValues(files, r, c.params));
  if (copy_present) {
    RETURN_IF_ERROR(DropTiedCopy(*tied, entries, config_path.string(), r, c.params));
  }
  RETURN_IF_ERROR(ValidateParams(c.config, c.layer_begin, c.layer_end, c.params, r.what));
  return c;
}

absl::Status ExportHfFolder(const Checkpoint& checkpoint, const std::string& dir,
                            const HfWeightsDType& weights) {
  const TransformerConfig& config = checkpoint.config;
  if (checkpoint.layer_begin != 0 || checkpoint.layer_end != config.num_pipeline_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint holds pipeline layers [", checkpoint.layer_begin, ", ",
                     checkpoint.layer_end, ") of ", config.num_pipeline_layers(),
                     "; a Hugging Face folder needs the whole model"));
  }
  RETURN_IF_ERROR(
      ValidateParams(config, 0, config.num_pipeline_layers(), checkpoint.params, "the checkpoint"));
  std::vector<common::Tensor> rounded;
  ASSIGN_OR_RETURN(const std::vector<common::SafetensorsView> views,
                   WeightViews(checkpoint, weights.dtype, rounded));
  ASSIGN_OR_RETURN(const std::string config_json,
                   WithTorchDType(FamilyOf(config).HfConfigJson(config), weights.torch_dtype));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  RETURN_IF_ERROR(common::WriteSafetensorsFile((fs::path(dir) / kHfWeightsFileName).string(), views,
                                               {{"format", "pt"}}));
  return common::WriteFileAtomically((fs::path(dir) / kHfConfigFileName).string(), config_json);
}

}  // namespace pipetrain::model
