#include "coordinator/runner/job_paths.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/token_file.h"
#include "common/error_context.h"
#include "common/model/checkpoint.h"
#include "common/model/hf_folder.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace pipetrain::coordinator {
namespace {

namespace fs = std::filesystem;
namespace pb = ::pipetrain::v1;

constexpr absl::string_view kInitFrom = "init_from";
// A folder with more entries than this is not a checkpoint; refusing it bounds the walk.
constexpr int kMaxInitFromEntries = 10000;

// A missing file is a bad spec: INVALID_ARGUMENT, whatever code the library chose.
absl::Status AsInvalid(const absl::Status& s) {
  if (s.ok() || s.code() == absl::StatusCode::kInvalidArgument) return s;
  return absl::InvalidArgumentError(s.message());
}

absl::Status TooManyEntries(const std::string& folder) {
  return absl::InvalidArgumentError(
      absl::StrCat(kInitFrom, " ", folder, " holds more than ", kMaxInitFromEntries,
                   " entries; a checkpoint folder holds a few files"));
}

absl::Status CannotList(const std::string& folder, const std::error_code& ec) {
  return absl::InvalidArgumentError(
      absl::StrCat(kInitFrom, " ", folder, ": cannot list it: ", ec.message()));
}

absl::Status CheckTokenField(absl::string_view field,
                             const google::protobuf::RepeatedPtrField<std::string>& patterns,
                             const common::DataRoots& roots) {
  for (int i = 0; i < patterns.size(); ++i) {
    const std::string name = absl::StrCat(field, "[", i, "]");
    // The pattern first, so a glob outside the roots is refused before it is expanded
    // (its matches would tell which files exist there).
    RETURN_IF_ERROR(roots.Check(patterns[i], name));
    absl::StatusOr<std::vector<std::string>> paths = data::ExpandTokenPaths({patterns[i]});
    if (!paths.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", paths.status().message()));
    }
    for (const std::string& path : *paths) {
      RETURN_IF_ERROR(roots.Check(path, name));
      RETURN_IF_ERROR(AsInvalid(
          common::CheckRegularFile(path, common::kMaxTokenFileBytes, name).status()));
    }
  }
  return absl::OkStatus();
}

// "init_from: " before a message that names the file, as INVALID_ARGUMENT.
absl::Status InInitFrom(const absl::Status& s) {
  return AsInvalid(common::ErrorContext(kInitFrom).Wrap(s));
}

// The loaders follow symlinks inside an init_from folder; each must stay in the roots too.
absl::Status CheckFolderInRoots(const std::string& path, const common::DataRoots& roots) {
  if (!roots.confining()) return absl::OkStatus();
  std::error_code ec;
  int entries = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (++entries > kMaxInitFromEntries) return TooManyEntries(path);
    RETURN_IF_ERROR(roots.Check(it->path().string(), kInitFrom));
  }
  if (ec) return CannotList(path, ec);
  return absl::OkStatus();
}

// The headers of the folder's .safetensors files, as the job will read them when it
// starts: a Hugging Face folder's as safetensors, a pipetrain checkpoint folder's as
// checkpoints (metadata and tensor names too).
absl::Status CheckFolderHeaders(const std::string& path) {
  const bool hugging_face = model::IsHfFolder(path);
  std::error_code ec;
  int entries = 0, files = 0;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (++entries > kMaxInitFromEntries) return TooManyEntries(path);
    if (it->path().extension() != ".safetensors") continue;
    const std::string file = it->path().string();
    RETURN_IF_ERROR(AsInvalid(
        common::CheckRegularFile(file, common::kMaxSafetensorsBytes, kInitFrom).status()));
    RETURN_IF_ERROR(InInitFrom(hugging_face ? common::ReadSafetensorsHeader(file).status()
                                            : model::ReadCheckpointInfo(file).status()));
    ++files;
  }
  if (ec) return CannotList(path, ec);
  if (files > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      kInitFrom, " ", path, " holds no .safetensors file; give a checkpoint folder the "
      "coordinator wrote, a Hugging Face GPT-2 or Llama folder or one .safetensors file"));
}

// A folder, or else a regular file of bounded size (stats only: a FIFO is never
// opened), inside the roots, whose safetensors headers parse.
absl::Status CheckInitFrom(const std::string& path, const common::DataRoots& roots) {
  RETURN_IF_ERROR(roots.Check(path, kInitFrom));
  if (common::CheckFolder(path, kInitFrom).ok()) {
    RETURN_IF_ERROR(CheckFolderInRoots(path, roots));
    return CheckFolderHeaders(path);
  }
  const absl::Status file =
      common::CheckRegularFile(path, common::kMaxSafetensorsBytes, kInitFrom).status();
  if (!file.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.message(), "; init_from names a checkpoint folder or one .safetensors file"));
  }
  // One file is one pipetrain checkpoint (model::LoadWholeCheckpoint reads it as one).
  return InInitFrom(model::ReadCheckpointInfo(path).status());
}

}  // namespace

absl::StatusOr<common::DataRoots> JobDataRoots(const std::vector<std::string>& data_roots,
                                               const std::string& state_dir) {
  if (data_roots.empty()) {
    std::error_code ec;
    const fs::path working = fs::current_path(ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot tell the coordinator's working folder: ", ec.message()));
    }
    return common::DataRoots::Default(working.string(), state_dir);
  }
  ASSIGN_OR_RETURN(common::DataRoots roots, common::DataRoots::Make(data_roots));
  // `pipetrain resume` names the coordinator's own checkpoint as init_from.
  RETURN_IF_ERROR(
      common::ErrorContext("--state-dir").Wrap(roots.Allow(state_dir + "/checkpoints")));
  return roots;
}

absl::Status CheckJobPaths(const pb::JobSpec& spec, const common::DataRoots& roots) {
  const pb::DataSpec& d = spec.data();
  if (!d.corpus().empty()) {
    RETURN_IF_ERROR(roots.Check(d.corpus(), "data.corpus"));
    RETURN_IF_ERROR(AsInvalid(
        common::CheckRegularFile(d.corpus(), common::kMaxTextFileBytes, "data.corpus")
            .status()));
  }
  RETURN_IF_ERROR(CheckTokenField("data.tokens", d.tokens(), roots));
  RETURN_IF_ERROR(CheckTokenField("data.validation_tokens", d.validation_tokens(), roots));
  if (!spec.init_from().empty()) RETURN_IF_ERROR(CheckInitFrom(spec.init_from(), roots));
  return absl::OkStatus();
}

}  // namespace pipetrain::coordinator
