#include "common/model/checkpoint_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/error_context.h"
#include "common/model/hf_folder.h"
#include "common/status_macros.h"
#include "common/user_path.h"

namespace pipetrain::model {

namespace fs = std::filesystem;

std::string ChunkFileName(int stage, int chunk, int num_chunks) {
  if (num_chunks <= 1) return absl::StrCat("stage-", stage, ".safetensors");
  return absl::StrCat("stage-", stage, "-chunk-", chunk, ".safetensors");
}

namespace {

// The infix that marks a folder as not (yet) a checkpoint.
constexpr absl::string_view kTemporaryInfix = ".tmp-";

absl::Status FolderError(int error, const std::string& dir, absl::string_view what) {
  return absl::ErrnoToStatus(error, absl::StrCat("checkpoint folder ", dir, ": ", what));
}

// What an error about file `name` of the folder being written says first.
common::ErrorContext InFolder(const std::string& dir, absl::string_view name) {
  return common::ErrorContext(absl::StrCat("checkpoint folder ", dir, ": ", name));
}

// Creates an empty "TARGET.tmp-XXXXXX" next to `target` (same parent, so renames stay
// on one file system).
absl::StatusOr<std::string> MakeSiblingFolder(const std::string& target) {
  std::string name = absl::StrCat(target, kTemporaryInfix, "XXXXXX");
  if (mkdtemp(name.data()) == nullptr) {
    return FolderError(errno, target, absl::StrCat("cannot create a temporary folder ", name));
  }
  // mkdtemp makes it 0700; a checkpoint is ordinary data that others may read.
  chmod(name.c_str(), 0755);
  return name;
}

absl::Status SyncFolder(const std::string& dir, const std::string& folder) {
  const int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FolderError(errno, dir, absl::StrCat("cannot open ", folder));
  const int rc = fsync(fd);
  const int error = errno;
  close(fd);
  if (rc != 0) return FolderError(error, dir, absl::StrCat("cannot fsync ", folder));
  return absl::OkStatus();
}

// Fills `folder` with the chunk files and the index; every file is fsynced (and the
// folder with it) by WriteFileAtomically.
absl::Status FillFolder(const std::string& dir, const std::string& folder,
                        const std::vector<ChunkFile>& files, int num_chunks) {
  std::vector<std::string> paths;
  for (const ChunkFile& s : files) {
    const std::string name = ChunkFileName(s.stage, s.chunk, num_chunks);
    const std::string path = (fs::path(folder) / name).string();
    RETURN_IF_ERROR(InFolder(dir, name).Wrap(common::WriteFileAtomically(path, s.bytes)));
    paths.push_back(path);
  }
  return InFolder(dir, model::kCheckpointIndexFileName)
      .Wrap(model::WriteCheckpointIndex(
          (fs::path(folder) / model::kCheckpointIndexFileName).string(), paths));
}

// Puts the finished `folder` in place of `target`, an older `target` renamed away
// first (rename cannot replace a folder that has files) and removed after.
absl::Status ReplaceFolder(const std::string& dir, const std::string& folder,
                           const std::string& target) {
  std::error_code ec;
  std::string old;
  if (fs::exists(target, ec)) {
    ASSIGN_OR_RETURN(old, MakeSiblingFolder(target));
    // rename(2) may replace an empty folder, which `old` is.
    if (rename(target.c_str(), old.c_str()) != 0) {
      const int error = errno;
      rmdir(old.c_str());
      return FolderError(error, dir, absl::StrCat("cannot move the older folder to ", old));
    }
  }
  if (rename(folder.c_str(), target.c_str()) != 0) {
    const int error = errno;
    if (!old.empty()) rename(old.c_str(), target.c_str());  // put the older one back
    return FolderError(error, dir, absl::StrCat("cannot rename ", folder, " to ", target));
  }
  const std::string parent = fs::path(target).parent_path().string();
  absl::Status synced = SyncFolder(dir, parent.empty() ? "." : parent);
  // The new folder is in place whatever the fsync said; the older one goes either way.
  if (!old.empty()) fs::remove_all(old, ec);
  return synced;
}

// The first `rows` rows of tensor `name` of `map`, in place of the whole; a tensor
// that is not there is left for the config check after it to name.
absl::Status KeepFirstRows(ParamMap& map, const std::string& name, int64_t rows) {
  auto it = map.find(name);
  if (it == map.end()) return absl::OkStatus();
  const common::Tensor& all = it->second;
  std::vector<int64_t> shape = all.shape();
  if (shape.empty() || shape[0] < rows) return absl::OkStatus();
  shape[0] = rows;
  ASSIGN_OR_RETURN(common::Tensor first, common::Tensor::Create(all.dtype(), std::move(shape)));
  std::memcpy(first.bytes().data(), all.bytes().data(), first.num_bytes());
  it->second = std::move(first);
  return absl::OkStatus();
}

}  // namespace

std::optional<int64_t> CheckpointFolderStep(absl::string_view dir) {
  const size_t slash = dir.find_last_of('/');
  absl::string_view base = dir.substr(slash == absl::string_view::npos ? 0 : slash + 1);
  int64_t step = 0;
  if (!absl::ConsumePrefix(&base, "step-")) return std::nullopt;
  if (!absl::SimpleAtoi(base, &step) || step < 0) return std::nullopt;
  return step;
}

bool IsTemporaryCheckpointFolder(absl::string_view name) {
  return absl::StrContains(name, kTemporaryInfix);
}

absl::Status WriteCheckpointFolder(const std::string& dir, const std::vector<ChunkFile>& files,
                                   int num_chunks) {
  fs::path target_path = fs::path(dir).lexically_normal();
  if (!target_path.has_filename()) target_path = target_path.parent_path();  // "ckpt/"
  const std::string target = target_path.string();
  if (target.empty() || target == "." || target == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint folder '", dir, "': not a folder name"));
  }
  std::error_code ec;
  if (target_path.has_parent_path()) fs::create_directories(target_path.parent_path(), ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint folder ", dir, ": ", ec.message()));
  ASSIGN_OR_RETURN(const std::string folder, MakeSiblingFolder(target));
  absl::Status s = FillFolder(dir, folder, files, num_chunks);
  if (s.ok()) s = ReplaceFolder(dir, folder, target);
  // After a failure nothing of this write is left: no partial folder, no temporary one.
  fs::remove_all(folder, ec);
  return s;
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
    absl::StatusOr<model::Checkpoint> hf = LoadHfFolder(path);
    if (!hf.ok()) return bad(std::string(hf.status().message()));
    return hf;
  }
  const fs::path index = fs::path(path) / model::kCheckpointIndexFileName;
  std::error_code exists_ec;
  if (!fs::exists(fs::symlink_status(index, exists_ec))) {
    return bad(absl::StrCat("'", path, "' has no ", model::kCheckpointIndexFileName, " and no ",
                            kHfConfigFileName,
                            "; give a checkpoint folder the coordinator wrote (its index is "
                            "written last, so a folder without one is incomplete), a Hugging "
                            "Face GPT-2 or Llama folder or one .safetensors file"));
  }
  absl::StatusOr<std::vector<std::string>> files = model::IndexShardFiles(path);
  if (!files.ok()) return bad(std::string(files.status().message()));
  std::vector<model::Checkpoint> parts;
  for (const std::string& f : *files) {
    absl::StatusOr<model::Checkpoint> part = model::LoadCheckpoint(f);
    if (!part.ok()) return bad(std::string(part.status().message()));
    parts.push_back(*std::move(part));
  }
  absl::StatusOr<model::Checkpoint> whole = model::MergeCheckpoints(std::move(parts));
  if (!whole.ok()) return bad(absl::StrCat(path, ": ", whole.status().message()));
  return whole;
}

absl::StatusOr<Checkpoint> FitCheckpointToModel(Checkpoint whole, const TransformerConfig& model,
                                                absl::string_view source) {
  const TransformerConfig& file = whole.config;
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
    // first seq_len rows of a position table are the whole model for sequences of
    // seq_len.
    for (const ParamSpec& p : CheckpointParams(file, 0, file.num_pipeline_layers())) {
      if (!p.per_position) continue;
      RETURN_IF_ERROR(KeepFirstRows(whole.params, p.name, model.seq_len));
      if (whole.optimizer) {
        RETURN_IF_ERROR(KeepFirstRows(whole.optimizer->m, p.name, model.seq_len));
        RETURN_IF_ERROR(KeepFirstRows(whole.optimizer->v, p.name, model.seq_len));
      }
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
  part.precision = whole.precision;
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
