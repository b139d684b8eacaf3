// `pipetrain plan --costs-from JOB_ID`: the measured job's costs from its timeline, the
// plans they give for the same shape and for others, and the verb against an in-process
// fake coordinator.
#include "client/costs_from.h"

#include <cmath>
#include <fstream>

#include "common/schedule/stage_program.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_coordinator.h"
#include "tests/testing/run_cli.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::Cli;
using ::pipetrain::testing::FakeCoordinator;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TestServer;
using ::testing::HasSubstr;

constexpr double kDeviceFlops = 3e9, kLinkBytesPerS = 4e8;

pb::JobStatus Job() {
  pb::JobStatus j;
  j.set_job_id("job-000007");
  pb::JobSpec& s = *j.mutable_spec();
  s.mutable_model()->set_vocab_size(256);
  s.mutable_model()->set_seq_len(64);
  s.mutable_model()->set_d_model(128);
  s.mutable_model()->set_n_heads(4);
  s.mutable_model()->set_n_layers(6);
  s.mutable_pipeline()->set_stages(2);
  s.mutable_pipeline()->set_micro_batches(4);
  s.mutable_pipeline()->set_schedule("1f1b");
  s.mutable_training()->set_batch_size(8);
  s.mutable_training()->set_steps(10);
  j.set_state(pb::JobStatus::SUCCEEDED);
  return j;
}

// The job's steps as its stages would have reported them on a device of kDeviceFlops;
// step 1 twice as slow (a cold start the fit must leave out).
pb::Timeline TimelineOf(const pb::JobStatus& job, int steps) {
  planner::PlanOptions o = *planner::OptionsFromJobSpec(job.spec());
  o.device_flops = kDeviceFlops;
  o.link_bytes_per_s = kLinkBytesPerS;
  const planner::Plan plan = *planner::MakePlan(o);
  pb::Timeline t;
  t.set_job_id(job.job_id());
  for (int step = 1; step <= steps; ++step) {
    const double slow = step == 1 ? 2.0 : 1.0;
    const planner::SimulationResult sim = *planner::Simulate(plan.programs, plan.costs);
    for (const planner::TimelineEvent& e : sim.events) {
      pb::TimelineEvent* x = t.add_events();
      x->set_step(step);
      x->set_stage(e.stage);
      *x->mutable_action() = schedule::ActionToProto(e.action);
      x->set_start_us(std::llround(e.start_s * slow * 1e6));
      x->set_end_us(std::llround(e.end_s * slow * 1e6));
      const planner::ChunkCost& c = plan.costs.chunks[e.stage][e.action.chunk];
      if (e.action.kind == schedule::ActionKind::kSendActivation)
        x->set_bytes(std::llround(c.send_activation_s * kLinkBytesPerS));
      if (e.action.kind == schedule::ActionKind::kSendGradient)
        x->set_bytes(std::llround(c.send_gradient_s * kLinkBytesPerS));
    }
  }
  return t;
}

planner::Plan TruePlan(planner::PlanOptions o) {
  o.device_flops = kDeviceFlops;
  o.link_bytes_per_s = kLinkBytesPerS;
  return *planner::MakePlan(o);
}

TEST(CostsFromTest, LeavesTheFirstStepOutAndPredictsTheSameShapeAsMeasured) {
  const pb::JobStatus job = Job();
  absl::StatusOr<MeasuredJob> m = MeasuredJobFrom(job, TimelineOf(job, 3));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->first_step, 2);
  EXPECT_EQ(m->last_step, 3);
  EXPECT_EQ(m->costs.steps(), 2);
  EXPECT_NEAR(m->rates.forward_s_per_flop * kDeviceFlops, 1, 1e-3);

  const planner::PlanOptions same = *planner::OptionsFromJobSpec(job.spec());
  absl::StatusOr<planner::Plan> p = PlanWithMeasuredCosts(same, *m);
  ASSERT_TRUE(p.ok()) << p.status();
  const planner::Plan truth = TruePlan(same);
  EXPECT_NEAR(p->simulation.step_time_s / truth.simulation.step_time_s, 1, 1e-3);
  EXPECT_NEAR(p->simulation.bubble_fraction, truth.simulation.bubble_fraction, 1e-3);
}

TEST(CostsFromTest, PredictsOtherSchedulesStagesAndMicroBatches) {
  const pb::JobStatus job = Job();
  absl::StatusOr<MeasuredJob> m = MeasuredJobFrom(job, TimelineOf(job, 4));
  ASSERT_TRUE(m.ok()) << m.status();
  pb::JobSpec other = job.spec();
  other.mutable_pipeline()->set_schedule("zb-h1");
  other.mutable_pipeline()->set_stages(4);
  other.mutable_pipeline()->set_micro_batches(8);
  const planner::PlanOptions o = *planner::OptionsFromJobSpec(other);
  absl::StatusOr<planner::Plan> p = PlanWithMeasuredCosts(o, *m);
  ASSERT_TRUE(p.ok()) << p.status();
  const planner::Plan truth = TruePlan(o);
  EXPECT_NEAR(p->simulation.step_time_s / truth.simulation.step_time_s, 1, 2e-3);
  EXPECT_NEAR(p->simulation.bubble_fraction, truth.simulation.bubble_fraction, 2e-3);
}

TEST(CostsFromTest, AJobWithoutATimelineSaysWhy) {
  pb::Timeline empty;
  EXPECT_THAT(MeasuredJobFrom(Job(), empty),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--costs-from job-000007: the coordinator has no timeline")));
  pb::JobStatus bad = Job();
  bad.mutable_spec()->mutable_pipeline()->set_schedule("");
  EXPECT_THAT(MeasuredJobFrom(bad, TimelineOf(Job(), 2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.schedule")));
  // A timeline of 4 stages for a job of 2.
  pb::Timeline wide = TimelineOf(Job(), 2);
  wide.mutable_events(wide.events_size() - 1)->set_stage(3);  // a step kept
  EXPECT_THAT(MeasuredJobFrom(Job(), wide),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 3")));
}

// Without a timeline (a coordinator restarted since), the rates stored with the job.
TEST(CostsFromTest, FallsBackToTheRatesRecordedWithTheJob) {
  pb::JobStatus job = Job();
  absl::StatusOr<MeasuredJob> fresh = MeasuredJobFrom(job, TimelineOf(job, 3));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  pb::MeasuredCostRates& r = *job.mutable_measured_costs();
  r.set_forward_s_per_flop(fresh->rates.forward_s_per_flop);
  r.set_backward_input_s_per_flop(fresh->rates.backward_input_s_per_flop);
  r.set_backward_weight_s_per_flop(fresh->rates.backward_weight_s_per_flop);
  r.set_transfer_s_per_byte(fresh->rates.transfer_s_per_byte);
  r.set_steps(5);
  r.set_first_step(6);
  r.set_last_step(10);
  absl::StatusOr<MeasuredJob> m = MeasuredJobFrom(job, pb::Timeline());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->from_record);
  EXPECT_EQ(m->first_step, 6);
  EXPECT_EQ(m->last_step, 10);
  EXPECT_THAT(DescribeMeasured("job-000007", *m), HasSubstr("steps 6-10, as recorded with the job"));
  // The same shape plans with the rates (no per-chunk figures): the true step again.
  const planner::PlanOptions same = *planner::OptionsFromJobSpec(job.spec());
  absl::StatusOr<planner::Plan> p = PlanWithMeasuredCosts(same, *m);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->simulation.step_time_s / TruePlan(same).simulation.step_time_s, 1, 2e-3);
}

TEST(CostsFromTest, PlanVerbUsesTheJobsCostsFromTheCoordinator) {
  FakeCoordinator fake;
  fake.job_id = "job-000007";
  fake.job = Job();
  fake.timeline = TimelineOf(fake.job, 3);
  TestServer server(&fake);
  pipetrain::testing::TempDir dir;
  pb::JobSpec spec = fake.job.spec();
  spec.mutable_pipeline()->set_schedule("gpipe");
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json).ok());
  const std::string path = dir.path() + "/job.json";
  std::ofstream(path) << json;

  auto r = Cli({"plan", path, "--costs-from", "job-000007", "--address", server.address()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Costs measured on job-000007 (steps 2-3: 2 stages, 1f1b, 4 "
                               "micro-batches): forward 3 GFLOP/s"));
  EXPECT_THAT(r.out, HasSubstr("Costs: measured on a job's 2 latest steps (--costs-from)"));
  ASSERT_EQ(fake.timeline_requests().size(), 1u);
  EXPECT_EQ(fake.timeline_requests()[0].job_id(), "job-000007");

  r = Cli({"plan", path, "--costs-from", "job-000007", "--json", "--address", server.address()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schedule"], "gpipe");
  EXPECT_NEAR(j["measured_rates"]["forward_s_per_flop"].get<double>() * kDeviceFlops, 1, 1e-3);

  // Another model than the measured one: a warning, and the rates as they are.
  spec.mutable_model()->set_n_layers(8);
  json.clear();
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json).ok());
  std::ofstream(path, std::ios::trunc) << json;
  r = Cli({"plan", path, "--costs-from", "job-000007", "--address", server.address()});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.err, HasSubstr("warning: job-000007 trained another model"));

  fake.timeline.clear_events();
  r = Cli({"plan", path, "--costs-from", "job-000007", "--address", server.address()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("has no timeline"));
  r = Cli({"plan", path, "--costs-from", "job-000099", "--address", server.address()});
  EXPECT_EQ(r.code, kExitUsage);  // NOT_FOUND from the coordinator
}

}  // namespace
}  // namespace pipetrain::client
