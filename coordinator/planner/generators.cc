#include "coordinator/planner/generators.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain::planner {
namespace {

using schedule::Action;
using schedule::Schedule;
using schedule::StageProgram;

Schedule Skeleton(ScheduleKind kind, int k, int m, int v) {
  Schedule out(k);
  for (int s = 0; s < k; ++s) {
    StageProgram& p = out[s];
    p.stage = s;
    p.num_stages = k;
    p.num_micro_batches = m;
    p.num_chunks = v;
    p.schedule = ScheduleName(kind);
    p.max_in_flight = InFlightBound(kind, k, m, v, s);
  }
  return out;
}

void Finish(Schedule& schedule) {
  for (StageProgram& p : schedule) p.actions.push_back(schedule::OptimizerStep());
}

Schedule Gpipe(int k, int m) {
  Schedule out = Skeleton(ScheduleKind::kGpipe, k, m, 1);
  for (StageProgram& p : out) {
    for (int i = 0; i < m; ++i) p.actions.push_back(schedule::Forward(i));
    for (int i = 0; i < m; ++i) p.actions.push_back(schedule::Backward(i));
  }
  return out;
}

Schedule OneFOneB(int k, int m) {
  Schedule out = Skeleton(ScheduleKind::kOneFOneB, k, m, 1);
  for (int s = 0; s < k; ++s) {
    std::vector<Action>& a = out[s].actions;
    const int warmup = std::min(k - 1 - s, m);
    for (int i = 0; i < warmup; ++i) a.push_back(schedule::Forward(i));
    for (int i = 0; i < m - warmup; ++i) {
      a.push_back(schedule::Forward(warmup + i));
      a.push_back(schedule::Backward(i));
    }
    for (int i = m - warmup; i < m; ++i) a.push_back(schedule::Backward(i));
  }
  return out;
}

// Megatron-LM's interleaved schedule: the k-th forward of a stage takes micro-batch
// (k / Kv) K + k % K of chunk (k % Kv) / K; backwards walk the chunks in reverse.
Schedule Interleaved(int k, int m, int v) {
  Schedule out = Skeleton(ScheduleKind::kInterleaved, k, m, v);
  const int total = m * v, group = k * v;
  auto mb = [&](int n) { return (n / group) * k + n % k; };
  auto fwd = [&](int n) { return schedule::Forward(mb(n), (n % group) / k); };
  auto bwd = [&](int n) { return schedule::Backward(mb(n), v - 1 - (n % group) / k); };
  for (int s = 0; s < k; ++s) {
    std::vector<Action>& a = out[s].actions;
    const int warmup = std::min(2 * (k - s - 1) + (v - 1) * k, total);
    for (int i = 0; i < warmup; ++i) a.push_back(fwd(i));
    for (int i = 0; i < total - warmup; ++i) {
      a.push_back(fwd(warmup + i));
      a.push_back(bwd(i));
    }
    for (int i = total - warmup; i < total; ++i) a.push_back(bwd(i));
  }
  return out;
}

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's order with B
// split into I (on the critical path) and W. Stage s starts its W passes s steps late,
// so the last stages, which would otherwise idle at the tail waiting for gradients,
// keep W passes for the end and the gradient chain (I only) runs faster.
Schedule ZbH1(int k, int m) {
  Schedule out = Skeleton(ScheduleKind::kZbH1, k, m, 1);
  for (int s = 0; s < k; ++s) {
    std::vector<Action>& a = out[s].actions;
    const int warmup = std::min(k - 1 - s, m);
    int next_w = 0;
    auto maybe_w = [&](int i) {
      if (i >= s && next_w < m) a.push_back(schedule::BackwardWeight(next_w++));
    };
    for (int i = 0; i < warmup; ++i) a.push_back(schedule::Forward(i));
    for (int i = 0; i < m - warmup; ++i) {
      a.push_back(schedule::Forward(warmup + i));
      a.push_back(schedule::BackwardInput(i));
      maybe_w(i);
    }
    for (int i = m - warmup; i < m; ++i) {
      a.push_back(schedule::BackwardInput(i));
      maybe_w(i);
    }
    while (next_w < m) a.push_back(schedule::BackwardWeight(next_w++));
  }
  return out;
}

}  // namespace

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zb-h1") return ScheduleKind::kZbH1;
  return absl::InvalidArgumentError(absl::StrCat("pipeline.schedule: unknown schedule '", name,
                                                 "' (expected gpipe, 1f1b, interleaved or zb-h1)"));
}

std::string ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZbH1:
      return "zb-h1";
  }
  return "?";
}

absl::Status CheckShape(ScheduleKind kind, int k, int m, int v) {
  if (k < 1 || k > kMaxStages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.stages must be in 1..", kMaxStages, " (got ", k, ")"));
  }
  if (m < 1 || m > kMaxMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.micro_batches must be in 1..", kMaxMicroBatches, " (got ", m, ")"));
  }
  if (v > kMaxChunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.chunks must be at most ", kMaxChunks, " (got ", v, ")"));
  }
  if (kind == ScheduleKind::kInterleaved) {
    if (v < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline.chunks must be >= 2 for the interleaved schedule (got ", v, ")"));
    }
    if (m % k != 0) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline.micro_batches (", m,
                                                     ") must be a multiple of pipeline.stages (", k,
                                                     ") for the interleaved schedule"));
    }
  } else if (v != 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.chunks must be 1 for the ",
                                                   ScheduleName(kind), " schedule (got ", v,
                                                   "); only interleaved uses model chunks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<schedule::Schedule> Generate(ScheduleKind kind, int k, int m, int v) {
  if (absl::Status s = CheckShape(kind, k, m, v); !s.ok()) return s;
  Schedule out;
  switch (kind) {
    case ScheduleKind::kGpipe:
      out = Gpipe(k, m);
      break;
    case ScheduleKind::kOneFOneB:
      out = OneFOneB(k, m);
      break;
    case ScheduleKind::kInterleaved:
      out = Interleaved(k, m, v);
      break;
    case ScheduleKind::kZbH1:
      out = ZbH1(k, m);
      break;
  }
  Finish(out);
  return out;
}

int InFlightBound(ScheduleKind kind, int k, int m, int v, int s) {
  switch (kind) {
    case ScheduleKind::kGpipe:
      return m;
    case ScheduleKind::kOneFOneB:
      return std::min(k - s, m);
    case ScheduleKind::kInterleaved:
      return std::min(2 * (k - s - 1) + (v - 1) * k + 1, v * m);
    case ScheduleKind::kZbH1:
      return std::min(k, m);
  }
  return 0;
}

double TextbookBubble(ScheduleKind kind, int k, int m, int v) {
  const double K = k, M = m, V = v;
  switch (kind) {
    case ScheduleKind::kGpipe:
    case ScheduleKind::kOneFOneB:
      return (K - 1) / (M + K - 1);
    case ScheduleKind::kInterleaved:
      return (K - 1) / (V * M + K - 1);
    case ScheduleKind::kZbH1:
      return (K - 1) / (3 * M + K - 1);
  }
  return 0;
}

std::string TextbookFormula(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe:
    case ScheduleKind::kOneFOneB:
      return "(K-1)/(M+K-1)";
    case ScheduleKind::kInterleaved:
      return "(K-1)/(vM+K-1)";
    case ScheduleKind::kZbH1:
      return "(K-1)/(3M+K-1)";
  }
  return "?";
}

}  // namespace pipetrain::planner
