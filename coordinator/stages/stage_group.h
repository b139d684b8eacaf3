// The stages of one running job as a group: one call to every stage at once, each on
// its own thread, with the job's deadlines and cancellation, and one error for the job
// out of their statuses (the first real one; a stage that stopped answering is named
// as the cause, since its neighbours only see a broken link). The stages are reached
// through a StageConnector (gRPC, or fakes in tests).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/stages/stage_connection.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

struct RunnerStage {
  std::string stage_id;
  std::string address;
  pipetrain::v1::DeviceInfo device;
};

// The job's error for the statuses of one operation on every stage, as a pure rule:
// OK if all are; else, if a stage does not answer `answers(s)` (a health ping), that
// stage is the cause (UNAVAILABLE naming it, its index in *lost); else the first
// failure that is not a cancellation (ours, of the others' calls once one failed), and
// only if there is none the first cancellation. `name(s)` names stage s in messages,
// `what` the operation ("running"), `step` the step (0: none).
absl::Status AttributeError(const std::vector<absl::Status>& statuses, int64_t step,
                            const char* what, const std::function<std::string(int)>& name,
                            const std::function<bool(int)>& answers, int* lost);

class StageGroup {
 public:
  StageGroup(std::vector<RunnerStage> stages, StageConnector& connector);

  int size() const { return static_cast<int>(stages_.size()); }
  const RunnerStage& stage(int s) const { return stages_[s]; }
  StageConnection& client(int s) { return *clients_[s]; }
  // "stage 2 (stage-7 at 10.0.0.3:7401)": how messages name a stage.
  std::string StageName(int s) const;

  // Runs call(s) for every stage at once; the statuses, by stage.
  std::vector<absl::Status> OnEveryStage(const std::function<absl::Status(int)>& call);
  // Runs call(s, control) for every stage at once, each control carrying `deadline`
  // from now. When one call fails, the others still open are cancelled, so that the
  // job fails promptly instead of waiting for its neighbours' receive deadlines.
  std::vector<absl::Status> OnEveryStageCancellingOnError(
      absl::Duration deadline, const std::function<absl::Status(int, CallControl&)>& call);

  // The job's error for the statuses of one operation on every stage (`what`, e.g.
  // "running"; `step` 0 when not in a step): OK if all are. A stage that no longer
  // answers a health ping is the cause (UNAVAILABLE naming it; it joins lost()); else
  // the first failure that is not our own cancellation of the others.
  absl::Status FirstError(const std::vector<absl::Status>& statuses, int64_t step,
                          const char* what);
  // OnEveryStage, then FirstError.
  absl::Status Run(int64_t step, const char* what, const std::function<absl::Status(int)>& call);

  // Ids of the stages found not answering, in the order found.
  const std::vector<std::string>& lost() const { return lost_; }

 private:
  std::vector<RunnerStage> stages_;
  std::vector<std::unique_ptr<StageConnection>> clients_;
  std::vector<std::string> lost_;
};

}  // namespace pipetrain::coordinator
