// The costs "auto" plans with (coordinator/auto/auto_schedule.h): a stage's calibration
// (Stage.Calibrate: a few passes of one block of the job's model on its device),
// cached per model shape, precision, micro-batch rows and device, so that the next job
// of the same model on the same kind of stage plans at once; the replicas' all-reduce
// on a ring of the free stages and one transfer between two of them, cached per stages
// and bytes. The gRPC call is the
// caller's; this holds the cache, the key and the translation.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auto/auto_schedule.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain::coordinator {

// Rounds a calibration times after its warm-up: a block's and the ring's; a transfer of
// one micro-batch takes well under a block's time, and more rounds steady its median.
inline constexpr int kCalibrationRepetitions = 5;
inline constexpr int kTransferRepetitions = 11;

class CalibrationCache {
 public:
  using Calibrate = std::function<absl::StatusOr<pipetrain::v1::CalibrateResponse>(
      const std::string& address, const pipetrain::v1::CalibrateRequest& request)>;

  // The costs for `spec` (pipeline.schedule "auto") at `rows` rows a micro-batch on the
  // device of `stages`: the free stages that share it (at least one), `slots` of which
  // compute at full speed at once (planner::SharedDevices). Every one of them is asked at
  // once (`calibrate` from as many threads), so the device is timed with all its stages
  // busy, and each rate is their median's times min(1, slots / stages): what a slot of
  // the device takes, which the planner shares out. Cached per model, precision, rows,
  // device kind and how many share it; a failed calibration is not cached and names the
  // stage.
  absl::StatusOr<AutoCosts> Get(const pipetrain::v1::JobSpec& spec,
                                const std::vector<pipetrain::v1::StageInfo>& stages, int slots,
                                int rows, const Calibrate& calibrate);

  // The replicas' all-reduce rate on a ring of `stages` (at least two): every stage is
  // asked at once (`calibrate` from as many threads) to all-reduce `bytes` under the
  // rendezvous space `calibration_id`, which the caller drops afterwards; the slowest
  // member's median gives the rate (RingRateFromTime). Cached per set of stages and
  // bytes; a failure is not cached and names the stage.
  struct RingCost {
    double bytes_per_s = 0;
    std::string source;  // for AutoCosts::source
  };
  absl::StatusOr<RingCost> GetRing(const std::vector<pipetrain::v1::StageInfo>& stages,
                                   uint64_t bytes, const std::string& calibration_id,
                                   const Calibrate& calibrate);

  // The pipeline's transfer costs on the link from `sender` to `receiver`: both asked at
  // once (`calibrate` from two threads) to time tensors of `bytes` under the link id
  // `calibration_id` and `secret`. Cached per pair and bytes; a failure is not cached
  // and names the stage.
  struct TransferCost {
    double transfer_s_per_byte = 0;
    double send_busy_s = 0;
    std::string source;  // for AutoCosts::source
  };
  absl::StatusOr<TransferCost> GetTransfer(const pipetrain::v1::StageInfo& sender,
                                           const pipetrain::v1::StageInfo& receiver,
                                           uint64_t bytes, const std::string& calibration_id,
                                           const std::string& secret,
                                           const Calibrate& calibrate);

 private:
  absl::Mutex mu_;
  std::map<std::string, AutoCosts> cache_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, RingCost> rings_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, TransferCost> transfers_ ABSL_GUARDED_BY(mu_);
};

// The cache's key: the model's fields, the precision, the rows, the device's kind, name
// and threads, and how many stages share it in how many slots (stages alike in these
// run a block alike).
std::string CalibrationKey(const pipetrain::v1::JobSpec& spec,
                           const pipetrain::v1::DeviceInfo& device, int rows, int sharing = 1,
                           int slots = 1);

}  // namespace pipetrain::coordinator
