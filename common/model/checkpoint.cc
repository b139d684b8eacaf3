#include "common/model/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "common/model/precision.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

using common::DType;
using common::SafetensorsMetadata;

constexpr char kKeyFormat[] = "format";
constexpr char kKeyFormatVersion[] = "pipetrain_format";
constexpr char kKeyLayers[] = "pipetrain_layers";
constexpr char kKeyOptimizerStep[] = "pipetrain_optimizer_step";
constexpr char kKeyPrecision[] = "pipetrain_precision";
constexpr char kKeyTieEmbeddings[] = "tie_embeddings";  // "true", or absent
// The architecture and its own fields, as a ModelConfig in protobuf's JSON; absent for
// GPT-2 (every file written before a second family existed).
constexpr char kKeyModel[] = "pipetrain_model";
// How many names an error lists per kind of problem before it summarises.
constexpr size_t kMaxNamesListed = 8;

using Described = TensorDescription;

std::string RangeString(int begin, int end) { return absl::StrCat("[", begin, ", ", end, ")"); }

std::string ListNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kMaxNamesListed));
  std::string out = absl::StrJoin(shown, ", ");
  if (names.size() > kMaxNamesListed) {
    absl::StrAppend(&out, " and ", names.size() - kMaxNamesListed, " more");
  }
  return out;
}

// "F32", "F32 or F16", "F32, F16 or BF16".
std::string DTypeNames(std::span<const DType> dtypes) {
  std::string out;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i > 0) absl::StrAppend(&out, i + 1 == dtypes.size() ? " or " : ", ");
    absl::StrAppend(&out, common::SafetensorsDTypeName(dtypes[i]));
  }
  return out;
}

// Every tensor a checkpoint of this range holds, in file order.
std::vector<ParamSpec> ExpectedTensors(const TransformerConfig& config, int begin, int end,
                                       bool with_optimizer) {
  std::vector<ParamSpec> params = CheckpointParams(config, begin, end);
  if (!with_optimizer) return params;
  std::vector<ParamSpec> all = params;
  for (const char* prefix : {kOptimizerFirstMomentPrefix, kOptimizerSecondMomentPrefix}) {
    for (const ParamSpec& p : params) {
      all.push_back({absl::StrCat(prefix, p.name), p.shape, p.is_matrix});
    }
  }
  return all;
}

std::vector<Described> Describe(const ParamMap& tensors, absl::string_view prefix = "") {
  std::vector<Described> out;
  for (const auto& [name, t] : tensors) {
    out.push_back({absl::StrCat(prefix, name), t.dtype(), t.shape()});
  }
  return out;
}

absl::Status CheckRange(const TransformerConfig& config, int begin, int end,
                        absl::string_view what) {
  if (begin < 0 || begin >= end || end > config.num_pipeline_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": pipeline layers ", RangeString(begin, end), " are not a range within [0, ",
        config.num_pipeline_layers(), ") (the model's ", config.n_layers, " blocks + 2)"));
  }
  return absl::OkStatus();
}

// `name` is a row of the precision table ("" is not: a file says which it means).
absl::Status CheckPrecision(absl::string_view name, absl::string_view what) {
  if (!name.empty() && PrecisionNamed(name).ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " is \"", name,
                                                 "\", not a precision (accepted: ",
                                                 PrecisionNames(), ")"));
}

std::string What(absl::string_view source, int begin, int end) {
  return absl::StrCat(source, ": checkpoint of pipeline layers ", RangeString(begin, end));
}

absl::Status ValidateCheckpoint(const Checkpoint& c, absl::string_view source) {
  if (absl::Status s = ValidateConfig(c.config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  RETURN_IF_ERROR(CheckRange(c.config, c.layer_begin, c.layer_end, source));
  RETURN_IF_ERROR(CheckPrecision(c.precision, absl::StrCat(source, ": precision")));
  std::vector<Described> all = Describe(c.params);
  if (c.optimizer) {
    if (c.optimizer->step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": optimizer step is negative (", c.optimizer->step, ")"));
    }
    for (Described& d : Describe(c.optimizer->m, kOptimizerFirstMomentPrefix)) {
      all.push_back(std::move(d));
    }
    for (Described& d : Describe(c.optimizer->v, kOptimizerSecondMomentPrefix)) {
      all.push_back(std::move(d));
    }
  }
  return CheckTensorSet(
      ExpectedTensors(c.config, c.layer_begin, c.layer_end, c.optimizer.has_value()), all,
      What(source, c.layer_begin, c.layer_end));
}

absl::StatusOr<int64_t> ParseInt(const SafetensorsMetadata& metadata, const std::string& key,
                                 absl::string_view source) {
  auto it = metadata.find(key);
  if (it == metadata.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": __metadata__ has no '", key, "' (not a pipetrain checkpoint?)"));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": __metadata__ '", key, "' is \"", it->second, "\", not an integer"));
  }
  return value;
}

absl::StatusOr<int> ParseConfigField(const SafetensorsMetadata& metadata, const std::string& key,
                                     absl::string_view source) {
  ASSIGN_OR_RETURN(const int64_t value, ParseInt(metadata, key, source));
  if (value <= 0 || value > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": __metadata__ '", key, "' = ", value, " is out of range"));
  }
  return static_cast<int>(value);
}

// The architecture and its fields of a file's kKeyModel entry, into config.
absl::Status ParseFamilyFields(const std::string& json, TransformerConfig& config,
                               absl::string_view source) {
  pipetrain::v1::ModelConfig proto;
  if (auto s = google::protobuf::util::JsonStringToMessage(json, &proto); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": __metadata__ '", kKeyModel,
                                                   "' is not a model config: ",
                                                   std::string(s.message())));
  }
  if (absl::Status s = FamilyFieldsFromProto(proto, config); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": __metadata__ '", kKeyModel, "': ", s.message()));
  }
  return absl::OkStatus();
}

// The config, range and optimizer flag a file's metadata declares.
absl::StatusOr<CheckpointInfo> ParseInfo(const SafetensorsMetadata& metadata,
                                         absl::string_view source) {
  if (metadata.count(kKeyFormatVersion)) {
    ASSIGN_OR_RETURN(const int64_t version, ParseInt(metadata, kKeyFormatVersion, source));
    if (version < 1 || version > kCheckpointFormatVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": checkpoint format version ", version,
                       " is not supported (this build reads 1..", kCheckpointFormatVersion, ")"));
    }
  }
  CheckpointInfo info;
  ASSIGN_OR_RETURN(info.config.vocab_size, ParseConfigField(metadata, "vocab_size", source));
  ASSIGN_OR_RETURN(info.config.seq_len, ParseConfigField(metadata, "seq_len", source));
  ASSIGN_OR_RETURN(info.config.d_model, ParseConfigField(metadata, "d_model", source));
  ASSIGN_OR_RETURN(info.config.n_heads, ParseConfigField(metadata, "n_heads", source));
  ASSIGN_OR_RETURN(info.config.n_layers, ParseConfigField(metadata, "n_layers", source));
  if (auto it = metadata.find(kKeyTieEmbeddings); it != metadata.end()) {
    if (it->second != "true" && it->second != "false") {
      return absl::InvalidArgumentError(absl::StrCat(source, ": __metadata__ '", kKeyTieEmbeddings,
                                                     "' is \"", it->second,
                                                     "\", not \"true\" or \"false\""));
    }
    info.config.tie_embeddings = it->second == "true";
  }
  if (auto it = metadata.find(kKeyModel); it != metadata.end()) {
    RETURN_IF_ERROR(ParseFamilyFields(it->second, info.config, source));
  }
  if (absl::Status s = ValidateConfig(info.config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": __metadata__: ", s.message()));
  }
  info.layer_begin = 0;
  info.layer_end = info.config.num_pipeline_layers();
  if (auto it = metadata.find(kKeyLayers); it != metadata.end()) {
    std::vector<std::string> parts = absl::StrSplit(it->second, ':');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &info.layer_begin) ||
        !absl::SimpleAtoi(parts[1], &info.layer_end)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": __metadata__ '", kKeyLayers, "' is \"", it->second, "\", not \"begin:end\""));
    }
    RETURN_IF_ERROR(CheckRange(info.config, info.layer_begin, info.layer_end,
                               absl::StrCat(source, ": __metadata__ '", kKeyLayers, "'")));
  }
  if (auto it = metadata.find(kKeyPrecision); it != metadata.end()) {
    RETURN_IF_ERROR(
        CheckPrecision(it->second, absl::StrCat(source, ": __metadata__ '", kKeyPrecision, "'")));
    info.precision = it->second;
  }
  if (metadata.count(kKeyOptimizerStep)) {
    info.has_optimizer = true;
    ASSIGN_OR_RETURN(info.optimizer_step, ParseInt(metadata, kKeyOptimizerStep, source));
    if (info.optimizer_step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": __metadata__ '", kKeyOptimizerStep, "' is negative"));
    }
  }
  return info;
}

bool HasPrefix(const std::string& s, absl::string_view prefix) {
  return s.size() >= prefix.size() && absl::string_view(s).substr(0, prefix.size()) == prefix;
}

// Builds a checkpoint from loaded tensors, which must be exactly those the range and
// optimizer flag of `info` imply within [begin, end).
absl::StatusOr<Checkpoint> Assemble(const CheckpointInfo& info, int begin, int end,
                                    common::SafetensorsContents contents,
                                    absl::string_view source) {
  std::vector<Described> described;
  for (const common::NamedTensor& t : contents.tensors) {
    described.push_back({t.name, t.tensor.dtype(), t.tensor.shape()});
  }
  RETURN_IF_ERROR(CheckTensorSet(ExpectedTensors(info.config, begin, end, info.has_optimizer),
                                 described, What(source, begin, end)));
  Checkpoint c;
  c.config = info.config;
  c.layer_begin = begin;
  c.layer_end = end;
  c.precision = info.precision;
  if (info.has_optimizer) c.optimizer.emplace().step = info.optimizer_step;
  for (common::NamedTensor& t : contents.tensors) {
    if (info.has_optimizer && HasPrefix(t.name, kOptimizerFirstMomentPrefix)) {
      c.optimizer->m.emplace(t.name.substr(strlen(kOptimizerFirstMomentPrefix)),
                             std::move(t.tensor));
    } else if (info.has_optimizer && HasPrefix(t.name, kOptimizerSecondMomentPrefix)) {
      c.optimizer->v.emplace(t.name.substr(strlen(kOptimizerSecondMomentPrefix)),
                             std::move(t.tensor));
    } else {
      c.params.emplace(std::move(t.name), std::move(t.tensor));
    }
  }
  return c;
}

absl::StatusOr<Checkpoint> FromContents(common::SafetensorsContents contents,
                                        absl::string_view source) {
  ASSIGN_OR_RETURN(const CheckpointInfo info, ParseInfo(contents.metadata, source));
  return Assemble(info, info.layer_begin, info.layer_end, std::move(contents), source);
}

// The views to write, in file order; the checkpoint must have been validated.
std::vector<common::SafetensorsView> Views(const Checkpoint& c) {
  std::vector<common::SafetensorsView> views;
  const std::vector<ParamSpec> specs = CheckpointParams(c.config, c.layer_begin, c.layer_end);
  for (const ParamSpec& p : specs) views.push_back(common::ViewOf(p.name, c.params.at(p.name)));
  if (c.optimizer) {
    for (const ParamSpec& p : specs) {
      views.push_back(common::ViewOf(absl::StrCat(kOptimizerFirstMomentPrefix, p.name),
                                     c.optimizer->m.at(p.name)));
    }
    for (const ParamSpec& p : specs) {
      views.push_back(common::ViewOf(absl::StrCat(kOptimizerSecondMomentPrefix, p.name),
                                     c.optimizer->v.at(p.name)));
    }
  }
  return views;
}

bool SameValues(const common::Tensor& a, const common::Tensor& b) {
  return a.shape() == b.shape() && a.num_bytes() == b.num_bytes() &&
         std::memcmp(a.bytes().data(), b.bytes().data(), a.num_bytes()) == 0;
}

// After a merge: a tied copy whose original is now in the range goes, once it is
// checked to equal the original (its moments too), since the two must never drift.
absl::Status DropJoinedCopies(Checkpoint& merged) {
  for (const ParamSpec& p : RangeParams(merged.config, merged.layer_begin, merged.layer_end)) {
    if (p.tied_to.empty() || !merged.params.count(p.name) || !merged.params.count(p.tied_to)) {
      continue;
    }
    std::vector<std::pair<ParamMap*, const char*>> maps = {{&merged.params, "values"}};
    if (merged.optimizer) {
      maps.push_back({&merged.optimizer->m, "AdamW first moments"});
      maps.push_back({&merged.optimizer->v, "AdamW second moments"});
    }
    for (auto [map, what] : maps) {
      if (!SameValues(map->at(p.name), map->at(p.tied_to))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "merge: the tied ", p.name, " differs from ", p.tied_to, " in its ", what,
            " (model.tie_embeddings: the copies must be equal)"));
      }
      map->erase(p.name);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTensorSet(const std::vector<ParamSpec>& expected,
                            const std::vector<TensorDescription>& actual, absl::string_view what,
                            std::span<const DType> dtypes) {
  std::map<std::string, const Described*> by_name;
  for (const Described& d : actual) by_name[d.name] = &d;
  std::set<std::string> expected_names;
  std::vector<std::string> missing, unexpected, wrong;
  for (const ParamSpec& spec : expected) {
    expected_names.insert(spec.name);
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      missing.push_back(spec.name);
      continue;
    }
    const Described& d = *it->second;
    if (std::find(dtypes.begin(), dtypes.end(), d.dtype) == dtypes.end()) {
      wrong.push_back(absl::StrCat(spec.name, " has dtype ", common::SafetensorsDTypeName(d.dtype),
                                   ", want ", DTypeNames(dtypes)));
    } else if (d.shape != spec.shape) {
      wrong.push_back(absl::StrCat(spec.name, " has shape ", common::ShapeString(d.shape),
                                   ", want ", common::ShapeString(spec.shape)));
    }
  }
  for (const Described& d : actual) {
    if (!expected_names.count(d.name)) unexpected.push_back(d.name);
  }
  if (missing.empty() && unexpected.empty() && wrong.empty()) return absl::OkStatus();
  std::vector<std::string> problems;
  if (!missing.empty()) {
    problems.push_back(
        absl::StrCat("missing ", missing.size(), " tensor(s): ", ListNames(missing)));
  }
  if (!unexpected.empty()) {
    problems.push_back(
        absl::StrCat(unexpected.size(), " unexpected tensor(s): ", ListNames(unexpected)));
  }
  if (!wrong.empty()) problems.push_back(ListNames(wrong));
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", absl::StrJoin(problems, "; ")));
}

absl::Status ConfigsMatch(const TransformerConfig& file, const TransformerConfig& want,
                          absl::string_view source) {
  for (auto [a, b, field] : {std::tuple{file.vocab_size, want.vocab_size, "vocab_size"},
                             {file.seq_len, want.seq_len, "seq_len"},
                             {file.d_model, want.d_model, "d_model"},
                             {file.n_heads, want.n_heads, "n_heads"},
                             {file.n_layers, want.n_layers, "n_layers"}}) {
    if (a != b) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": model.", field, " is ", a,
                                                     " in the checkpoint but ", b, " is expected"));
    }
  }
  if (file.tie_embeddings != want.tie_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": model.tie_embeddings is ", file.tie_embeddings ? "true" : "false",
        " in the checkpoint but ", want.tie_embeddings ? "true" : "false", " is expected"));
  }
  if (file.family != want.family) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": model.architecture is ",
                                                   file.family, " in the checkpoint but ",
                                                   want.family, " is expected"));
  }
  for (auto [a, b, field] : {std::tuple{file.n_kv_heads, want.n_kv_heads, "n_kv_heads"},
                             {file.ffn_dim, want.ffn_dim, "ffn_dim"}}) {
    if (a != b) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": model.", field, " is ", a,
                                                     " in the checkpoint but ", b, " is expected"));
    }
  }
  for (auto [a, b, field] : {std::tuple{file.rope_theta, want.rope_theta, "rope_theta"},
                             {file.norm_eps, want.norm_eps, "norm_eps"}}) {
    if (a != b) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": model.", field, " is ", a,
                                                     " in the checkpoint but ", b, " is expected"));
    }
  }
  if (file.rope_scaling != want.rope_scaling) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": model.rope_scaling differs between the checkpoint and the job (factor ",
        file.rope_scaling.factor, " against ", want.rope_scaling.factor, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateParams(const TransformerConfig& config, int begin, int end,
                            const ParamMap& params, absl::string_view what) {
  RETURN_IF_ERROR(CheckRange(config, begin, end, what));
  return CheckTensorSet(CheckpointParams(config, begin, end), Describe(params), what);
}

std::map<std::string, std::string> CheckpointMetadata(const Checkpoint& c) {
  std::map<std::string, std::string> m = {
      {kKeyFormat, "pt"},
      {kKeyFormatVersion, absl::StrCat(kCheckpointFormatVersion)},
      {"vocab_size", absl::StrCat(c.config.vocab_size)},
      {"seq_len", absl::StrCat(c.config.seq_len)},
      {"d_model", absl::StrCat(c.config.d_model)},
      {"n_heads", absl::StrCat(c.config.n_heads)},
      {"n_layers", absl::StrCat(c.config.n_layers)},
      {kKeyLayers, absl::StrCat(c.layer_begin, ":", c.layer_end)},
      {kKeyPrecision, c.precision},
  };
  if (c.optimizer) m[kKeyOptimizerStep] = absl::StrCat(c.optimizer->step);
  if (c.config.tie_embeddings) m[kKeyTieEmbeddings] = "true";
  if (c.config.family != kDefaultFamily) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    std::string json;
    // A ModelConfig always prints.
    (void)google::protobuf::util::MessageToJsonString(ConfigToProto(c.config), &json, options);
    m[kKeyModel] = json;
  }
  return m;
}

absl::Status SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  RETURN_IF_ERROR(ValidateCheckpoint(checkpoint, path));
  return common::WriteSafetensorsFile(path, Views(checkpoint), CheckpointMetadata(checkpoint));
}

absl::StatusOr<std::string> SerializeCheckpoint(const Checkpoint& checkpoint) {
  RETURN_IF_ERROR(ValidateCheckpoint(checkpoint, "checkpoint"));
  return common::SerializeSafetensors(Views(checkpoint), CheckpointMetadata(checkpoint));
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(common::SafetensorsContents contents, common::ReadSafetensorsFile(path));
  return FromContents(std::move(contents), path);
}

absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view bytes, const std::string& source) {
  ASSIGN_OR_RETURN(common::SafetensorsContents contents, common::ParseSafetensors(bytes, source));
  return FromContents(std::move(contents), source);
}

absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& path) {
  ASSIGN_OR_RETURN(const common::SafetensorsHeader header, common::ReadSafetensorsHeader(path));
  ASSIGN_OR_RETURN(CheckpointInfo info, ParseInfo(header.metadata, path));
  std::vector<Described> described;
  for (const common::SafetensorsEntry& e : header.entries) {
    described.push_back({e.name, e.dtype, e.shape});
    info.tensor_bytes += e.end - e.begin;
  }
  RETURN_IF_ERROR(CheckTensorSet(
      ExpectedTensors(info.config, info.layer_begin, info.layer_end, info.has_optimizer), described,
      What(path, info.layer_begin, info.layer_end)));
  return info;
}

absl::StatusOr<std::string> WithPrecision(std::string bytes, absl::string_view precision,
                                          const std::string& source) {
  RETURN_IF_ERROR(CheckPrecision(precision, absl::StrCat(source, ": precision")));
  ASSIGN_OR_RETURN(common::SafetensorsHeader header,
                   common::ParseSafetensorsHeader(bytes, source));
  ASSIGN_OR_RETURN(const CheckpointInfo info, ParseInfo(header.metadata, source));
  if (info.precision == precision) return bytes;
  header.metadata[kKeyPrecision] = std::string(precision);
  // Entries are in data order, so the views lay the data out as it was.
  const auto* data = reinterpret_cast<const std::byte*>(bytes.data()) + header.data_offset;
  std::vector<common::SafetensorsView> views;
  for (common::SafetensorsEntry& e : header.entries) {
    views.push_back({std::move(e.name), e.dtype, std::move(e.shape),
                     std::span<const std::byte>(data + e.begin, e.end - e.begin)});
  }
  return common::SerializeSafetensors(views, header.metadata);
}

absl::StatusOr<Checkpoint> MergeCheckpoints(std::vector<Checkpoint> parts) {
  if (parts.empty()) return absl::InvalidArgumentError("merge: no checkpoints given");
  for (size_t i = 0; i < parts.size(); ++i) {
    RETURN_IF_ERROR(ValidateCheckpoint(parts[i], absl::StrCat("merge: part ", i)));
  }
  std::sort(parts.begin(), parts.end(),
            [](const Checkpoint& a, const Checkpoint& b) { return a.layer_begin < b.layer_begin; });
  Checkpoint merged;
  merged.config = parts[0].config;
  merged.layer_begin = parts[0].layer_begin;
  merged.layer_end = parts[0].layer_begin;
  merged.precision = parts[0].precision;
  if (parts[0].optimizer) merged.optimizer.emplace().step = parts[0].optimizer->step;
  for (Checkpoint& part : parts) {
    const std::string range = RangeString(part.layer_begin, part.layer_end);
    RETURN_IF_ERROR(
        ConfigsMatch(part.config, merged.config, absl::StrCat("merge: part with layers ", range)));
    if (part.precision != merged.precision) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge: part with layers ", range, " was trained in ", part.precision,
                       ", the part with layers ", RangeString(parts[0].layer_begin,
                                                              parts[0].layer_end),
                       " in ", merged.precision));
    }
    if (part.layer_begin != merged.layer_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge: part with layers ", range,
                       part.layer_begin < merged.layer_end ? " overlaps " : " leaves a gap after ",
                       "layers ", RangeString(merged.layer_begin, merged.layer_end)));
    }
    if (part.optimizer.has_value() != merged.optimizer.has_value() ||
        (part.optimizer && part.optimizer->step != merged.optimizer->step)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "merge: part with layers ", range,
          " disagrees with the others on the optimizer state (present, and at which step)"));
    }
    merged.layer_end = part.layer_end;
    // Disjoint ranges have disjoint names (names carry global layer indices).
    merged.params.merge(part.params);
    if (part.optimizer) {
      merged.optimizer->m.merge(part.optimizer->m);
      merged.optimizer->v.merge(part.optimizer->v);
    }
  }
  RETURN_IF_ERROR(DropJoinedCopies(merged));
  RETURN_IF_ERROR(ValidateCheckpoint(merged, "merge: result"));
  return merged;
}

absl::Status WriteCheckpointIndex(const std::string& index_path,
                                  const std::vector<std::string>& shard_paths) {
  namespace fs = std::filesystem;
  if (shard_paths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": no shard files given"));
  }
  std::error_code ec;
  const fs::path folder = fs::absolute(fs::path(index_path), ec).parent_path();
  if (ec) return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", ec.message()));
  nlohmann::json weight_map = nlohmann::json::object();
  std::map<std::string, std::string> owner;  // tensor name -> shard path, for errors
  uint64_t total_size = 0;
  std::optional<TransformerConfig> config;
  for (const std::string& shard : shard_paths) {
    ASSIGN_OR_RETURN(const CheckpointInfo info, ReadCheckpointInfo(shard));
    if (config) {
      RETURN_IF_ERROR(ConfigsMatch(info.config, *config, shard));
    } else {
      config = info.config;
    }
    ASSIGN_OR_RETURN(const common::SafetensorsHeader header, common::ReadSafetensorsHeader(shard));
    const fs::path absolute = fs::absolute(fs::path(shard), ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat(shard, ": ", ec.message()));
    const std::string relative =
        absolute.lexically_normal().lexically_relative(folder.lexically_normal()).string();
    for (const common::SafetensorsEntry& e : header.entries) {
      auto [it, inserted] = owner.emplace(e.name, shard);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": tensor '", e.name, "' is in both ", it->second, " and ", shard));
      }
      weight_map[e.name] = relative;
      total_size += e.end - e.begin;
    }
  }
  nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                          {"weight_map", std::move(weight_map)}};
  return common::WriteFileAtomically(index_path, index.dump(2) + "\n");
}

absl::StatusOr<std::vector<std::string>> IndexShardFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string index = (fs::path(dir) / kCheckpointIndexFileName).string();
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(index, ": ", what));
  };
  ASSIGN_OR_RETURN(const std::string text,
                   common::ReadRegularFile(index, common::kMaxJsonFileBytes, "checkpoint index"));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object()) {
    return bad("is not a Hugging Face index (no weight_map object)");
  }
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    const std::string f = file.is_string() ? file.get<std::string>() : "";
    if (f.empty() || f == "." || f == ".." || absl::StrContains(f, '/')) {
      return bad(absl::StrCat("weight_map['", name, "'] is ",
                              file.is_string() ? absl::StrCat("'", f, "'") : file.dump(),
                              ", not the name of a file in ", dir));
    }
    files.insert(f);
  }
  if (files.empty()) return bad("weight_map names no files");
  std::vector<std::string> paths;
  for (const std::string& f : files) paths.push_back((fs::path(dir) / f).string());
  return paths;
}

}  // namespace pipetrain::model
