// Stage servers in process, for tests of the coordinator's step loop and restart rules
// (job_runner_test, job_manager_runs_test) that run in milliseconds. A fake stage answers every
// StageConnection call; its state is a real checkpoint per chunk (zero weights, AdamW
// state whose update count is the state's whole content), so checkpoints, snapshots and
// restores go through the coordinator's own code. The loss it reports depends only on
// that count (LossAfter), so a run restored from a wrong state, or one that applied a
// step twice, reports other losses than an unbroken run. A stage can be told to fail a
// call or to die (stop answering, also pings) at a step, and records what it was asked.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/model/checkpoint.h"
#include "coordinator/stages/stage_connection.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::testing {

class FakeStages : public coordinator::StageConnector {
 public:
  // The loss the last stage reports for every micro-batch of a step run on a state of
  // `updates` optimizer updates. Strictly decreasing.
  static float LossAfter(int64_t updates) { return 10.0f / (1.0f + static_cast<float>(updates)); }

  // A stage server at `address` (it answers from now on).
  void Add(const std::string& address);
  // It stops answering (every call and ping fails UNAVAILABLE) when asked to run `step`.
  void DieAtStep(const std::string& address, int64_t step);
  // It answers RunStep for `step` with `error` (each time it is asked) and goes on
  // answering; the other stages of its run wait for it, as real ones wait for its frames.
  void FailAtStep(const std::string& address, int64_t step, absl::Status error);
  // Its next call of `method` ("Configure", "ExportChunk", ...) fails with `error`.
  void FailNext(const std::string& address, const std::string& method, absl::Status error);
  // Its RunStep for `step` waits (at most 30 s) until `until` holds before it runs: a
  // test does something while the job is inside that step.
  void HoldAtStep(const std::string& address, int64_t step, std::function<bool()> until);
  // Whether a held step has begun waiting.
  bool Holding(const std::string& address);
  // Stops answering now, or answers again (with the state it had).
  void Kill(const std::string& address);
  void Revive(const std::string& address);

  // What the stage was asked, in order: "Configure job-1 stage 0", "RunStep 3",
  // "ApplyOptimizer 3", "ExportChunk 0", "ImportChunk 0 step 2", "ListSnapshots",
  // "FetchSnapshot 1/0 step 2". Pings are not recorded (the group pings at will).
  std::vector<std::string> Calls(const std::string& address);
  // The steps it was asked to run (training and validation), in order.
  std::vector<int64_t> StepsRun(const std::string& address);
  // Its optimizer updates, per chunk (empty before Configure).
  std::vector<int64_t> Updates(const std::string& address);
  // The latest Configure it was sent (empty before any).
  pipetrain::v1::ConfigureRequest Configured(const std::string& address);

  std::unique_ptr<coordinator::StageConnection> Connect(const std::string& address) override;

 private:
  friend class FakeConnection;
  struct Snapshot {
    pipetrain::v1::SnapshotInfo info;
    std::string bytes;
  };
  struct Stage {
    bool alive = true;
    std::optional<int64_t> die_at;
    std::map<int64_t, absl::Status> fail_at;
    std::map<std::string, absl::Status> fail_next;
    std::optional<int64_t> hold_at;
    std::function<bool()> hold_until;
    bool holding = false;
    std::vector<std::string> calls;
    std::vector<int64_t> steps_run;
    pipetrain::v1::ConfigureRequest config;  // the latest Configure
    std::vector<model::Checkpoint> chunks;
    bool deferred = false;           // a step's optimizer waits for ApplyOptimizer
    bool snapshot_deferred = false;  // ... and its snapshot
    // Own and held snapshots by (owner stage, chunk, held): the newest of each.
    std::map<std::tuple<int, int, bool>, Snapshot> snapshots;
  };

  // The stage at `address` when it answers; UNAVAILABLE naming `call` otherwise.
  absl::StatusOr<Stage*> Alive(const std::string& address, const std::string& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Alive, with `call` recorded and failed when FailNext said so.
  absl::StatusOr<Stage*> Answering(const std::string& address, const std::string& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a stage of the run `stage` belongs to (same job, same peer secret) is dead,
  // dies or fails at `step`: then no other stage of the run can finish the step.
  bool RunBroken(const Stage& stage, int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Configure(Stage& stage, const pipetrain::v1::ConfigureRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<pipetrain::v1::RunStepResponse> RunStep(Stage& stage,
                                                        const pipetrain::v1::RunStepRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One optimizer update of every chunk, and the snapshot when asked.
  void Update(Stage& stage, int64_t step, bool snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps its chunks' state of `step` and gives a copy to its snapshot peer.
  void TakeSnapshot(Stage& stage, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Import(Stage& stage, int chunk, const std::string& bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Stage> stages_ ABSL_GUARDED_BY(mu_);
};

// A small job for fake stages: 2 stages of a 2-block model, 6 steps of 4 sequences in 2
// micro-batches read from `corpus`, a checkpoint every 2 steps and a snapshot every
// step, with `overrides` ("training.steps=8", as --set takes them) applied; defaults
// filled in and validated as Submit does.
absl::StatusOr<pipetrain::v1::JobSpec> FakeJobSpec(const std::string& corpus,
                                                   const std::vector<std::string>& overrides = {});

}  // namespace pipetrain::testing
