// The calls the coordinator makes on one stage server, as an interface: the job runner
// (through StageGroup) and the recovery drive a job's stages through it. The real one
// speaks gRPC (grpc_stage_connector.h); tests answer in process (tests/testing/fake_stages.h),
// so the step loop and the restart rules run in milliseconds.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain::coordinator {

// One call that another thread may cancel: its deadline, and a switch. The connection
// making the call says how to cancel it while it runs (SetCanceller); Cancel before
// that cancels it as soon as it is set, so a cancellation is never lost.
class CallControl {
 public:
  explicit CallControl(absl::Time deadline) : deadline_(deadline) {}
  CallControl(const CallControl&) = delete;
  CallControl& operator=(const CallControl&) = delete;

  absl::Time deadline() const { return deadline_; }
  // Thread-safe; cancelling twice is cancelling once.
  void Cancel();
  bool cancelled() const;
  // `cancel` stops the call in flight (called at once when already cancelled); an empty
  // function detaches it when the call has returned, before what it refers to goes away.
  void SetCanceller(std::function<void()> cancel);

 private:
  const absl::Time deadline_;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
};

// One stage server. Every error names the stage's address (the job's reason then names
// the stage).
class StageConnection {
 public:
  virtual ~StageConnection() = default;

  virtual const std::string& address() const = 0;
  virtual absl::StatusOr<pipetrain::v1::ConfigureResponse> Configure(
      const pipetrain::v1::ConfigureRequest& request, absl::Duration deadline) = 0;
  // `call` carries the deadline and lets another thread cancel the step.
  virtual absl::StatusOr<pipetrain::v1::RunStepResponse> RunStep(
      CallControl& call, const pipetrain::v1::RunStepRequest& request) = 0;
  // Phase 2 of a deferred step; `call` as for RunStep.
  virtual absl::StatusOr<pipetrain::v1::ApplyOptimizerResponse> ApplyOptimizer(
      CallControl& call, const pipetrain::v1::ApplyOptimizerRequest& request) = 0;
  // One model chunk's checkpoint file (safetensors bytes).
  virtual absl::StatusOr<std::string> ExportChunk(const std::string& job_id, int chunk,
                                                  absl::Duration deadline) = 0;
  virtual absl::Status ImportChunk(const std::string& job_id, int chunk, const std::string& bytes,
                                   absl::Duration deadline) = 0;
  // What the stage holds of the job's in-memory snapshots, own and held.
  virtual absl::StatusOr<std::vector<pipetrain::v1::SnapshotInfo>> ListSnapshots(
      const std::string& job_id, absl::Duration deadline) = 0;
  // One snapshot blob (a chunk's checkpoint file, as ExportChunk gives): the stage's own
  // or the one it holds (`held`; nullopt: own first).
  virtual absl::StatusOr<std::string> FetchSnapshot(const std::string& job_id, int owner_stage,
                                                    int chunk, int64_t step,
                                                    std::optional<bool> held,
                                                    absl::Duration deadline) = 0;
  // Whether the server answers at all, without waiting for a running step.
  virtual absl::Status Ping(absl::Duration deadline) = 0;
  // A few passes of one block of a model on the stage's device, for pipeline.schedule
  // "auto" (coordinator/auto/stage_calibration.h). Unimplemented by default: a connection
  // that cannot calibrate leaves "auto" to the devices' FLOP rates.
  virtual absl::StatusOr<pipetrain::v1::CalibrateResponse> Calibrate(
      const pipetrain::v1::CalibrateRequest& request, absl::Duration deadline) {
    return absl::UnimplementedError("this stage connection does not calibrate");
  }
};

// Makes the connection to the stage server at an address. Shared by every job of a
// coordinator and called from their threads: thread-safe.
class StageConnector {
 public:
  virtual ~StageConnector() = default;
  virtual std::unique_ptr<StageConnection> Connect(const std::string& address) = 0;
};

}  // namespace pipetrain::coordinator
