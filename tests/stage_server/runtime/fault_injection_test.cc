// --fail-at (stage_server/fault_injection): the plan's text, which actions are which
// point, and when an armed plan fires (the death is replaced by a recorder here; the
// real SIGKILL is exercised end to end by coordinator_fault_points_test).
#include "stage_server/runtime/fault_injection.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::stage_server {
namespace {

using ::testing::HasSubstr;
using schedule::Action;
using schedule::ActionKind;

TEST(FaultPlanTest, ParsesEveryPoint) {
  for (const auto& [text, point] : std::vector<std::pair<std::string, FaultPoint>>{
           {"forward", FaultPoint::kForward},
           {"backward", FaultPoint::kBackward},
           {"optimizer", FaultPoint::kOptimizer},
           {"snapshot", FaultPoint::kSnapshot},
           {"checkpoint", FaultPoint::kCheckpoint}}) {
    auto plan = ParseFaultPlan("job-000002:1:12:" + text);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->job_id, "job-000002");
    EXPECT_EQ(plan->stage, 1);
    EXPECT_EQ(plan->step, 12);
    EXPECT_EQ(plan->point, point);
    EXPECT_EQ(FaultPointName(point), text);
  }
}

TEST(FaultPlanTest, AWrongPlanNamesThePartThatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"job-1:1:12", "3 parts instead of 4"},
      {"job-1:1:12:forward:x", "5 parts instead of 4"},
      {":1:12:forward", "JOB is empty"},
      {"job-1:-1:12:forward", "STAGE '-1'"},
      {"job-1:one:12:forward", "STAGE 'one'"},
      {"job-1:1:0:forward", "STEP '0'"},
      {"job-1:1:x:forward", "STEP 'x'"},
      {"job-1:1:12:sideways", "POINT 'sideways' is unknown"},
  };
  for (const auto& [text, message] : cases) {
    auto plan = ParseFaultPlan(text);
    ASSERT_FALSE(plan.ok()) << text;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr(message)) << text;
    EXPECT_THAT(plan.status().message(), HasSubstr("--fail-at '" + text + "'"));
  }
}

TEST(FaultPointTest, TheMiddleMicroBatchsForwardAndBackwardAndTheOptimizerStep) {
  EXPECT_EQ(PointOfAction(schedule::Forward(4), 8), FaultPoint::kForward);
  EXPECT_EQ(PointOfAction(schedule::Backward(4), 8), FaultPoint::kBackward);
  EXPECT_EQ(PointOfAction(schedule::BackwardInput(4), 8), FaultPoint::kBackward);
  EXPECT_EQ(PointOfAction(Action{ActionKind::kOptimizerStep, 0, 0}, 8), FaultPoint::kOptimizer);
  EXPECT_EQ(PointOfAction(schedule::Forward(0), 1), FaultPoint::kForward);
  EXPECT_EQ(PointOfAction(schedule::Forward(3), 8), std::nullopt);
  EXPECT_EQ(PointOfAction(schedule::Forward(4, 1), 8), std::nullopt) << "chunk 0 only";
  EXPECT_EQ(PointOfAction(schedule::BackwardWeight(4), 8), std::nullopt);
  EXPECT_EQ(PointOfAction(Action{ActionKind::kSendActivation, 4, 0}, 8), std::nullopt);
}

class FaultInjectorTest : public ::testing::Test {
 protected:
  FaultInjector Make(const std::string& text) {
    auto plan = ParseFaultPlan(text);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return FaultInjector(*plan, [this](const std::string& why) { deaths_.push_back(why); });
  }
  std::vector<std::string> deaths_;
};

TEST_F(FaultInjectorTest, FiresOnlyAtItsPointOfItsStepOfItsJobOnItsStage) {
  FaultInjector f = Make("job-2:1:12:backward");
  f.At(FaultPoint::kBackward, "job-2", 12);
  EXPECT_TRUE(deaths_.empty()) << "not armed before the stage is configured for the job";
  f.Configured("job-2", 0, 0);
  f.At(FaultPoint::kBackward, "job-2", 12);
  EXPECT_TRUE(deaths_.empty()) << "another stage of the job";
  f.Configured("job-2", 1, 1);
  f.At(FaultPoint::kBackward, "job-2", 12);
  EXPECT_TRUE(deaths_.empty()) << "another replica of the stage";
  f.Configured("job-1", 1, 0);
  f.At(FaultPoint::kBackward, "job-1", 12);
  EXPECT_TRUE(deaths_.empty()) << "another job";

  f.Configured("job-2", 1, 0);
  EXPECT_TRUE(f.armed());
  f.At(FaultPoint::kForward, "job-2", 12);
  f.At(FaultPoint::kBackward, "job-2", 11);
  f.At(FaultPoint::kBackward, "job-1", 12);
  EXPECT_TRUE(deaths_.empty());
  f.At(FaultPoint::kBackward, "job-2", 12);
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_THAT(deaths_[0], HasSubstr("job 'job-2' stage 1 step 12 at the backward"));
}

TEST_F(FaultInjectorTest, ARestoredRunOfTheJobNeverFires) {
  FaultInjector f = Make("job-2:1:12:optimizer");
  f.Configured("job-2", 1, 0);
  f.Restored("job-1");
  EXPECT_TRUE(f.armed()) << "another job's import";
  f.Restored("job-2");
  EXPECT_FALSE(f.armed());
  f.At(FaultPoint::kOptimizer, "job-2", 12);
  EXPECT_TRUE(deaths_.empty());
  // A Configure after the restore (a later recovery) starts from imported state too, but
  // only its import says so: until then the stage runs from its own initialisation.
  f.Configured("job-2", 1, 0);
  EXPECT_TRUE(f.armed());
}

TEST(FaultInjectorNoPlanTest, NeverFires) {
  FaultInjector f;
  f.Configured("job-2", 1, 0);
  EXPECT_FALSE(f.armed());
  f.At(FaultPoint::kForward, "job-2", 12);  // would crash the test if it fired
}

}  // namespace
}  // namespace pipetrain::stage_server
