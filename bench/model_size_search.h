// The searches of `pipetrain-bench model-size`, as pure functions: the largest n in a
// range for which a monotone predicate holds (binary search), the step down from a
// candidate until a costlier check (training on real stages) passes, and the two model
// families it is applied to, sized by n, with the planner's verdict as the predicate.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/transformer_config.h"
#include "coordinator/planner/planner.h"

namespace pipetrain::bench {

// fits(n): true, false, or an error that ends the search (returned as is).
using FitsFn = std::function<absl::StatusOr<bool>(int64_t n)>;

// The largest n in [lo, hi] with fits(n), by binary search, for a predicate that is
// true up to some n and false after it. Calls fits O(log(hi - lo)) times.
// Errors: InvalidArgument when lo > hi; NotFound, naming the range, when fits(lo) is
// false (nothing fits). When everything fits the answer is hi.
// A predicate that is not monotone is not detected: the answer is then some n with
// fits(n) true and, unless n == hi, fits(n + 1) false (a boundary, not necessarily the
// largest n that fits), and the caller checks it (model-size trains it).
absl::StatusOr<int64_t> LargestFitting(int64_t lo, int64_t hi, const FitsFn& fits);

// What StepDown tried, in order: each n and why it did not pass ("" for the one that did).
struct StepDownResult {
  int64_t n = 0;  // the first n that passed
  struct Try {
    int64_t n = 0;
    std::string failure;
  };
  std::vector<Try> tries;
};

// Tries check(start), check(start - 1), ... down to lo, stopping at the first OK, at
// most max_tries times; a non-OK status means "does not pass" and its message is kept.
// Errors: InvalidArgument when start < lo or max_tries < 1; FailedPrecondition when no
// n passed within the tries, naming the range and the last failure.
absl::StatusOr<StepDownResult> StepDown(int64_t start, int64_t lo, int max_tries,
                                        const std::function<absl::Status(int64_t n)>& check);

// The two ways model-size grows a model: more blocks at the base width, or a wider model
// (d_model = n * width_step, heads kept) at the base depth.
enum class ModelFamily { kDepth, kWidth };
const char* FamilyName(ModelFamily family);  // "depth" | "width"

struct FamilySpec {
  ModelFamily family = ModelFamily::kDepth;
  model::TransformerConfig base;  // the fixed dimensions; the one that grows is ignored
  int width_step = 64;    // kWidth: d_model = n * width_step (a multiple of base.n_heads)
};

// The model of size n: n blocks (kDepth) or d_model n * width_step (kWidth).
model::TransformerConfig ModelOfSize(const FamilySpec& spec, int64_t n);
// The smallest n that can run on `stages` stages (every stage needs a pipeline layer),
// and an n the planner is sure to refuse under a cap of `cap_bytes` per stage (the
// weights and optimizer state alone exceed all stages' memory together).
int64_t SmallestSize(const FamilySpec& spec, int stages);
int64_t SurelyTooBig(const FamilySpec& spec, int stages, double cap_bytes);

// Whether the planner accepts `options` (with options.memory_cap_bytes set): true when
// MakePlan succeeds, false when it refuses with RESOURCE_EXHAUSTED (does not fit), any
// other error as is.
absl::StatusOr<bool> PlannerAccepts(const planner::PlanOptions& options);

// The largest n whose model the planner accepts on `options` (stages, schedule,
// micro-batches, recompute, memory cap), with LargestFitting over
// [SmallestSize, SurelyTooBig].
absl::StatusOr<int64_t> LargestPlannable(const FamilySpec& spec, planner::PlanOptions options);

}  // namespace pipetrain::bench
