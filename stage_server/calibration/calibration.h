// A stage's short calibration for the automatic planner (`pipeline.schedule: "auto"`):
// a few forward, backward-input and backward-weight passes and optimizer steps of one
// transformer block, on the chunk a job of that model would run (the same backend, the
// same emulated device), turned into the planner's rates: seconds per FLOP of each
// action kind (model::CostOfLayer's FLOPs) and seconds per parameter of AdamW.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/transformer_config.h"
#include "common/model/precision.h"
#include "stage_server/exec/chunk_compute.h"
#include "stage_server/collective/gradient_reducer.h"

namespace pipetrain::stage_server {

struct CalibrationResult {
  double forward_s_per_flop = 0;
  double backward_input_s_per_flop = 0;
  double backward_weight_s_per_flop = 0;
  double optimizer_s_per_param = 0;
  int repetitions = 0;  // timed rounds each median was taken over
};

// What every calibration times with: the steady clock, and the median of its rounds
// (non-empty; of an even count, the upper middle).
using CalibrationClock = std::chrono::steady_clock;
double SecondsSince(CalibrationClock::time_point start);
double MedianOf(std::vector<double> values);

// The pipeline layer a calibration times: the first transformer block (pipeline layer 1;
// 0 is the embedding). Every block of a model costs the same.
constexpr int kCalibrationLayer = 1;

// Times `chunk`, which must hold exactly pipeline layer kCalibrationLayer of `config`
// for micro-batches of `rows` sequences in `precision`: one untimed round, then
// `repetitions` rounds of Forward, BackwardInput, BackwardWeight and OptimizerStep on
// fresh random inputs; each rate is the median round's seconds over the work.
// InvalidArgument for repetitions < 1 or rows < 1.
absl::StatusOr<CalibrationResult> CalibrateBlock(ChunkCompute& chunk,
                                                 const model::TransformerConfig& config,
                                                 const model::Precision& precision, int rows,
                                                 int repetitions);

// The replicas' all-reduce, for the planner's collective rate: `reducer`'s
// AllReduceSum of `bytes` of fp32 (a pattern, never zeros), once untimed, then
// `repetitions` times; the median call's seconds. Every member of the ring must call it
// with the same bytes and repetitions at once. InvalidArgument for bytes not a positive
// multiple of 4 or repetitions < 1; the reducer's errors as they are.
absl::StatusOr<double> TimeAllReduce(collective::GradientReducer& reducer, uint64_t bytes,
                                     int repetitions, absl::Duration deadline);

}  // namespace pipetrain::stage_server
