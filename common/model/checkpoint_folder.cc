#include "common/model/checkpoint_folder.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/model/hf_gpt2.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {

namespace fs = std::filesystem;

std::string ChunkFileName(int stage, int chunk, int num_chunks) {
  if (num_chunks <= 1) return absl::StrCat("stage-", stage, ".safetensors");
  return absl::StrCat("stage-", stage, "-chunk-", chunk, ".safetensors");
}

absl::Status WriteCheckpointFolder(const std::string& dir, const std::vector<ChunkFile>& files,
                                   int num_chunks) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint folder ", dir, ": ", ec.message()));
  std::vector<std::string> paths;
  for (const ChunkFile& s : files) {
    const std::string path = (fs::path(dir) / ChunkFileName(s.stage, s.chunk, num_chunks)).string();
    RETURN_IF_ERROR(common::WriteFileAtomically(path, s.bytes));
    paths.push_back(path);
  }
  return model::WriteCheckpointIndex((fs::path(dir) / model::kCheckpointIndexFileName).string(),
                                     paths);
}

absl::StatusOr<model::Checkpoint> LoadWholeModel(const std::string& path, const std::string& field,
                                                 absl::string_view needed_by) {
  ASSIGN_OR_RETURN(model::Checkpoint c, LoadWholeCheckpoint(path, field));
  const int layers = c.config.num_pipeline_layers();
  if (c.layer_begin != 0 || c.layer_end != layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path, " holds pipeline layers [", c.layer_begin, ", ", c.layer_end, ") of ",
        layers, "; ", needed_by, " needs the whole model (give the job's checkpoint folder, "
        "not one stage's file)"));
  }
  return c;
}

absl::StatusOr<model::Checkpoint> LoadWholeCheckpoint(const std::string& path,
                                                      const std::string& field) {
  std::error_code ec;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  };
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec)) return bad(absl::StrCat("'", path, "' does not exist"));
    absl::StatusOr<model::Checkpoint> one = model::LoadCheckpoint(path);
    if (!one.ok()) return bad(std::string(one.status().message()));
    return one;
  }
  if (IsHfFolder(path)) {
    absl::StatusOr<model::Checkpoint> hf = LoadHfGpt2Folder(path);
    if (!hf.ok()) return bad(std::string(hf.status().message()));
    return hf;
  }
  const fs::path index = fs::path(path) / model::kCheckpointIndexFileName;
  std::ifstream in(index);
  if (!in) {
    return bad(absl::StrCat("'", path, "' has no ", model::kCheckpointIndexFileName, " and no ",
                            kHfConfigFileName,
                            "; give a checkpoint folder the coordinator wrote (its index is "
                            "written last, so a folder without one is incomplete), a Hugging "
                            "Face GPT-2 folder or one .safetensors file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object()) {
    return bad(absl::StrCat(index.string(), " is not a Hugging Face index (no weight_map)"));
  }
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      return bad(absl::StrCat(index.string(), ": weight_map['", name, "'] is not a string"));
    files.insert(file.get<std::string>());
  }
  std::vector<model::Checkpoint> parts;
  for (const std::string& f : files) {
    absl::StatusOr<model::Checkpoint> part = model::LoadCheckpoint((fs::path(path) / f).string());
    if (!part.ok()) return bad(std::string(part.status().message()));
    parts.push_back(*std::move(part));
  }
  absl::StatusOr<model::Checkpoint> whole = model::MergeCheckpoints(std::move(parts));
  if (!whole.ok()) return bad(absl::StrCat(path, ": ", whole.status().message()));
  return whole;
}

absl::StatusOr<Checkpoint> FitCheckpointToModel(Checkpoint whole, const GptConfig& model,
                                                absl::string_view source) {
  const GptConfig& file = whole.config;
  if (whole.layer_begin != 0 || whole.layer_end != file.num_pipeline_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": holds pipeline layers [", whole.layer_begin, ", ", whole.layer_end,
                     ") of ", file.num_pipeline_layers(), ", not the whole model"));
  }
  if (model.seq_len > file.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": model.seq_len is ", file.seq_len, " in the checkpoint but ", model.seq_len,
        " is expected (a job may use fewer positions than its checkpoint has, not more)"));
  }
  if (model.seq_len < file.seq_len) {
    // Positions are absolute and causal: position t never sees a later one, so the
    // first seq_len rows of wpe are the whole model for sequences of seq_len.
    auto cut = [&](ParamMap& map) -> absl::Status {
      auto it = map.find(kPositionEmbeddingName);
      if (it == map.end()) return absl::OkStatus();  // ConfigsMatch below names the problem
      const common::Tensor& wpe = it->second;
      ASSIGN_OR_RETURN(common::Tensor rows,
                       common::Tensor::Create(wpe.dtype(), {model.seq_len, wpe.shape()[1]}));
      std::memcpy(rows.bytes().data(), wpe.bytes().data(), rows.num_bytes());
      it->second = std::move(rows);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(cut(whole.params));
    if (whole.optimizer) {
      RETURN_IF_ERROR(cut(whole.optimizer->m));
      RETURN_IF_ERROR(cut(whole.optimizer->v));
    }
    whole.config.seq_len = model.seq_len;
  }
  RETURN_IF_ERROR(ConfigsMatch(whole.config, model, source));
  return whole;
}

absl::StatusOr<model::Checkpoint> SliceCheckpoint(const model::Checkpoint& whole, int begin,
                                                  int end) {
  if (begin < whole.layer_begin || end > whole.layer_end || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", begin, ", ", end,
                                                   ") are not inside the checkpoint's [",
                                                   whole.layer_begin, ", ", whole.layer_end, ")"));
  }
  model::Checkpoint part;
  part.config = whole.config;
  part.layer_begin = begin;
  part.layer_end = end;
  if (whole.optimizer) part.optimizer.emplace().step = whole.optimizer->step;
  for (const model::ParamSpec& p : model::CheckpointParams(whole.config, begin, end)) {
    auto take = [&](const model::ParamMap& from, model::ParamMap& to) -> absl::Status {
      auto it = from.find(p.name);
      // A tied copy cut away from its original starts as the original.
      if (it == from.end() && !p.tied_to.empty()) it = from.find(p.tied_to);
      if (it == from.end()) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint has no tensor '", p.name, "'"));
      }
      to.emplace(p.name, it->second.Clone());
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(take(whole.params, part.params));
    if (whole.optimizer) {
      RETURN_IF_ERROR(take(whole.optimizer->m, part.optimizer->m));
      RETURN_IF_ERROR(take(whole.optimizer->v, part.optimizer->v));
    }
  }
  return part;
}

}  // namespace pipetrain::model
