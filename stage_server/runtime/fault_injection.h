// A testing aid: `pipetrain-stage --fail-at JOB:STAGE:STEP:POINT` makes the stage server
// kill itself (SIGKILL, as a lost host would) at one chosen point of one step of one job,
// so that tests can lose a stage exactly during a forward, a backward, the optimizer
// step, a snapshot's copy to its neighbour or a checkpoint's export, rather than
// wherever a kill from outside happens to land.
//
// The plan is armed when this process is configured as stage STAGE (replica 0) of job
// JOB, and disarmed when any state is imported into it: a recovery imports the restored
// state into every stage it configures, so a restarted run of the job never fails
// again at the same point (every stage of a test cluster may carry the same flag). The
// stage cannot tell a recovery's import from any other: a job started from init_from
// (its weights imported too) never fires, and a recovery from the job's start (nothing
// to import) fires again.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"

namespace pipetrain::stage_server {

enum class FaultPoint {
  kForward,     // the forward of the step's middle micro-batch (M / 2), before it runs
  kBackward,    // the backward (or input backward) of micro-batch M / 2, before it runs
  kOptimizer,   // the optimizer step, after the backward, before the update
  kSnapshot,    // the step's snapshot copy to the ring successor, after its first piece
  kCheckpoint,  // the export of a chunk for the checkpoint after the step
};

absl::string_view FaultPointName(FaultPoint point);

struct FaultPlan {
  std::string job_id;
  int stage = 0;
  int64_t step = 0;
  FaultPoint point = FaultPoint::kForward;
};

// "JOB:STAGE:STEP:POINT", e.g. "job-000002:1:12:backward"; the error names the part
// that is wrong and the values allowed.
absl::StatusOr<FaultPlan> ParseFaultPlan(absl::string_view text);

// The point an action of a training step's program is, if any: F and B (or I) of the
// middle micro-batch, and the optimizer step.
std::optional<FaultPoint> PointOfAction(const schedule::Action& action, int num_micro_batches);

class FaultInjector {
 public:
  using Die = std::function<void(const std::string& why)>;
  // Logs `why` to stderr and raises SIGKILL.
  static void DieNow(const std::string& why);

  FaultInjector() = default;  // no plan: never fires
  explicit FaultInjector(FaultPlan plan, Die die = DieNow);

  // A Configure of this stage (replica `replica` of position `stage`) for `job_id`.
  void Configured(const std::string& job_id, int stage, int replica);
  // State imported into the configured job: the run is a restored one.
  void Restored(const std::string& job_id);
  // Reached `point` of `step` of `job_id`: fires (dies) when the plan names them and is armed.
  void At(FaultPoint point, const std::string& job_id, int64_t step) const;
  bool armed() const { return armed_.load(); }

 private:
  std::optional<FaultPlan> plan_;
  Die die_;
  std::atomic<bool> armed_{false};
};

}  // namespace pipetrain::stage_server
