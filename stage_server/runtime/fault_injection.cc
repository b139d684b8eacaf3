#include "stage_server/runtime/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/error_context.h"

namespace pipetrain::stage_server {
namespace {

constexpr std::array<std::pair<FaultPoint, absl::string_view>, 5> kPoints = {{
    {FaultPoint::kForward, "forward"},
    {FaultPoint::kBackward, "backward"},
    {FaultPoint::kOptimizer, "optimizer"},
    {FaultPoint::kSnapshot, "snapshot"},
    {FaultPoint::kCheckpoint, "checkpoint"},
}};

absl::Status Bad(absl::string_view text, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--fail-at '", text, "': ", what,
                   "; expected JOB:STAGE:STEP:POINT, e.g. job-000002:1:12:backward, with POINT "
                   "forward, backward, optimizer, snapshot or checkpoint"));
}

}  // namespace

absl::string_view FaultPointName(FaultPoint point) {
  for (const auto& [p, name] : kPoints) {
    if (p == point) return name;
  }
  return "unknown";
}

absl::StatusOr<FaultPlan> ParseFaultPlan(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() != 4) return Bad(text, absl::StrCat(parts.size(), " parts instead of 4"));
  FaultPlan plan;
  if (parts[0].empty()) return Bad(text, "JOB is empty");
  plan.job_id = std::string(parts[0]);
  if (!absl::SimpleAtoi(parts[1], &plan.stage) || plan.stage < 0) {
    return Bad(text, absl::StrCat("STAGE '", parts[1], "' is not a stage index (0 or more)"));
  }
  if (!absl::SimpleAtoi(parts[2], &plan.step) || plan.step < 1) {
    return Bad(text, absl::StrCat("STEP '", parts[2], "' is not a step number (1 or more)"));
  }
  for (const auto& [p, name] : kPoints) {
    if (parts[3] == name) {
      plan.point = p;
      return plan;
    }
  }
  return Bad(text, absl::StrCat("POINT '", parts[3], "' is unknown"));
}

std::optional<FaultPoint> PointOfAction(const schedule::Action& action, int num_micro_batches) {
  using schedule::ActionKind;
  const int middle = num_micro_batches / 2;
  switch (action.kind) {
    case ActionKind::kForward:
      if (action.micro_batch == middle && action.chunk == 0) return FaultPoint::kForward;
      return std::nullopt;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      if (action.micro_batch == middle && action.chunk == 0) return FaultPoint::kBackward;
      return std::nullopt;
    case ActionKind::kOptimizerStep:
      return FaultPoint::kOptimizer;
    default:
      return std::nullopt;
  }
}

void FaultInjector::DieNow(const std::string& why) {
  const std::string line = "pipetrain-stage: " + why + "\n";
  (void)!write(STDERR_FILENO, line.data(), line.size());
  raise(SIGKILL);
}

FaultInjector::FaultInjector(FaultPlan plan, Die die) : plan_(std::move(plan)), die_(std::move(die)) {}

void FaultInjector::Configured(const std::string& job_id, int stage, int replica) {
  armed_ = plan_ && plan_->job_id == job_id && plan_->stage == stage && replica == 0;
}

void FaultInjector::Restored(const std::string& job_id) {
  if (plan_ && plan_->job_id == job_id) armed_ = false;
}

void FaultInjector::At(FaultPoint point, const std::string& job_id, int64_t step) const {
  if (!armed_ || point != plan_->point || step != plan_->step || job_id != plan_->job_id) return;
  die_(absl::StrCat("--fail-at: ",
                    common::ErrorContext().Job(job_id).Stage(plan_->stage).Step(step).Text(),
                    " at the ", FaultPointName(point), ": killing this stage server (SIGKILL)"));
}

}  // namespace pipetrain::stage_server
