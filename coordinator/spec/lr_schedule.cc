#include "coordinator/spec/lr_schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pipetrain::coordinator {
namespace {

// The table: every decay with its name, the default first.
constexpr std::array<std::pair<LrDecay, absl::string_view>, 3> kDecays = {{
    {LrDecay::kConstant, "constant"},
    {LrDecay::kCosine, "cosine"},
    {LrDecay::kLinear, "linear"},
}};

// Of the decay from the peak (1) to min_lr (0), at the fraction r of the way.
double DecayFactor(LrDecay decay, double r) {
  switch (decay) {
    case LrDecay::kCosine:
      return 0.5 * (1.0 + std::cos(std::numbers::pi * r));
    case LrDecay::kLinear:
      return 1.0 - r;
    case LrDecay::kConstant:
      break;
  }
  return 1.0;
}

}  // namespace

absl::StatusOr<LrDecay> LrDecayNamed(absl::string_view name) {
  if (name.empty()) return kDecays.front().first;
  for (const auto& [decay, n] : kDecays) {
    if (n == name) return decay;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown schedule '", name, "'; accepted: ", LrDecayNames()));
}

absl::string_view LrDecayName(LrDecay decay) {
  for (const auto& [d, n] : kDecays) {
    if (d == decay) return n;
  }
  return "?";
}

std::string LrDecayNames() {
  return absl::StrJoin(kDecays, ", ", [](std::string* out, const auto& row) {
    absl::StrAppend(out, row.second);
  });
}

absl::StatusOr<LrSchedule> LrScheduleOf(const pipetrain::v1::TrainingSpec& training,
                                        int64_t last_step) {
  LrSchedule s;
  ASSIGN_OR_RETURN(s.decay, LrDecayNamed(training.lr_schedule()));
  s.lr = training.lr();
  s.min_lr = training.min_lr();
  s.warmup_steps = training.warmup_steps();
  s.last_step = last_step;
  return s;
}

float LearningRate(const LrSchedule& s, int64_t step) {
  // The warm-up in single precision, as it has always been computed (bit for bit).
  if (s.warmup_steps > 0 && step < s.warmup_steps) {
    return s.lr * static_cast<float>(step) / static_cast<float>(s.warmup_steps);
  }
  if (s.decay == LrDecay::kConstant) return s.lr;
  // The decay starts at the peak's step and ends at last_step (a run whose last step is
  // the peak's has no room to decay: it keeps the peak).
  const int64_t start = std::max<int64_t>(s.warmup_steps, 1);
  const double span = static_cast<double>(std::max<int64_t>(s.last_step - start, 1));
  const double r = std::clamp(static_cast<double>(step - start) / span, 0.0, 1.0);
  const double min_lr = s.min_lr;
  return static_cast<float>(min_lr + DecayFactor(s.decay, r) * (double{s.lr} - min_lr));
}

}  // namespace pipetrain::coordinator
