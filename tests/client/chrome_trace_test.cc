#include "client/chrome_trace.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;

pb::TimelineEvent Event(int64_t step, int stage, pb::ActionKind kind, int mb, int chunk,
                        const std::string& lane, int64_t start, int64_t end, uint64_t bytes = 0) {
  pb::TimelineEvent e;
  e.set_step(step);
  e.set_stage(stage);
  e.mutable_action()->set_kind(kind);
  e.mutable_action()->set_micro_batch(mb);
  e.mutable_action()->set_chunk(chunk);
  e.set_lane(lane);
  e.set_start_us(start);
  e.set_end_us(end);
  e.set_bytes(bytes);
  return e;
}

nlohmann::json Trace(const pb::Timeline& t) {
  auto j = nlohmann::json::parse(TimelineToChromeTrace(t), nullptr, false);
  EXPECT_FALSE(j.is_discarded());
  return j;
}

TEST(ChromeTraceTest, SpansCarryStageLaneNameTimesAndArgs) {
  pb::Timeline t;
  *t.add_events() = Event(5, 0, pb::FORWARD, 2, 1, "compute", 10, 50);
  *t.add_events() = Event(5, 1, pb::RECV_GRADIENT, 2, 0, "link", 50, 90, 4096);
  *t.add_events() = Event(5, 1, pb::OPTIMIZER_STEP, 0, 0, "compute", 90, 120);
  const auto j = Trace(t);
  std::vector<nlohmann::json> spans;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") spans.push_back(e);
  }
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0]["name"], "F2@1");
  EXPECT_EQ(spans[0]["pid"], 0);
  EXPECT_EQ(spans[0]["tid"], 0);
  EXPECT_EQ(spans[0]["ts"], 10);
  EXPECT_EQ(spans[0]["dur"], 40);
  EXPECT_EQ(spans[0]["args"]["step"], 5);
  EXPECT_EQ(spans[0]["args"]["micro_batch"], 2);
  EXPECT_EQ(spans[0]["args"]["chunk"], 1);
  EXPECT_EQ(spans[1]["name"], "RECV_B2");
  EXPECT_EQ(spans[1]["pid"], 1);
  EXPECT_EQ(spans[1]["tid"], 1);
  EXPECT_EQ(spans[1]["args"]["bytes"], 4096);
  EXPECT_EQ(spans[2]["name"], "OPT");
}

TEST(ChromeTraceTest, ARecomputingBackwardHoldsANestedRecomputeSpan) {
  pb::Timeline t;
  pb::TimelineEvent b = Event(3, 1, pb::BACKWARD, 4, 0, "compute", 100, 400);
  b.set_recompute_us(120);
  *t.add_events() = b;
  *t.add_events() = Event(3, 1, pb::FORWARD, 5, 0, "compute", 400, 500);  // none: no span
  const nlohmann::json trace = Trace(t);
  std::vector<nlohmann::json> spans;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") spans.push_back(e);
  }
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0]["name"], "B4");
  EXPECT_EQ(spans[1]["name"], "recompute");
  EXPECT_EQ(spans[1]["ts"], 100);
  EXPECT_EQ(spans[1]["dur"], 120);
  EXPECT_EQ(spans[1]["tid"], 0);
  EXPECT_EQ(spans[1]["args"]["micro_batch"], 4);
  EXPECT_EQ(spans[2]["name"], "F5");
}

TEST(ChromeTraceTest, AReplicasOptimizerStepHoldsANestedAllReduceSpan) {
  pb::Timeline t;
  pb::TimelineEvent opt = Event(2, 0, pb::OPTIMIZER_STEP, 0, 0, "compute", 600, 900);
  opt.set_reduce_us(200);
  *t.add_events() = opt;
  *t.add_events() = Event(2, 1, pb::OPTIMIZER_STEP, 0, 0, "compute", 600, 700);  // R = 1
  const nlohmann::json trace = Trace(t);
  std::vector<nlohmann::json> spans;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") spans.push_back(e);
  }
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0]["name"], "OPT");
  EXPECT_EQ(spans[1]["name"], "allreduce");
  EXPECT_EQ(spans[1]["ts"], 600);
  EXPECT_EQ(spans[1]["dur"], 200);
  EXPECT_EQ(spans[1]["pid"], 0);
  EXPECT_EQ(spans[2]["name"], "OPT");
}

TEST(ChromeTraceTest, MetadataNamesEveryStageAndBothLanes) {
  pb::Timeline t;
  *t.add_events() = Event(1, 0, pb::FORWARD, 0, 0, "compute", 0, 5);
  *t.add_events() = Event(1, 2, pb::FORWARD, 0, 0, "compute", 5, 9);
  std::map<std::pair<int, int>, std::string> threads;
  std::map<int, std::string> processes;
  const nlohmann::json trace = Trace(t);
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
    if (e["name"] == "thread_name") threads[{e["pid"], e["tid"]}] = e["args"]["name"];
  }
  EXPECT_EQ(processes, (std::map<int, std::string>{{0, "stage 0"}, {2, "stage 2"}}));
  EXPECT_EQ(threads.at({0, 0}), "compute");
  EXPECT_EQ(threads.at({0, 1}), "link");
  EXPECT_EQ(threads.at({2, 1}), "link");
}

TEST(ChromeTraceTest, StepsAreLaidEndToEndInStepOrder) {
  pb::Timeline t;
  // Out of order on purpose: the offsets follow step numbers, not arrival.
  *t.add_events() = Event(3, 0, pb::FORWARD, 0, 0, "compute", 0, 30);
  *t.add_events() = Event(1, 0, pb::FORWARD, 0, 0, "compute", 0, 100);
  *t.add_events() = Event(1, 1, pb::BACKWARD, 0, 0, "compute", 100, 250);
  *t.add_events() = Event(2, 0, pb::FORWARD, 0, 0, "compute", 20, 70);
  std::map<int64_t, int64_t> ts_of_step;
  const nlohmann::json trace = Trace(t);
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "F0") ts_of_step[e["args"]["step"]] = e["ts"];
  }
  EXPECT_EQ(ts_of_step[1], 0);
  EXPECT_EQ(ts_of_step[2], 250 + 20);
  EXPECT_EQ(ts_of_step[3], 250 + 70);
}

TEST(ChromeTraceTest, EmptyTimelineIsAValidTrace) {
  const auto j = Trace(pb::Timeline());
  EXPECT_TRUE(j["traceEvents"].is_array());
  EXPECT_TRUE(j["traceEvents"].empty());
}

TEST(ChromeTraceTest, UnknownActionKindsKeepTheirProtoName) {
  pb::Timeline t;
  *t.add_events() = Event(1, 0, pb::ACTION_KIND_UNSPECIFIED, 0, 0, "compute", 0, 1);
  bool found = false;
  const nlohmann::json trace = Trace(t);
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") found = e["name"] == "ACTION_KIND_UNSPECIFIED";
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace pipetrain::client
