// The checks every coordinator request gets before it reaches the job manager's logic:
// each string and list a client controls within common/input_limits.h, a stage's
// registration field by field (address, device kind, threads, memory, FLOP rate), and a
// job's step size. Pure: the gRPC service calls them for every request, after its token
// and before the job manager sees it (the one place they run); the tests call them
// directly. Every error is INVALID_ARGUMENT naming the field and its value (truncated)
// or its size and the limit.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// The most tokens one step's batch may hold (training.batch_size x model.seq_len): the
// coordinator allocates the step's tokens and targets (int32 each) before sending them,
// so this bounds that allocation at 2 GiB.
inline constexpr int64_t kMaxBatchTokens = int64_t{1} << 28;

// Device kinds a stage may report (DeviceInfo.kind).
bool IsKnownDeviceKind(const std::string& kind);

// Every field of a registration: address "HOST:PORT" with a port in 1..65535, device
// kind known, name bounded, threads in [0, kMaxThreads], memory_bytes > 0 (a stage of
// unknown memory cannot be planned for: the planner would take it as unlimited),
// peak_flops finite and in [0, kMaxPeakFlops], the secret bounded.
absl::Status CheckRegisterStageRequest(const pipetrain::v1::RegisterStageRequest& request);
absl::Status CheckHeartbeatRequest(const pipetrain::v1::HeartbeatRequest& request);

// The sizes of a submitted spec: its bytes, name, paths, token-file lists and keywords,
// and the step's batch (training.batch_size x model.seq_len in 64 bits, within
// kMaxBatchTokens). The values themselves are ValidateJobSpec's.
absl::Status CheckJobSpecBounds(const pipetrain::v1::JobSpec& spec);

// A job id as a request carries it (GetJob, CancelJob, WatchJob, GetTimeline): bounded.
absl::Status CheckJobId(const std::string& job_id);
absl::Status CheckListJobsRequest(const pipetrain::v1::ListJobsRequest& request);
absl::Status CheckWatchJobRequest(const pipetrain::v1::WatchJobRequest& request);
absl::Status CheckGetTimelineRequest(const pipetrain::v1::GetTimelineRequest& request);

}  // namespace pipetrain::coordinator
