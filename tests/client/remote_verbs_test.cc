// The remote verbs through RunCli against an in-process fake coordinator: what each
// prints, the exit codes, and what reached the coordinator.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "tests/testing/run_cli.h"
#include "coordinator/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_coordinator.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::FakeCoordinator;
using ::pipetrain::testing::TestServer;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kExample = std::string(PIPETRAIN_EXAMPLES_DIR) + "/tiny-gpt.json";

using Result = ::pipetrain::testing::CliRun;
using ::pipetrain::testing::Cli;

pb::JobEvent StepEvent(int64_t step, double loss, bool val = false) {
  pb::JobEvent e;
  pb::StepRecord* s = e.mutable_step();
  s->set_step(step);
  s->set_loss(loss);
  s->set_step_time_s(0.5);
  s->set_tokens_per_s(4210);
  s->set_bubble_measured(0.2);
  s->set_bubble_predicted(0.18);
  if (val) {
    s->set_has_val_loss(true);
    s->set_val_loss(loss + 0.1);
  }
  return e;
}

pb::JobEvent StateEvent(pb::JobStatus::State state, const std::string& reason = "") {
  pb::JobEvent e;
  pb::JobStatus* j = e.mutable_state_change();
  j->set_job_id("job-000001");
  j->mutable_spec()->mutable_training()->set_steps(3);
  j->set_state(state);
  j->set_reason(reason);
  j->set_steps_done(state == pb::JobStatus::SUCCEEDED ? 3 : 1);
  if (state == pb::JobStatus::SUCCEEDED) j->set_checkpoint_dir("/ckpt/job-000001/step-3");
  return e;
}

pb::JobEvent LogEvent(const std::string& text, int64_t seconds = 1714564803) {
  pb::JobEvent e;
  e.mutable_log()->set_text(text);
  e.mutable_log()->mutable_time()->set_seconds(seconds);
  e.mutable_log()->mutable_time()->set_nanos(250'000'000);
  return e;
}

class RemoteVerbsTest : public ::testing::Test {
 protected:
  FakeCoordinator fake_;
  TestServer server_{&fake_};
  const std::string& addr() const { return server_.address(); }
};

TEST_F(RemoteVerbsTest, SubmitNoWaitPrintsOnlyTheIdAndSendsTheOverriddenSpec) {
  Result r = Cli({"submit", kExample, "--set", "pipeline.stages=2", "--set=name=run 7",
                  "--init-from", "/ckpt/old", "--no-wait", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job-000001\n");
  ASSERT_EQ(fake_.submitted().size(), 1u);
  const pb::JobSpec spec = fake_.submitted()[0];
  EXPECT_EQ(spec.pipeline().stages(), 2);
  EXPECT_EQ(spec.pipeline().micro_batches(), 8);  // the rest is the file's
  EXPECT_EQ(spec.name(), "run 7");
  EXPECT_EQ(spec.init_from(), "/ckpt/old");
  EXPECT_TRUE(fake_.watches().empty());
}

TEST_F(RemoteVerbsTest, SubmitFollowsToSucceededAndSummarises) {
  fake_.events = {StateEvent(pb::JobStatus::RUNNING), LogEvent("planned 4 stages"),
                  StepEvent(1, 5.5), StepEvent(2, 4.25), StepEvent(3, 3.125, true),
                  StateEvent(pb::JobStatus::SUCCEEDED)};
  Result r = Cli({"submit", kExample, "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("submitted job-000001 (tiny-gpt on the King James Bible)"));
  EXPECT_THAT(r.out, HasSubstr("planned 4 stages\n"));
  EXPECT_THAT(r.out, HasSubstr("step 3/3 loss 3.125 (val 3.225)  4,210 tok/s  bubble 0.20 "
                               "(predicted 0.18)"));
  EXPECT_THAT(r.out, Not(HasSubstr("\r")));  // not a terminal: plain lines
  EXPECT_THAT(r.out, HasSubstr("job-000001 SUCCEEDED: 3 of 3 steps"));
  EXPECT_THAT(r.out, HasSubstr("final loss       3.1250 (step 3)"));
  EXPECT_THAT(r.out, HasSubstr("validation loss  3.2250 (step 3)"));
  EXPECT_THAT(r.out, HasSubstr("throughput       4,210 tok/s (mean)"));
  EXPECT_THAT(r.out, HasSubstr("bubble           0.20 measured, 0.18 predicted (mean)"));
  EXPECT_THAT(r.out, HasSubstr("checkpoint       /ckpt/job-000001/step-3"));
  ASSERT_EQ(fake_.watches().size(), 1u);
  EXPECT_EQ(fake_.watches()[0].job_id(), "job-000001");
  EXPECT_FALSE(fake_.watches()[0].no_follow());
}

TEST_F(RemoteVerbsTest, SubmitOfAJobThatFailsExitsOneWithTheReason) {
  fake_.events = {StepEvent(1, 5.5),
                  StateEvent(pb::JobStatus::FAILED, "stage stage-2 missed its heartbeats")};
  Result r = Cli({"submit", kExample, "--address", addr()});
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.out, HasSubstr("job-000001 FAILED"));
  EXPECT_THAT(r.out, HasSubstr("reason           stage stage-2 missed its heartbeats"));
}

TEST_F(RemoteVerbsTest, StreamEndingWithoutAFinalStateAsksForTheJob) {
  fake_.events = {StepEvent(1, 5.5)};
  fake_.job = StateEvent(pb::JobStatus::SUCCEEDED).state_change();
  Result r = Cli({"submit", kExample, "--address", addr()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job-000001 SUCCEEDED"));
  ASSERT_EQ(fake_.gets().size(), 1u);

  fake_.job.set_state(pb::JobStatus::RUNNING);  // still running: say so, exit 3
  r = Cli({"submit", kExample, "--address", addr()});
  EXPECT_EQ(r.code, kExitUnreachable);
  EXPECT_THAT(r.err, AllOf(HasSubstr("the event stream ended before the job did"),
                           HasSubstr("may still be running")));
}

TEST_F(RemoteVerbsTest, SubmitJsonPrintsEveryEventAsOneLine) {
  fake_.events = {StepEvent(1, 5.5), StateEvent(pb::JobStatus::CANCELLED, "by alice")};
  Result r = Cli({"submit", kExample, "--json", "--address", addr()});
  EXPECT_EQ(r.code, kExitJobFailed);
  std::istringstream lines(r.out);
  std::string line;
  std::vector<nlohmann::json> parsed;
  while (std::getline(lines, line)) parsed.push_back(nlohmann::json::parse(line, nullptr, false));
  ASSERT_EQ(parsed.size(), 2u) << r.out;
  EXPECT_EQ(parsed[0]["step"]["step"], "1");  // int64 is a string in the proto JSON mapping
  EXPECT_EQ(parsed[1]["state_change"]["state"], "CANCELLED");

  r = Cli({"submit", kExample, "--json", "--no-wait", "--address", addr()});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(nlohmann::json::parse(r.out, nullptr, false)["job_id"], "job-000001");
}

TEST_F(RemoteVerbsTest, InvalidSpecsExitTwoWithoutContactingTheCoordinator) {
  ::pipetrain::testing::TempDir dir;
  const std::string bad = dir.File("bad.json");
  ::pipetrain::testing::WriteFileOrDie(bad, R"({"pipeline": {"stagse": 2}})");
  Result r = Cli({"submit", bad, "--address", addr()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, AllOf(HasSubstr("invalid job spec"), HasSubstr("'pipeline.stagse'")));

  r = Cli({"submit", kExample, "--set", "training.lr=0", "--address", addr()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("training.lr"));

  r = Cli({"submit", kExample, "--set", "pipeline.stages", "--address", addr()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("no '='"));

  r = Cli({"submit", dir.File("missing.json"), "--address", addr()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("cannot read"));
  EXPECT_EQ(fake_.calls(), 0);
}

TEST_F(RemoteVerbsTest, SpecTheCoordinatorRejectsExitsTwo) {
  fake_.submit_status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "pipeline.stages: 4 stages asked, 2 registered");
  Result r = Cli({"submit", kExample, "--address", addr()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("pipetrain submit: invalid job spec: pipeline.stages: 4 stages"));
}

TEST_F(RemoteVerbsTest, LosingTheCoordinatorWhileFollowingExitsThree) {
  fake_.events = {StepEvent(1, 5.5)};
  fake_.watch_end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
  Result r = Cli({"submit", kExample, "--address", addr()});
  EXPECT_EQ(r.code, kExitUnreachable);
  EXPECT_THAT(r.err, AllOf(HasSubstr("lost the coordinator"), HasSubstr("may still be running"),
                           HasSubstr("pipetrain status job-000001")));
}

TEST(RemoteVerbsUnreachableTest, NobodyListeningExitsThreeSayingWhatToDo) {
  const std::string address = ::pipetrain::testing::UnusedAddress();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"submit", kExample, "--no-wait"},
        std::vector<std::string>{"status", "job-000001"}, std::vector<std::string>{"list"},
        std::vector<std::string>{"logs", "job-000001"}}) {
    std::vector<std::string> with = args;
    with.insert(with.end(), {"--address", address});
    Result r = Cli(with);
    EXPECT_EQ(r.code, kExitUnreachable) << args[0] << ": " << r.err;
    EXPECT_THAT(r.err, AllOf(HasSubstr("pipetrain " + args[0] + ": cannot reach the "
                                       "coordinator at " + address),
                             HasSubstr("deploy/local/cluster.sh up"),
                             HasSubstr("PIPETRAIN_ADDRESS")));
  }
}

TEST_F(RemoteVerbsTest, AddressComesFromTheEnvironmentWhenNotGiven) {
  setenv("PIPETRAIN_ADDRESS", addr().c_str(), 1);
  Result r = Cli({"list"});
  unsetenv("PIPETRAIN_ADDRESS");
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(fake_.calls(), 1);
  r = Cli({"list", "--address", "host:notaport"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--address 'host:notaport' is not HOST:PORT"));
}

// The example spec as the coordinator stores a job's: parsed, with defaults.
pb::JobSpec StoredExampleSpec() {
  std::ifstream in(kExample);
  std::stringstream text;
  text << in.rdbuf();
  auto spec = coordinator::ParseJobSpec(text.str());
  EXPECT_TRUE(spec.ok()) << spec.status();
  return coordinator::WithDefaults(spec.ok() ? *spec : pb::JobSpec());
}

TEST_F(RemoteVerbsTest, ResumeSubmitsTheStepsLeftFromTheCheckpointAndFollows) {
  fake_.job.set_job_id("job-000001");
  fake_.job.set_state(pb::JobStatus::FAILED);
  fake_.job.set_reason("stage 2 stopped answering");
  *fake_.job.mutable_spec() = StoredExampleSpec();
  const int planned = fake_.job.spec().training().steps();
  ASSERT_GT(planned, 40);
  fake_.job.set_checkpoint_dir("/state/checkpoints/job-000001/step-40");
  fake_.events = {StateEvent(pb::JobStatus::RUNNING), StepEvent(1, 2.5),
                  StateEvent(pb::JobStatus::SUCCEEDED)};
  Result r = Cli({"resume", "job-000001", "--set", "pipeline.stages=3", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("resuming job-000001 from "
                                            "/state/checkpoints/job-000001/step-40: ",
                                            planned - 40, " steps left")));
  EXPECT_THAT(r.out, HasSubstr("job-000001 SUCCEEDED"));
  ASSERT_EQ(fake_.submitted().size(), 1u);
  const pb::JobSpec sent = fake_.submitted()[0];
  EXPECT_EQ(sent.init_from(), "/state/checkpoints/job-000001/step-40");
  EXPECT_EQ(sent.training().steps(), planned - 40);
  EXPECT_EQ(sent.pipeline().stages(), 3) << "--set applies to the resumed spec";
  EXPECT_EQ(sent.name(), fake_.job.spec().name());
  EXPECT_EQ(sent.training().lr(), fake_.job.spec().training().lr());
  EXPECT_EQ(sent.data().corpus(), fake_.job.spec().data().corpus());
}

TEST_F(RemoteVerbsTest, ResumeOfARunningJobExitsTwoAndSubmitsNothing) {
  fake_.job.set_job_id("job-000001");
  fake_.job.set_state(pb::JobStatus::RUNNING);
  *fake_.job.mutable_spec() = StoredExampleSpec();
  fake_.job.set_checkpoint_dir("/state/checkpoints/job-000001/step-40");
  Result r = Cli({"resume", "job-000001", "--address", addr()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, AllOf(HasSubstr("pipetrain resume: job-000001 has not stopped"),
                           HasSubstr("pipetrain cancel job-000001")));
  EXPECT_TRUE(fake_.submitted().empty());
}

TEST_F(RemoteVerbsTest, UnknownJobsExitTwoPointingAtList) {
  for (const std::string verb : {"status", "cancel", "logs", "resume"}) {
    Result r = Cli({verb, "job-9", "--address", addr()});
    EXPECT_EQ(r.code, kExitUsage) << verb;
    EXPECT_THAT(r.err, AllOf(HasSubstr("job 'job-9' not found"),
                             HasSubstr("'pipetrain list' shows the jobs")));
  }
}

}  // namespace
}  // namespace pipetrain::client
