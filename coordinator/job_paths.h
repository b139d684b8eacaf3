// The files a job names (data.corpus, data.tokens, data.validation_tokens, init_from),
// checked on the coordinator before any is read: of the right kind (a FIFO or device
// would block a request thread or read without end) and inside --data-root when set.
#pragma once

#include "absl/status/status.h"
#include "common/user_path.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// INVALID_ARGUMENT naming the field and the path (and, for one outside the roots, the
// roots) for the first path that is missing, of the wrong kind, too big or outside
// `roots`. A folder named by init_from has each of its entries checked against the roots
// too (a symlink in it may point anywhere). Token-file patterns are expanded as
// LoadJobData expands them.
absl::Status CheckJobPaths(const pipetrain::v1::JobSpec& spec, const common::DataRoots& roots);

}  // namespace pipetrain::coordinator
