#include "client/chrome_trace.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "common/schedule/stage_program.h"
#include "nlohmann/json.hpp"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;

constexpr int kComputeTid = 0;
constexpr int kLinkTid = 1;

std::string ActionName(const pb::Action& action) {
  auto parsed = schedule::ActionFromProto(action);
  return parsed.ok() ? schedule::ToString(*parsed) : pb::ActionKind_Name(action.kind());
}

}  // namespace

std::string TimelineToChromeTrace(const pb::Timeline& timeline) {
  // Where each step starts: after the latest end of every earlier step.
  std::map<int64_t, int64_t> step_end;  // step -> largest end_us
  std::set<int> stages;
  for (const pb::TimelineEvent& e : timeline.events()) {
    auto [it, inserted] = step_end.try_emplace(e.step(), e.end_us());
    if (!inserted) it->second = std::max(it->second, e.end_us());
    stages.insert(e.stage());
  }
  std::map<int64_t, int64_t> step_offset;
  int64_t offset = 0;
  for (const auto& [step, end] : step_end) {
    step_offset[step] = offset;
    offset += std::max<int64_t>(end, 0);
  }

  nlohmann::json events = nlohmann::json::array();
  for (int s : stages) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", s}, {"tid", kComputeTid},
                      {"args", {{"name", absl::StrCat("stage ", s)}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", s},
                      {"tid", kComputeTid}, {"args", {{"sort_index", s}}}});
    for (auto [tid, lane] : {std::pair{kComputeTid, "compute"}, {kLinkTid, "link"}}) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", s}, {"tid", tid},
                        {"args", {{"name", lane}}}});
    }
  }
  for (const pb::TimelineEvent& e : timeline.events()) {
    const int64_t start = step_offset[e.step()] + e.start_us();
    events.push_back({{"name", ActionName(e.action())},
                      {"cat", e.lane().empty() ? "compute" : e.lane()},
                      {"ph", "X"},
                      {"pid", e.stage()},
                      {"tid", e.lane() == "link" ? kLinkTid : kComputeTid},
                      {"ts", start},
                      {"dur", std::max<int64_t>(0, e.end_us() - e.start_us())},
                      {"args",
                       {{"step", e.step()},
                        {"micro_batch", e.action().micro_batch()},
                        {"chunk", e.action().chunk()},
                        {"bytes", e.bytes()}}}});
    // The forward a re-materializing backward re-runs first, nested inside it.
    if (e.recompute_us() > 0) {
      events.push_back({{"name", "recompute"},
                        {"cat", "compute"},
                        {"ph", "X"},
                        {"pid", e.stage()},
                        {"tid", kComputeTid},
                        {"ts", start},
                        {"dur", std::min(e.recompute_us(), std::max<int64_t>(0, e.end_us() - e.start_us()))},
                        {"args", {{"step", e.step()}, {"micro_batch", e.action().micro_batch()},
                                  {"chunk", e.action().chunk()}}}});
    }
    // The data-parallel replicas' gradient all-reduce an optimizer step begins with.
    if (e.reduce_us() > 0) {
      events.push_back({{"name", "allreduce"},
                        {"cat", "collective"},
                        {"ph", "X"},
                        {"pid", e.stage()},
                        {"tid", kComputeTid},
                        {"ts", start},
                        {"dur", std::min(e.reduce_us(), std::max<int64_t>(0, e.end_us() - e.start_us()))},
                        {"args", {{"step", e.step()}}}});
    }
  }
  nlohmann::json trace;
  trace["traceEvents"] = std::move(events);
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = {{"job_id", timeline.job_id()}, {"source", "measured"}};
  return trace.dump();
}

}  // namespace pipetrain::client
