// The files a job names (data.corpus, data.tokens, data.validation_tokens, init_from),
// checked on the coordinator before any is read: of the right kind (a FIFO or device
// would block a request thread or read without end), inside the folders jobs may read
// (JobDataRoots), and for init_from, checkpoint files whose headers parse.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/user_path.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// The folders jobs may read on this coordinator. With --data-root folders (`data_roots`):
// those, and STATE_DIR/checkpoints, which `pipetrain resume` names as init_from. Without
// any: the coordinator's working folder and STATE_DIR (DataRoots::Default); a job that
// names a file elsewhere is refused, saying how to allow it. `--data-root /` allows every
// file. Folders that do not exist are refused, naming the flag; STATE_DIR is created.
absl::StatusOr<common::DataRoots> JobDataRoots(const std::vector<std::string>& data_roots,
                                               const std::string& state_dir);

// INVALID_ARGUMENT naming the field and the path (and, for one outside the roots, the
// roots) for the first path that is missing, of the wrong kind, too big or outside
// `roots`. A folder named by init_from has each of its entries checked against the roots
// too (a symlink in it may point anywhere). Token-file patterns are expanded as
// LoadJobData expands them. init_from's safetensors files (the file, or each one in the
// folder) must have headers that parse, with a pipetrain checkpoint's metadata and
// tensors where the loader wants one; only headers are read here, the tensors when the
// job starts.
absl::Status CheckJobPaths(const pipetrain::v1::JobSpec& spec, const common::DataRoots& roots);

}  // namespace pipetrain::coordinator
