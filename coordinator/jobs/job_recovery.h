// What the coordinator does when a stage of a running job is lost: finds the newest
// complete state (the surviving stages' in-memory snapshots, else the job's newest
// checkpoint, else its start) and the stages to continue on (a free stage in the lost
// one's place, else the survivors when the model fits them, with replicas the replicas
// that lost no stage, else a free stage within fault_tolerance.wait_for_stages_s), and
// says so in one event line. The job manager runs the job again from there
// (job_runner.h RunStart); the choice of snapshot is pure (snapshot_choice.h), the
// calls to the stages go through a StageConnector (gRPC, or fakes in tests).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/runner/job_runner.h"
#include "coordinator/runner/snapshot_choice.h"
#include "coordinator/stages/stage_connection.h"
#include "coordinator/stages/stage_registry.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

struct LostRun {
  std::string job_id;
  pipetrain::v1::JobSpec spec;      // as it ran (pipeline.stages = its K)
  std::vector<StageRecord> stages;  // its stages, in pipeline order
  std::vector<std::string> lost;    // the stage ids found lost
  int64_t failed_step = 0;          // the step that was running
  bool stages_hold_state = false;   // every stage was configured by this run
  std::string checkpoint_dir;       // the job's newest checkpoint, "" if none
  std::string checkpoint_root;      // where the job's checkpoints go
  int restart = 1;                  // this restart's number, from 1
};

// The run of the job `status` describes that lost the stages `lost` (ids) at
// `failed_step`: the job's id, newest checkpoint and restart number come from its
// status, `spec` and `stages` are the run's. `stages_hold_state`: every stage was
// configured by the run (their snapshots are of it).
LostRun LostRunOf(const pipetrain::v1::JobStatus& status, std::string checkpoint_root,
                  pipetrain::v1::JobSpec spec, std::vector<StageRecord> stages,
                  std::vector<std::string> lost, int64_t failed_step, bool stages_hold_state);

// The run a previous coordinator left: `back[i]` is its stage i registered again, or
// nullopt for one not back within the grace time (lost; named by its old id and
// address). The stages that came back still hold the job.
LostRun LostRunAfterRestart(const pipetrain::v1::JobStatus& status,
                            const std::vector<std::optional<StageRecord>>& back,
                            std::string checkpoint_root);

struct Continuation {
  std::vector<StageRecord> stages;        // in pipeline order
  pipetrain::v1::JobSpec spec;            // replicas x stages = stages.size()
  std::optional<RestoredState> restored;  // nullopt: from the job's start
  pipetrain::v1::Recovery record;
};

// What JobRecovery::Recover found.
struct Recovered {
  // Where the job continues, from its `restored` state. CANCELLED when `stop` said so
  // while waiting for stages, UNAVAILABLE when no stages could take the job in time.
  absl::StatusOr<Continuation> next;
  // When `next` is an error: the newest complete state found for the job (its `source`
  // says where from), nullopt when that is the job's start.
  std::optional<RestoredState> stranded;
};

// Whether `state` is of a later step than the checkpoint folder `checkpoint_dir` ("" for
// none): keeping it saves the steps between them.
bool NewerThanCheckpoint(const RestoredState& state, const std::string& checkpoint_dir);

// Writes `state` as the checkpoint folder of its step under `checkpoint_root`
// (ROOT/step-N, one whole-model file, as resume reads); returns the folder.
absl::StatusOr<std::string> WriteAsCheckpoint(const RestoredState& state,
                                              const std::string& checkpoint_root);

class JobRecovery {
 public:
  // `stop` says the job was cancelled or the coordinator is stopping; `poll` is how
  // often a wait for stages looks again.
  JobRecovery(StageRegistry& registry, std::shared_ptr<StageConnector> connector,
              absl::Duration rpc_deadline,
              absl::Duration poll, std::function<void(const std::string&)> log,
              std::function<bool()> stop);

  // Where and from what the job continues; or why it cannot, with the state it had
  // found for it (Recovered::stranded), which the caller may keep.
  Recovered Recover(const LostRun& run);

 private:
  struct Source {
    std::optional<RestoredState> restored;
    std::string what;  // "the stages' snapshots", "checkpoint DIR", "the start"
  };
  // Lists the survivors' snapshots (a survivor that does not answer is lost too, and
  // leaves `survivors`), then takes the newer of the snapshot and the checkpoint.
  Source FindState(const LostRun& run, std::vector<int>& survivors, std::vector<std::string>& lost);
  // The whole model from the survivors' snapshots (`listings[h]` is survivor h's), at
  // the newest step every stage's chunks (every replica's, where the copies split the
  // optimizer) are held at; nullopt, said in the log, when there is none.
  std::optional<RestoredState> FromSnapshots(const LostRun& run, const std::vector<int>& survivors,
                                             const std::vector<std::vector<SnapshotEntry>>& listings);
  // The stages to continue on, or nullopt after waiting in vain (or being stopped).
  std::optional<Continuation> FindStages(const LostRun& run, const std::vector<int>& survivors,
                                         const std::vector<std::string>& lost);
  // With replicas and no free stage: the replicas that lost no stage, as many of them as
  // the batch splits over and the model fits (the others' survivors are freed), or
  // nullopt with `why` saying why not.
  std::optional<Continuation> OnFewerReplicas(const LostRun& run, const std::vector<int>& survivors,
                                              std::string& why);
  // Whether the job's model fits these stages, planned on them alone.
  bool Fits(const pipetrain::v1::JobSpec& spec, const std::vector<StageRecord>& stages) const;

  StageRegistry& registry_;
  const std::shared_ptr<StageConnector> connector_;
  const absl::Duration rpc_deadline_;
  const absl::Duration poll_;
  const std::function<void(const std::string&)> log_;
  const std::function<bool()> stop_;
};

}  // namespace pipetrain::coordinator
