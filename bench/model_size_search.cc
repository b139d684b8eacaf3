#include "bench/model_size_search.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/model/state_bytes.h"

namespace pipetrain::bench {

absl::StatusOr<int64_t> LargestFitting(int64_t lo, int64_t hi, const FitsFn& fits) {
  if (lo > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("search range [", lo, ", ", hi, "] is empty (lo > hi)"));
  }
  absl::StatusOr<bool> first = fits(lo);
  if (!first.ok()) return first.status();
  if (!*first) {
    return absl::NotFoundError(
        absl::StrCat("nothing in [", lo, ", ", hi, "] fits: even n = ", lo, " does not"));
  }
  // Invariant: fits(good) holds; every n > bad is assumed not to fit (bad = hi + 1 at first).
  int64_t good = lo, bad = hi + 1;
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    absl::StatusOr<bool> ok = fits(mid);
    if (!ok.ok()) return ok.status();
    (*ok ? good : bad) = mid;
  }
  return good;
}

absl::StatusOr<StepDownResult> StepDown(int64_t start, int64_t lo, int max_tries,
                                        const std::function<absl::Status(int64_t n)>& check) {
  if (start < lo || max_tries < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step down from ", start, " to ", lo, " in ",
                                                   max_tries,
                                                   " tries: need start >= lo and "
                                                   "at least one try"));
  }
  StepDownResult result;
  for (int64_t n = start; n >= lo && static_cast<int>(result.tries.size()) < max_tries; --n) {
    absl::Status s = check(n);
    result.tries.push_back({n, s.ok() ? "" : std::string(s.message())});
    if (s.ok()) {
      result.n = n;
      return result;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no n in [", result.tries.back().n, ", ", start, "] passed in ", result.tries.size(),
      " tries; the last (n = ", result.tries.back().n, "): ", result.tries.back().failure));
}

const char* FamilyName(ModelFamily family) {
  return family == ModelFamily::kDepth ? "depth" : "width";
}

model::TransformerConfig ModelOfSize(const FamilySpec& spec, int64_t n) {
  model::TransformerConfig c = spec.base;
  if (spec.family == ModelFamily::kDepth) {
    c.n_layers = static_cast<int>(n);
  } else {
    c.d_model = static_cast<int>(n * spec.width_step);
  }
  return c;
}

int64_t SmallestSize(const FamilySpec& spec, int stages) {
  // Depth: stages <= n + 2 pipeline layers. Width: any depth-valid model, d_model >= step.
  if (spec.family == ModelFamily::kDepth) return std::max(1, stages - 2);
  return 1;
}

int64_t SurelyTooBig(const FamilySpec& spec, int stages, double cap_bytes) {
  // fp32's state, the least a parameter takes in any precision: an upper bound.
  const double all = cap_bytes * stages / static_cast<double>(model::StateBytesPerParam());
  if (spec.family == ModelFamily::kDepth) {
    const model::TransformerConfig one = ModelOfSize(spec, 1);
    const double block = static_cast<double>(model::CostOfLayer(one, 1).params);
    return static_cast<int64_t>(all / block) + 1;
  }
  // A block holds more than 12 d_model^2 parameters.
  const double d = std::sqrt(all / (12.0 * std::max(1, spec.base.n_layers)));
  return static_cast<int64_t>(d / spec.width_step) + 1;
}

absl::StatusOr<bool> PlannerAccepts(const planner::PlanOptions& options) {
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(options);
  if (plan.ok()) return true;
  if (plan.status().code() == absl::StatusCode::kResourceExhausted) return false;
  return plan.status();
}

absl::StatusOr<int64_t> LargestPlannable(const FamilySpec& spec, planner::PlanOptions options) {
  if (options.memory_cap_bytes <= 0) {
    return absl::InvalidArgumentError(
        "the search for the largest model needs a memory cap (memory_cap_bytes > 0)");
  }
  const int64_t lo = SmallestSize(spec, options.stages);
  const int64_t hi = SurelyTooBig(spec, options.stages, options.memory_cap_bytes);
  return LargestFitting(lo, hi, [&](int64_t n) -> absl::StatusOr<bool> {
    options.model = ModelOfSize(spec, n);
    return PlannerAccepts(options);
  });
}

}  // namespace pipetrain::bench
