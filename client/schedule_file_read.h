// pipeline.schedule_file, read on the CLI's machine: `pipetrain submit` and `pipetrain
// plan` put the file's text into pipeline.schedule_program, which is what the
// coordinator plans and keeps (a job restarted or resumed later needs no file).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

// When the spec names a schedule file, reads it (a relative path from the folder of
// `spec_path`, the job spec's file) into pipeline.schedule_program. Errors name
// pipeline.schedule_file and the path.
absl::Status ReadScheduleFile(pipetrain::v1::JobSpec& spec, const std::string& spec_path);

}  // namespace pipetrain::client
