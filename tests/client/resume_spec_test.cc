#include "client/resume_spec.h"

#include "common/testing/status_matchers.h"
#include "coordinator/spec/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

pb::JobStatus StoppedJob(pb::JobStatus::State state, const std::string& checkpoint) {
  pb::JobStatus job;
  job.set_job_id("job-000007");
  job.set_state(state);
  job.set_checkpoint_dir(checkpoint);
  job.set_steps_done(9);
  pb::JobSpec* spec = job.mutable_spec();
  spec->set_name("tiny");
  spec->mutable_training()->set_steps(20);
  spec->mutable_training()->set_lr(0.003f);
  spec->mutable_training()->set_warmup_steps(5);
  spec->mutable_pipeline()->set_stages(4);
  spec->mutable_data()->set_corpus("/data/kjv.txt");
  return job;
}

TEST(ResumeSpecTest, ContinuesFromTheCheckpointForTheStepsLeft) {
  for (auto state : {pb::JobStatus::FAILED, pb::JobStatus::CANCELLED}) {
    const pb::JobStatus job = StoppedJob(state, "/state/checkpoints/job-000007/step-8");
    auto spec = ResumeSpec(job);
    ASSERT_THAT(spec, IsOk());
    EXPECT_EQ(spec->init_from(), "/state/checkpoints/job-000007/step-8");
    EXPECT_EQ(spec->training().steps(), 12) << "20 planned, 8 in the checkpoint";
    // Everything else as the job had it.
    pb::JobSpec expected = job.spec();
    expected.set_init_from(spec->init_from());
    expected.mutable_training()->set_steps(12);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, expected))
        << spec->DebugString();
  }
}

TEST(ResumeSpecTest, SurvivesTheJsonRoundTripThatOverridesTake) {
  // resume applies --set through JSON; unset optional fields must stay unset.
  const pb::JobStatus job = StoppedJob(pb::JobStatus::FAILED, "/c/step-2");
  auto spec = ResumeSpec(job);
  ASSERT_THAT(spec, IsOk());
  auto text = coordinator::ApplyOverrides(coordinator::JobSpecToJson(*spec),
                                          {"pipeline.stages=3"});
  ASSERT_THAT(text, IsOk());
  auto back = coordinator::ParseJobSpec(*text);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->pipeline().stages(), 3);
  back->mutable_pipeline()->set_stages(4);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, *spec))
      << back->DebugString() << "\nvs\n" << spec->DebugString();
}

TEST(ResumeSpecTest, RefusesWhatCannotBeResumedSayingWhatToDo) {
  EXPECT_THAT(ResumeSpec(StoppedJob(pb::JobStatus::RUNNING, "/c/step-2")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("job-000007"), HasSubstr("RUNNING"),
                             HasSubstr("pipetrain cancel job-000007"))));
  EXPECT_THAT(ResumeSpec(StoppedJob(pb::JobStatus::QUEUED, "")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("QUEUED")));
  EXPECT_THAT(ResumeSpec(StoppedJob(pb::JobStatus::SUCCEEDED, "/c/step-20")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("succeeded"), HasSubstr("--init-from /c/step-20"))));
  EXPECT_THAT(ResumeSpec(StoppedJob(pb::JobStatus::FAILED, "")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("before its first checkpoint"),
                             HasSubstr("checkpoint.every_steps"))));
  EXPECT_THAT(ResumeSpec(StoppedJob(pb::JobStatus::CANCELLED, "/c/step-20")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("step 20 of 20"), HasSubstr("no steps are left"))));
  for (const char* odd : {"/c/latest", "/c/step-", "/c/step-x3", "/c/step--1"}) {
    EXPECT_THAT(ResumeSpec(StoppedJob(pb::JobStatus::FAILED, odd)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(odd), HasSubstr("--init-from"))))
        << odd;
  }
}

}  // namespace
}  // namespace pipetrain::client
