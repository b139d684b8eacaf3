// The description of a lost run (job_recovery.h) built from the job's status, after a
// run that lost a stage and after a coordinator restart whose stages did not all come
// back: the job's id, checkpoint and restart number from its status, the stages not
// back named by their old id and address, the layout they last ran.
#include "coordinator/jobs/job_recovery.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::testing::ElementsAre;

pb::JobStatus Status() {
  pb::JobStatus s;
  s.set_job_id("job-3");
  s.set_checkpoint_dir("/s/checkpoints/job-3/step-4");
  s.set_steps_done(5);
  s.add_recoveries();  // one restart so far
  s.mutable_spec()->mutable_pipeline()->set_stages(2);
  s.mutable_spec()->mutable_pipeline()->set_replicas(2);
  for (int i = 0; i < 4; ++i) {
    s.add_stage_ids("stage-" + std::to_string(i + 1));
    s.add_stage_addresses("h:" + std::to_string(7000 + i));
  }
  return s;
}

StageRecord Stage(const std::string& id, const std::string& address) {
  StageRecord s;
  s.stage_id = id;
  s.address = address;
  return s;
}

TEST(LostRunOfTest, TakesTheJobsFactsFromItsStatus) {
  pb::JobSpec spec;
  spec.mutable_pipeline()->set_stages(3);
  const LostRun run = LostRunOf(Status(), "/s/checkpoints/job-3", spec,
                                {Stage("stage-1", "h:1"), Stage("stage-2", "h:2")},
                                {"stage-2"}, 6, /*stages_hold_state=*/false);
  EXPECT_EQ(run.job_id, "job-3");
  EXPECT_EQ(run.checkpoint_dir, "/s/checkpoints/job-3/step-4");
  EXPECT_EQ(run.checkpoint_root, "/s/checkpoints/job-3");
  EXPECT_EQ(run.restart, 2);
  EXPECT_EQ(run.spec.pipeline().stages(), 3) << "the run's spec, not the job's";
  EXPECT_EQ(run.stages.size(), 2u);
  EXPECT_THAT(run.lost, ElementsAre("stage-2"));
  EXPECT_EQ(run.failed_step, 6);
  EXPECT_FALSE(run.stages_hold_state);
}

TEST(LostRunAfterRestartTest, StagesNotBackAreLostUnderTheirOldIdAndAddress) {
  std::vector<std::optional<StageRecord>> back(4);
  back[0] = Stage("stage-9", "h:7000");  // registered again, under a new id
  back[2] = Stage("stage-8", "h:7002");
  back[3] = Stage("stage-7", "h:7003");
  const LostRun run = LostRunAfterRestart(Status(), back, "/s/checkpoints/job-3");
  ASSERT_EQ(run.stages.size(), 4u);
  EXPECT_EQ(run.stages[0].stage_id, "stage-9");
  EXPECT_EQ(run.stages[1].stage_id, "stage-2 (h:7001)");
  EXPECT_EQ(run.stages[1].address, "h:7001");
  EXPECT_THAT(run.lost, ElementsAre("stage-2 (h:7001)"));
  EXPECT_EQ(run.failed_step, 6) << "the step after the last one recorded";
  EXPECT_TRUE(run.stages_hold_state);
  EXPECT_EQ(run.restart, 2);
  EXPECT_EQ(run.spec.pipeline().stages(), 2);
  EXPECT_EQ(run.spec.pipeline().replicas(), 2);
}

}  // namespace
}  // namespace pipetrain::coordinator
