// pipeline.schedule "auto" at submit: the coordinator plans the job's shape itself. It
// searches every way to run it on the free stage servers (planner::SearchPlans: stages,
// replicas, micro-batches, every schedule of the table with its chunks, every recompute
// mode) under the stages' memory, with costs calibrated on a stage (a few passes of one
// block: stage_server/calibration/calibration.h) or, without them, from the devices' FLOP rates,
// writes the fastest predicted shape into the spec, and says why in the job's log and
// status (AutoChoice). Pure: the caller brings the devices and the rates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/auto_plan.h"
#include "coordinator/planner/planner.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// Where the costs came from, for the record: "calibrated on stage-0003 (cpu, 2 threads)",
// or "the devices' FLOP rates" when no stage could be calibrated.
struct AutoCosts {
  std::optional<planner::CostRates> rates;
  std::string source;
  // The replicas' all-reduce rate (PlanOptions::collective_bytes_per_s) timed on a ring
  // of the free stages (RingRateFromTime); unset: the links' rate.
  std::optional<double> collective_bytes_per_s = std::nullopt;
};

// What a ring calibration all-reduces: the model's gradient bytes (a replicated
// stage's at most), within [1 MiB, 64 MiB], a multiple of 4.
uint64_t RingCalibrationBytes(const pipetrain::v1::JobSpec& spec);

// What a transfer calibration sends: one micro-batch of `rows` sequences' activations
// between two blocks on the wire (the precision's dtype), within [4 KiB, 64 MiB], a
// multiple of 4.
uint64_t TransferCalibrationBytes(const pipetrain::v1::JobSpec& spec, int rows);

// The rate planner::RingAllReduceSeconds needs to give `seconds` for an all-reduce of
// `bytes` between `members` copies (the call's fixed latency taken off, at most half
// of it). A ring that took no time (emulated stages do not reduce): kFreeCollectiveRate.
inline constexpr double kFreeCollectiveRate = 1e15;
double RingRateFromTime(double bytes, int members, double seconds);

struct AutoChoice {
  pipetrain::v1::JobSpec spec;  // with the chosen shape in place of "auto"
  pipetrain::v1::AutoPlan record;  // what status shows (measured_step_s filled later)
  std::vector<std::string> log;    // lines for the job's log, the choice first
};

// A block's calibration times compute alone; a transfer's (CalibrationCache::GetTransfer)
// times the wire between two free stages on a fresh cluster. The runtime's own costs (what a send and a receive
// hold their stage, the wire's seconds per byte) are the cluster's, not the model's: the
// newest of `recent` jobs (newest first) with measured rates lends them to `costs`,
// which must hold rates already, and the source says which job. No such job: unchanged.
void AddRuntimeCosts(const std::vector<pipetrain::v1::JobStatus>& recent, AutoCosts& costs);

// The micro-batch rows a calibration runs: the batch over twice the devices (a typical
// micro-batch of the plans the search will weigh), at least 1.
int CalibrationRows(const pipetrain::v1::JobSpec& spec, int devices);

// Plans `spec` (pipeline.schedule "auto") for `devices`, the free stage servers' devices
// (at least one), with `costs`. Errors: the spec's own (named by field), or no shape fits
// the stages' memory (ResourceExhausted, naming the closest refusal).
absl::StatusOr<AutoChoice> ChooseAutoPlan(const pipetrain::v1::JobSpec& spec,
                                          const std::vector<pipetrain::v1::DeviceInfo>& devices,
                                          const AutoCosts& costs);

}  // namespace pipetrain::coordinator
