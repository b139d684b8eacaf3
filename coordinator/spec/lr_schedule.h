// The learning-rate schedule of a training run (training.lr_schedule, warmup_steps,
// min_lr): one pure function of the run's global step number, which the coordinator
// calls for every step, so a resumed or restarted job continues the curve it was on.
// docs/USAGE.md, "Learning-rate schedule", compares it with nanoGPT, llm.c and torchtitan.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// What the rate does after the warm-up.
enum class LrDecay { kConstant, kCosine, kLinear };

struct LrSchedule {
  LrDecay decay = LrDecay::kConstant;
  float lr = 0;              // the peak, training.lr
  float min_lr = 0;          // where a decay ends, training.min_lr
  int64_t warmup_steps = 0;  // step s < warmup_steps gets lr * s / warmup_steps
  int64_t last_step = 0;     // the training run's last step, where a decay reaches min_lr
};

// The decay named `name` ("" is the default, "constant"); NotFound names the accepted ones.
absl::StatusOr<LrDecay> LrDecayNamed(absl::string_view name);
absl::string_view LrDecayName(LrDecay decay);
// "constant, cosine, linear": the accepted names, for messages.
std::string LrDecayNames();

// The schedule of `training` for a run whose last step (numbered as the training run
// numbers them: a job from a step-N checkpoint runs steps N+1 .. N+steps) is `last_step`.
absl::StatusOr<LrSchedule> LrScheduleOf(const pipetrain::v1::TrainingSpec& training,
                                        int64_t last_step);

// The rate of the training run's step `step` (1 is the first step of a fresh run).
// Warm-up: steps 1 .. warmup_steps - 1 get lr * step / warmup_steps, step warmup_steps
// (or step 1 without a warm-up) gets lr. A decay then goes from lr at that step to min_lr
// at last_step: cosine 0.5 * (1 + cos(pi * r)), linear 1 - r, of the fraction r of the
// way; steps past last_step stay at min_lr. "constant" keeps lr.
float LearningRate(const LrSchedule& schedule, int64_t step);

}  // namespace pipetrain::coordinator
