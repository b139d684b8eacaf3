// One link timed for the automatic planner (`pipeline.schedule: "auto"`): how long a
// tensor takes from one stage to the next, and what a send holds its sender, so that a
// fresh cluster plans its pipeline transfers from the wire it has rather than from the
// devices' guessed link rate. Both ends run over a TensorChannel (a PeerLink between
// two stage servers; tests use an in-memory pair); the gRPC set-up is StageRuntime's.
//
// The exchange: the sender sends tensors (micro-batch i, activations) and the receiver
// answers each with one fp32 element (micro-batch i, gradients). Micro-batch 0 is a
// ping; then, once untimed and `repetitions` times timed, one tensor of 4 bytes and one
// of `bytes` bytes, each waited for before the next.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stage_server/link/tensor_channel.h"

namespace pipetrain::stage_server {

struct LinkTimes {
  // One way of `bytes` (the median round trip less half the median 4-byte round trip,
  // whose answer is as small) over `bytes`: the latency included, as a job's measured
  // transfers count it (coordinator/planner/cost_fit.h).
  double transfer_s_per_byte = 0;
  double send_busy_s = 0;  // the median Send call of `bytes`, what the sender is held
};

// The messages the receiver answers: the ping and two per round.
int LinkCalibrationMessages(int repetitions);

// The sender's ping (micro-batch 0 and its answer): proves the receiver admitted the
// link before anything is timed.
absl::Status PingLink(TensorChannel& link, const std::string& calibration_id,
                      absl::Time deadline);

// The sender's timed rounds, after PingLink. InvalidArgument for bytes not a positive
// multiple of 4 or repetitions < 1; the link's errors name the micro-batch.
absl::StatusOr<LinkTimes> TimeLink(TensorChannel& link, const std::string& calibration_id,
                                   uint64_t bytes, int repetitions, absl::Time deadline);

// The receiver's side of both: answers LinkCalibrationMessages(repetitions) tensors,
// then waits until its answers have left or the sender, done, has hung up (OK either
// way; the sender reports a last answer that never came).
absl::Status AnswerLink(TensorChannel& link, const std::string& calibration_id,
                        int repetitions, absl::Time deadline);

}  // namespace pipetrain::stage_server
