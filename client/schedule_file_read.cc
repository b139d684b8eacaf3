#include "client/schedule_file_read.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/user_path.h"

namespace pipetrain::client {

// A schedule text is one line per stage; a megabyte holds thousands of actions a stage.
constexpr int64_t kMaxScheduleFileBytes = int64_t{16} << 20;

absl::Status ReadScheduleFile(pipetrain::v1::JobSpec& spec, const std::string& spec_path) {
  const std::string& name = spec.pipeline().schedule_file();
  if (name.empty()) return absl::OkStatus();
  std::filesystem::path path(name);
  if (path.is_relative()) path = std::filesystem::path(spec_path).parent_path() / path;
  absl::StatusOr<std::string> text =
      common::ReadRegularFile(path.string(), kMaxScheduleFileBytes, "schedule file");
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.schedule_file: ", text.status().message()));
  }
  if (text->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.schedule_file: ", path.string(),
        " is empty; `pipetrain plan JOB.json --print-schedule` prints a schedule to start from"));
  }
  spec.mutable_pipeline()->set_schedule_program(*text);
  return absl::OkStatus();
}

}  // namespace pipetrain::client
