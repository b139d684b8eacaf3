#include "client/timeline_breakdown.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;

constexpr int Index(TimeCategory c) { return static_cast<int>(c); }

// The category of an action's time (a B or I's recompute part aside).
std::optional<TimeCategory> CategoryOf(pb::ActionKind kind) {
  switch (kind) {
    case pb::FORWARD:
      return TimeCategory::kForward;
    case pb::BACKWARD:
      return TimeCategory::kBackward;
    case pb::BACKWARD_INPUT:
      return TimeCategory::kBackwardInput;
    case pb::BACKWARD_WEIGHT:
      return TimeCategory::kBackwardWeight;
    case pb::OPTIMIZER_STEP:
      return TimeCategory::kOptimizer;
    case pb::SEND_ACTIVATION:
    case pb::SEND_GRADIENT:
      return TimeCategory::kSend;
    case pb::RECV_ACTIVATION:
    case pb::RECV_GRADIENT:
      return TimeCategory::kRecvWait;
    default:
      return std::nullopt;
  }
}

// A stretch of one stage's step, in microseconds, [begin, end).
struct Segment {
  int64_t begin = 0, end = 0;
  TimeCategory category = TimeCategory::kIdle;
};

// Microseconds per category over [0, step_us): each instant goes to the first active
// category (enum order), else idle, so the sum is step_us exactly.
std::array<int64_t, kNumTimeCategories> Attribute(const std::vector<Segment>& segments,
                                                  int64_t step_us) {
  std::vector<std::pair<int64_t, std::pair<int, int>>> edges;  // (time, (category, +1|-1))
  for (const Segment& s : segments) {
    const int64_t b = std::clamp<int64_t>(s.begin, 0, step_us);
    const int64_t e = std::clamp<int64_t>(s.end, 0, step_us);
    if (b >= e) continue;
    edges.push_back({b, {Index(s.category), +1}});
    edges.push_back({e, {Index(s.category), -1}});
  }
  std::sort(edges.begin(), edges.end());
  std::array<int64_t, kNumTimeCategories> us{};
  std::array<int, kNumTimeCategories> active{};
  auto top = [&] {
    for (int c = 0; c < Index(TimeCategory::kIdle); ++c) {
      if (active[c] > 0) return c;
    }
    return Index(TimeCategory::kIdle);
  };
  int64_t at = 0;
  for (const auto& [time, change] : edges) {
    us[top()] += time - at;
    at = time;
    active[change.first] += change.second;
  }
  us[top()] += step_us - at;
  return us;
}

std::string StepsText(const std::vector<StepBreakdown>& steps) {
  if (steps.size() == 1) return absl::StrCat("step ", steps[0].step);
  const bool contiguous =
      steps.back().step - steps.front().step == static_cast<int64_t>(steps.size()) - 1;
  if (contiguous) {
    return absl::StrCat("steps ", steps.front().step, "-", steps.back().step, " (",
                        steps.size(), " averaged)");
  }
  std::vector<int64_t> ids;
  for (const StepBreakdown& s : steps) ids.push_back(s.step);
  return absl::StrCat("steps ", absl::StrJoin(ids, ", "), " (", steps.size(), " averaged)");
}

std::string Duration(double seconds) {
  if (seconds >= 1) return absl::StrFormat("%.2f s", seconds);
  if (seconds >= 1e-3) return absl::StrFormat("%.1f ms", seconds * 1e3);
  return absl::StrFormat("%.0f us", seconds * 1e6);
}

}  // namespace

absl::string_view TimeCategoryName(TimeCategory c) {
  switch (c) {
    case TimeCategory::kForward: return "forward";
    case TimeCategory::kBackward: return "backward";
    case TimeCategory::kBackwardInput: return "backward_input";
    case TimeCategory::kBackwardWeight: return "backward_weight";
    case TimeCategory::kRecompute: return "recompute";
    case TimeCategory::kAllReduce: return "allreduce";
    case TimeCategory::kOptimizer: return "optimizer";
    case TimeCategory::kSend: return "send";
    case TimeCategory::kRecvWait: return "recv_wait";
    case TimeCategory::kIdle: return "idle";
  }
  return "unknown";
}

absl::string_view TimeCategoryColumn(TimeCategory c) {
  switch (c) {
    case TimeCategory::kBackwardInput: return "input";
    case TimeCategory::kBackwardWeight: return "weight";
    case TimeCategory::kRecvWait: return "recv-wait";
    default: return TimeCategoryName(c);
  }
}

double StageTimes::AllReduceHidden() const {
  if (allreduce_total_s <= 0) return 0;
  return std::clamp(1 - (*this)[TimeCategory::kAllReduce] / allreduce_total_s, 0.0, 1.0);
}

double StageTimes::Total() const {
  double total = 0;
  for (double s : seconds) total += s;
  return total;
}

double ShareOfStep(double seconds, double step_time_s) {
  return step_time_s > 0 ? seconds / step_time_s : 0;
}

absl::StatusOr<TimelineBreakdown> BreakDownTimeline(const pb::Timeline& timeline) {
  const std::string job = absl::StrCat("timeline of job '", timeline.job_id(), "'");
  if (timeline.events_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(job, " has no events: no step has finished yet, nothing to break down"));
  }
  // step -> stage -> its segments; step -> its longest span.
  std::map<int64_t, std::map<int, std::vector<Segment>>> segments;
  std::map<int64_t, int64_t> step_us;
  std::map<int, int64_t> reduce_total_us;  // stage -> over all steps
  std::set<int> stages;
  for (int i = 0; i < timeline.events_size(); ++i) {
    const pb::TimelineEvent& e = timeline.events(i);
    const std::string where =
        absl::StrCat(job, ": event ", i, " (step ", e.step(), " stage ", e.stage(), ")");
    if (e.stage() < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative stage"));
    std::optional<TimeCategory> category = CategoryOf(e.action().kind());
    if (!category) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": action kind ", static_cast<int>(e.action().kind()), " is not known here"));
    }
    stages.insert(e.stage());
    int64_t& span = step_us[e.step()];
    span = std::max(span, e.end_us());
    std::vector<Segment>& mine = segments[e.step()][e.stage()];
    int64_t begin = e.start_us();
    if (*category == TimeCategory::kBackward || *category == TimeCategory::kBackwardInput) {
      const int64_t length = std::max<int64_t>(e.end_us() - e.start_us(), 0);
      const int64_t recompute = std::clamp<int64_t>(e.recompute_us(), 0, length);
      if (recompute > 0) mine.push_back({begin, begin + recompute, TimeCategory::kRecompute});
      begin += recompute;
    }
    if (*category == TimeCategory::kOptimizer) {
      const int64_t length = std::max<int64_t>(e.end_us() - e.start_us(), 0);
      const int64_t reduce = std::clamp<int64_t>(e.reduce_us(), 0, length);
      if (reduce > 0) mine.push_back({begin, begin + reduce, TimeCategory::kAllReduce});
      begin += reduce;
      reduce_total_us[e.stage()] += std::max<int64_t>(e.reduce_total_us(), 0);
    }
    mine.push_back({begin, e.end_us(), *category});
  }

  TimelineBreakdown b;
  b.job_id = timeline.job_id();
  b.stages.resize(stages.size());
  for (const auto& [step, span_us] : step_us) {
    StepBreakdown& sb = b.steps.emplace_back();
    sb.step = step;
    sb.step_time_s = static_cast<double>(span_us) / 1e6;
    b.step_time_s += sb.step_time_s;
    size_t row = 0;
    for (int stage : stages) {
      StageTimes& st = sb.stages.emplace_back();
      st.stage = stage;
      static const std::vector<Segment> kNothing;  // a stage silent in this step: idle
      auto it = segments[step].find(stage);
      const std::array<int64_t, kNumTimeCategories> us =
          Attribute(it == segments[step].end() ? kNothing : it->second, span_us);
      for (int c = 0; c < kNumTimeCategories; ++c) {
        st.seconds[c] = static_cast<double>(us[c]) / 1e6;
        b.stages[row].seconds[c] += st.seconds[c];
      }
      b.stages[row].stage = stage;
      ++row;
    }
  }
  const double n = static_cast<double>(b.steps.size());
  b.step_time_s /= n;
  for (StageTimes& st : b.stages) {
    for (double& s : st.seconds) s /= n;
    st.allreduce_total_s = static_cast<double>(reduce_total_us[st.stage]) / 1e6 / n;
  }
  return b;
}

std::string BreakdownTable(const TimelineBreakdown& b) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"stage"};
  for (TimeCategory c : kAllTimeCategories) header.emplace_back(TimeCategoryColumn(c));
  rows.push_back(header);
  for (const StageTimes& st : b.stages) {
    std::vector<std::string> row = {absl::StrCat(st.stage)};
    for (TimeCategory c : kAllTimeCategories) {
      row.push_back(absl::StrFormat("%s %3.0f%%", Duration(st[c]),
                                    100 * ShareOfStep(st[c], b.step_time_s)));
    }
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out = absl::StrCat(b.job_id, ": ", StepsText(b.steps), ", step time ",
                                 Duration(b.step_time_s), " (the longest stage span)\n");
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      // The stage number to the left, the figures to the right, so that they line up.
      const std::string pad(width[i] - row[i].size(), ' ');
      absl::StrAppend(&line, i == 0 ? "" : "  ", i == 0 ? row[i] + pad : pad + row[i]);
    }
    absl::StrAppend(&out, line, "\n");
  }
  for (const StageTimes& st : b.stages) {
    if (st.allreduce_total_s <= 0) continue;
    absl::StrAppend(&out, "stage ", st.stage, ": the replicas' gradient all-reduce took ",
                    Duration(st.allreduce_total_s), " a step, ",
                    absl::StrFormat("%.0f%%", 100 * st.AllReduceHidden()),
                    " of it hidden behind the backward\n");
  }
  return out;
}

std::string BreakdownJson(const TimelineBreakdown& b) {
  // Ordered, so that the keys print in the table's order; plotting scripts read these names.
  nlohmann::ordered_json j;
  j["job_id"] = b.job_id;
  j["steps"] = nlohmann::ordered_json::array();
  for (const StepBreakdown& s : b.steps) j["steps"].push_back(s.step);
  j["step_time_s"] = b.step_time_s;
  j["stages"] = nlohmann::ordered_json::array();
  for (const StageTimes& st : b.stages) {
    nlohmann::ordered_json stage;
    stage["stage"] = st.stage;
    nlohmann::ordered_json shares = nlohmann::ordered_json::object();
    for (TimeCategory c : kAllTimeCategories) {
      const std::string name(TimeCategoryName(c));
      stage[name + "_s"] = st[c];
      shares[name] = ShareOfStep(st[c], b.step_time_s);
    }
    stage["allreduce_total_s"] = st.allreduce_total_s;
    stage["allreduce_hidden"] = st.AllReduceHidden();
    stage["shares"] = std::move(shares);
    j["stages"].push_back(std::move(stage));
  }
  return j.dump(2) + "\n";
}

}  // namespace pipetrain::client
