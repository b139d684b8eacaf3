#include "coordinator/job_paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/token_file.h"
#include "common/status_macros.h"

namespace pipetrain::coordinator {
namespace {

namespace fs = std::filesystem;
namespace pb = ::pipetrain::v1;

// A folder with more entries than this is not a checkpoint; refusing it bounds the walk.
constexpr int kMaxInitFromEntries = 10000;

// A missing file is a bad spec: INVALID_ARGUMENT, whatever code the library chose.
absl::Status AsInvalid(const absl::Status& s) {
  if (s.ok() || s.code() == absl::StatusCode::kInvalidArgument) return s;
  return absl::InvalidArgumentError(s.message());
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

absl::Status CheckInitFrom(const std::string& path, const common::DataRoots& roots) {
  constexpr absl::string_view kField = "init_from";
  RETURN_IF_ERROR(roots.Check(path, kField));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": '", path, "' does not exist on the coordinator's machine"));
  }
  if (S_ISREG(st.st_mode)) {
    return AsInvalid(
        common::CheckRegularFile(path, common::kMaxSafetensorsBytes, kField).status());
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, " ", path, " is ", common::FileKindName(st.st_mode),
                     ", not a checkpoint folder or a .safetensors file"));
  }
  if (!roots.confining()) return absl::OkStatus();
  // The loaders follow symlinks inside the folder; each must stay in the roots too.
  std::error_code ec;
  int entries = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (++entries > kMaxInitFromEntries) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, " ", path, " holds more than ", kMaxInitFromEntries,
          " entries; a checkpoint folder holds a few files"));
    }
    RETURN_IF_ERROR(roots.Check(it->path().string(), kField));
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, " ", path, ": cannot list it: ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

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
