// pipeline.schedule "auto" at submit (coordinator/auto/auto_schedule.h, stage_calibration.h,
// and the spec's own rules in job_spec.h): the shape it writes is a valid spec that fits
// the stages' memory, the same inputs give the same choice, the record says what won and
// why, a spec that also sets part of the shape is refused naming the field, and
// calibrations are cached per model and device and never when they failed.
#include "coordinator/auto/auto_schedule.h"

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

#include "common/testing/status_matchers.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/auto/stage_calibration.h"
#include "coordinator/stages/stage_costs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

pb::JobSpec AutoSpec() {
  auto spec = ParseJobSpec(R"({
    "model": {"vocab_size": 256, "seq_len": 64, "d_model": 64, "n_heads": 4, "n_layers": 6},
    "pipeline": {"schedule": "auto"},
    "training": {"steps": 4, "batch_size": 16, "lr": 0.01},
    "data": {"corpus": "/tmp/corpus.txt"}})");
  EXPECT_THAT(spec, IsOk());
  return WithDefaults(*spec);
}

std::vector<pb::DeviceInfo> Devices(int n, uint64_t memory_bytes, double flops = 1e12) {
  pb::DeviceInfo d;
  d.set_kind("emulated");
  d.set_name("emulated:test");
  d.set_memory_bytes(memory_bytes);
  d.set_peak_flops(flops);
  return std::vector<pb::DeviceInfo>(n, d);
}

TEST(AutoScheduleTest, WritesAValidShapeThatFitsTheStagesAndSaysWhy) {
  const pb::JobSpec spec = AutoSpec();
  ASSERT_THAT(ValidateJobSpec(spec), IsOk());
  auto choice = ChooseAutoPlan(spec, Devices(4, uint64_t{1} << 30), {std::nullopt, "test rates"});
  ASSERT_THAT(choice, IsOk());
  const pb::PipelineSpec& p = choice->spec.pipeline();
  EXPECT_NE(p.schedule(), kAutoSchedule);
  EXPECT_THAT(ValidateJobSpec(choice->spec), IsOk());
  EXPECT_LE(p.stages() * p.replicas(), 4);
  EXPECT_GT(choice->record.predicted_step_s(), 0);
  EXPECT_GT(choice->record.candidates(), 1);
  EXPECT_EQ(choice->record.cost_source(), "test rates");
  EXPECT_THAT(choice->record.reason(), HasSubstr("shortest predicted step"));
  EXPECT_THAT(choice->record.reason(), HasSubstr("default 1f1b M=K"));
  ASSERT_EQ(choice->log.size(), 2u);
  EXPECT_THAT(choice->log[0], HasSubstr(choice->record.shape()));
  // The chosen shape, planned as the runner will plan it, fits and predicts the same.
  auto options = planner::OptionsFromJobSpec(choice->spec);
  ASSERT_THAT(options, IsOk());
  SetCostsFromDevices(Devices(4, uint64_t{1} << 30), *options);
  auto plan = planner::MakePlan(*options);
  ASSERT_THAT(plan, IsOk());
  EXPECT_DOUBLE_EQ(plan->simulation.step_time_s, choice->record.predicted_step_s());
  // Never slower than the default plan it names.
  EXPECT_LE(choice->record.predicted_step_s(), choice->record.default_step_s());
}

TEST(AutoScheduleTest, TheSameInputsGiveTheSameChoice) {
  const pb::JobSpec spec = AutoSpec();
  auto a = ChooseAutoPlan(spec, Devices(4, uint64_t{1} << 30), {});
  auto b = ChooseAutoPlan(spec, Devices(4, uint64_t{1} << 30), {});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->record.shape(), b->record.shape());
  EXPECT_EQ(a->spec.SerializeAsString(), b->spec.SerializeAsString());
}

TEST(AutoScheduleTest, TightMemoryChoosesAShapeThatFitsOrRefuses) {
  const pb::JobSpec spec = AutoSpec();
  // Find the smallest peak any shape needs on 4 stages, then give the stages just that.
  auto roomy = ChooseAutoPlan(spec, Devices(4, uint64_t{1} << 30), {});
  ASSERT_THAT(roomy, IsOk());
  auto options = planner::OptionsFromJobSpec(WithPlaceholderShape(spec));
  ASSERT_THAT(options, IsOk());
  SetCostsFromDevices(Devices(4, uint64_t{1} << 30), *options);
  auto all = planner::SearchPlans(*options, {.max_devices = 4});
  ASSERT_THAT(all, IsOk());
  double least = all->ranked.front().peak_memory_bytes;
  for (const planner::Candidate& c : all->ranked) least = std::min(least, c.peak_memory_bytes);
  const uint64_t cap = static_cast<uint64_t>(least) + 1;
  auto tight = ChooseAutoPlan(spec, Devices(4, cap), {});
  ASSERT_THAT(tight, IsOk());
  auto tight_options = planner::OptionsFromJobSpec(tight->spec);
  ASSERT_THAT(tight_options, IsOk());
  SetCostsFromDevices(Devices(4, cap), *tight_options);
  EXPECT_THAT(planner::MakePlan(*tight_options), IsOk()) << tight->record.shape();
  EXPECT_THAT(ChooseAutoPlan(spec, Devices(4, 1024), {}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("fits")));
}

TEST(AutoScheduleTest, CalibratedRatesAreWhatItPlansWith) {
  const pb::JobSpec spec = AutoSpec();
  planner::CostRates slow;
  slow.forward_s_per_flop = 1e-9;
  slow.backward_input_s_per_flop = 1e-9;
  slow.backward_weight_s_per_flop = 1e-9;
  planner::CostRates fast = slow;
  fast.forward_s_per_flop = fast.backward_input_s_per_flop = fast.backward_weight_s_per_flop = 1e-12;
  auto a = ChooseAutoPlan(spec, Devices(2, uint64_t{1} << 30), {slow, "slow"});
  auto b = ChooseAutoPlan(spec, Devices(2, uint64_t{1} << 30), {fast, "fast"});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_GT(a->record.predicted_step_s(), 100 * b->record.predicted_step_s());
}

TEST(AutoScheduleTest, RefusesNoStagesAndASpecThatSetsPartOfTheShape) {
  const pb::JobSpec spec = AutoSpec();
  EXPECT_THAT(ChooseAutoPlan(spec, {}, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no free stage")));
  for (const char* field : {"stages", "replicas", "micro_batches", "chunks"}) {
    pb::JobSpec bad = spec;
    const auto* f = bad.pipeline().GetDescriptor()->FindFieldByName(field);
    bad.mutable_pipeline()->GetReflection()->SetInt32(bad.mutable_pipeline(), f, 2);
    EXPECT_THAT(ValidateJobSpec(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr(absl::StrCat("pipeline.", field))));
  }
  pb::JobSpec bad = spec;
  bad.mutable_pipeline()->set_recompute("always");
  EXPECT_THAT(ValidateJobSpec(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("pipeline.recompute")));
  // The rest of the spec is still checked.
  bad = spec;
  bad.mutable_training()->set_steps(0);
  EXPECT_THAT(ValidateJobSpec(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("training.steps")));
}

TEST(AutoScheduleTest, TheRuntimesCostsComeFromTheNewestJobThatMeasuredThem) {
  planner::CostRates calibrated;
  calibrated.forward_s_per_flop = 1e-10;
  AutoCosts costs{calibrated, "calibrated"};
  std::vector<pb::JobStatus> recent(3);
  recent[0].set_job_id("job-3");  // newest, nothing measured yet
  recent[1].set_job_id("job-2");
  recent[1].mutable_measured_costs()->set_steps(5);
  recent[1].mutable_measured_costs()->set_send_busy_s(2e-4);
  recent[1].mutable_measured_costs()->set_recv_busy_s(1e-4);
  recent[1].mutable_measured_costs()->set_transfer_s_per_byte(1e-9);
  recent[2] = recent[1];
  recent[2].set_job_id("job-1");
  recent[2].mutable_measured_costs()->set_send_busy_s(9);
  AddRuntimeCosts(recent, costs);
  EXPECT_DOUBLE_EQ(costs.rates->send_busy_s, 2e-4);
  EXPECT_DOUBLE_EQ(costs.rates->recv_busy_s, 1e-4);
  EXPECT_DOUBLE_EQ(costs.rates->transfer_s_per_byte, 1e-9);
  EXPECT_DOUBLE_EQ(costs.rates->forward_s_per_flop, 1e-10) << "compute stays calibrated";
  EXPECT_THAT(costs.source, HasSubstr("as job-2 measured them"));
  AutoCosts none{std::nullopt, "the devices' FLOP rates"};
  AddRuntimeCosts(recent, none);
  EXPECT_FALSE(none.rates.has_value());
  EXPECT_EQ(none.source, "the devices' FLOP rates");
}

TEST(CalibrationCacheTest, CachesPerModelAndDeviceAndNotAFailure) {
  const pb::JobSpec spec = AutoSpec();
  pb::StageInfo stage;
  stage.set_stage_id("stage-1");
  stage.set_address("127.0.0.1:1");
  *stage.mutable_device() = Devices(1, 1 << 30)[0];
  int calls = 0;
  bool fail = true;
  CalibrationCache cache;
  const auto calibrate = [&](const std::string& address, const pb::CalibrateRequest& request)
      -> absl::StatusOr<pb::CalibrateResponse> {
    ++calls;
    EXPECT_EQ(address, "127.0.0.1:1");
    EXPECT_EQ(request.rows(), 4);
    EXPECT_EQ(request.model().d_model(), 64);
    if (fail) return absl::UnavailableError("down");
    pb::CalibrateResponse r;
    r.set_forward_s_per_flop(1e-10);
    r.set_repetitions(kCalibrationRepetitions);
    return r;
  };
  EXPECT_THAT(cache.Get(spec, {stage}, 1, 4, calibrate),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("stage-1")));
  fail = false;
  auto first = cache.Get(spec, {stage}, 1, 4, calibrate);
  ASSERT_THAT(first, IsOk());
  EXPECT_DOUBLE_EQ(first->rates->forward_s_per_flop, 1e-10);
  EXPECT_THAT(first->source, HasSubstr("calibrated on stage-1"));
  EXPECT_THAT(cache.Get(spec, {stage}, 1, 4, calibrate), IsOk());
  EXPECT_EQ(calls, 2) << "the second success came from the cache";
  pb::StageInfo other = stage;
  other.mutable_device()->set_name("emulated:other");
  EXPECT_THAT(cache.Get(spec, {other}, 1, 4, calibrate), IsOk());
  EXPECT_EQ(calls, 3) << "another device calibrates again";
  EXPECT_NE(CalibrationKey(spec, stage.device(), 4), CalibrationKey(spec, stage.device(), 8));
}

// Four stages on a device of two slots: all four calibrate at once, and what one slot
// takes is half their median (each ran beside three others on two slots).
TEST(CalibrationCacheTest, ADeviceIsTimedWithAllItsStagesBusy) {
  const pb::JobSpec spec = AutoSpec();
  std::vector<pb::StageInfo> stages(4);
  for (int i = 0; i < 4; ++i) {
    stages[i].set_stage_id(absl::StrCat("stage-", i + 1));
    stages[i].set_address(absl::StrCat("127.0.0.1:", i + 1));
    *stages[i].mutable_device() = Devices(1, 1 << 30)[0];
  }
  absl::Mutex mu;
  std::set<std::string> asked;
  int waiting = 0;
  const auto calibrate = [&](const std::string& address, const pb::CalibrateRequest&)
      -> absl::StatusOr<pb::CalibrateResponse> {
    absl::MutexLock lock(&mu);
    asked.insert(address);
    // Every stage is asked before any answers: they run at once.
    ++waiting;
    const bool all = mu.AwaitWithTimeout(absl::Condition(
                                             +[](int* w) { return *w == 4; }, &waiting),
                                         absl::Seconds(30));
    EXPECT_TRUE(all) << "the four calibrations did not run at once";
    pb::CalibrateResponse r;
    r.set_forward_s_per_flop(address == "127.0.0.1:4" ? 9e-10 : 4e-10);
    r.set_repetitions(kCalibrationRepetitions);
    return r;
  };
  CalibrationCache cache;
  auto costs = cache.Get(spec, stages, 2, 4, calibrate);
  ASSERT_THAT(costs, IsOk());
  EXPECT_EQ(asked.size(), 4u);
  EXPECT_DOUBLE_EQ(costs->rates->forward_s_per_flop, 0.5 * 4e-10);
  EXPECT_THAT(costs->source, HasSubstr("4 stages sharing its device busy at once, 2 at full"));
  EXPECT_NE(CalibrationKey(spec, stages[0].device(), 4, 4, 2),
            CalibrationKey(spec, stages[0].device(), 4, 1, 1));
}

TEST(AutoScheduleTest, ARingsTimeGivesTheRateThatPredictsIt) {
  for (int members : {2, 3, 8}) {
    for (double rate : {1e8, 5e9}) {
      const double bytes = 8 << 20;
      const double t = planner::RingAllReduceSeconds(bytes, members, rate);
      EXPECT_NEAR(RingRateFromTime(bytes, members, t) / rate, 1, 1e-9) << members;
    }
  }
  EXPECT_EQ(RingRateFromTime(1 << 20, 4, 0), kFreeCollectiveRate) << "emulated: free";
  // Faster than the call's latency: half the time is taken as moving bytes.
  EXPECT_DOUBLE_EQ(RingRateFromTime(1000, 2, 1e-5), 1000 / 5e-6);
}

TEST(AutoScheduleTest, ARingCalibrationMovesTheModelsGradientsWithinBounds) {
  pb::JobSpec spec = AutoSpec();  // about 0.3 M parameters: 1.3 MB of gradients
  const uint64_t small = RingCalibrationBytes(spec);
  EXPECT_EQ(small % 4, 0u);
  EXPECT_GT(small, uint64_t{1} << 20);
  EXPECT_LT(small, uint64_t{2} << 20);
  spec.mutable_model()->set_n_layers(1);
  spec.mutable_model()->set_vocab_size(8);
  EXPECT_EQ(RingCalibrationBytes(spec), uint64_t{1} << 20) << "at least 1 MiB";
  spec.mutable_model()->set_d_model(1024);
  spec.mutable_model()->set_n_layers(24);
  EXPECT_EQ(RingCalibrationBytes(spec), uint64_t{64} << 20) << "at most 64 MiB";
}

TEST(AutoScheduleTest, ATimedRingIsWhatTheReplicasCost) {
  // The same spec on 4 stages: with the replicas' all-reduce free the plan is at least
  // as fast as with it at 1 MB/s, and the slow ring keeps the search off replicas.
  const pb::JobSpec spec = AutoSpec();
  AutoCosts free_ring{std::nullopt, "free", kFreeCollectiveRate};
  AutoCosts slow_ring{std::nullopt, "slow", 1e6};
  auto a = ChooseAutoPlan(spec, Devices(4, uint64_t{1} << 30), free_ring);
  auto b = ChooseAutoPlan(spec, Devices(4, uint64_t{1} << 30), slow_ring);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_LE(a->record.predicted_step_s(), b->record.predicted_step_s());
  EXPECT_GT(a->spec.pipeline().replicas(), 1) << a->record.shape();
  EXPECT_EQ(b->spec.pipeline().replicas(), 1) << b->record.shape();
}

pb::StageInfo RingStage(int i) {
  pb::StageInfo s;
  s.set_stage_id(absl::StrCat("stage-", i));
  s.set_address(absl::StrCat("127.0.0.1:", 100 + i));
  return s;
}

TEST(CalibrationCacheTest, ARingAsksEveryStageAtOnceAndTakesTheSlowest) {
  const std::vector<pb::StageInfo> stages = {RingStage(0), RingStage(1), RingStage(2)};
  absl::Mutex mu;
  int arrived = 0, calls = 0;
  std::set<int> ranks;
  CalibrationCache cache;
  const auto calibrate = [&](const std::string& address, const pb::CalibrateRequest& request)
      -> absl::StatusOr<pb::CalibrateResponse> {
    absl::MutexLock lock(&mu);
    ++calls;
    ++arrived;
    ranks.insert(request.ring().rank());
    EXPECT_EQ(request.ring().size(), 3);
    EXPECT_EQ(request.ring().bytes(), uint64_t{4} << 20);
    EXPECT_EQ(request.ring().calibration_id(), "calibrate-1");
    EXPECT_EQ(address, stages[request.ring().rank()].address());
    // A ring only meets when every member is in: wait for all three (in time).
    const bool met = mu.AwaitWithTimeout(absl::Condition(
        +[](int* n) { return *n >= 3; }, &arrived), absl::Seconds(20));
    if (!met) return absl::DeadlineExceededError("the ring never met");
    pb::CalibrateResponse r;
    r.set_allreduce_s(request.ring().rank() == 1 ? 0.02 : 0.01);
    return r;
  };
  auto ring = cache.GetRing(stages, uint64_t{4} << 20, "calibrate-1", calibrate);
  ASSERT_THAT(ring, IsOk());
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(ring->bytes_per_s, RingRateFromTime(4 << 20, 3, 0.02)) << "the slowest";
  EXPECT_THAT(ring->source, HasSubstr("3 stages"));
  auto again = cache.GetRing({stages[2], stages[0], stages[1]}, uint64_t{4} << 20,
                             "calibrate-2", calibrate);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(calls, 3) << "the same stages and bytes come from the cache";
}

TEST(CalibrationCacheTest, ARingNamesAFailingStageAndSaysWhenEmulated) {
  const std::vector<pb::StageInfo> stages = {RingStage(0), RingStage(1)};
  CalibrationCache cache;
  bool fail = true;
  const auto calibrate = [&](const std::string&, const pb::CalibrateRequest& request)
      -> absl::StatusOr<pb::CalibrateResponse> {
    if (fail && request.ring().rank() == 1) return absl::UnimplementedError("old stage");
    pb::CalibrateResponse r;
    r.set_emulated(true);
    return r;
  };
  EXPECT_THAT(cache.GetRing(stages, 1 << 20, "calibrate-3", calibrate),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("stage-1")));
  fail = false;
  auto ring = cache.GetRing(stages, 1 << 20, "calibrate-4", calibrate);
  ASSERT_THAT(ring, IsOk()) << "a failure was not cached";
  EXPECT_EQ(ring->bytes_per_s, kFreeCollectiveRate);
  EXPECT_THAT(ring->source, HasSubstr("emulated stages do not reduce"));
  EXPECT_THAT(cache.GetRing({stages[0]}, 1 << 20, "calibrate-5", calibrate),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(AutoScheduleTest, ATransferCalibrationSendsOneMicroBatchsActivations) {
  pb::JobSpec spec = AutoSpec();  // seq 64 x d_model 64, fp32
  EXPECT_EQ(TransferCalibrationBytes(spec, 2), 2u * 64 * 64 * 4);
  EXPECT_EQ(TransferCalibrationBytes(spec, 8), 8u * 64 * 64 * 4);
  spec.mutable_training()->set_precision("bf16");
  EXPECT_EQ(TransferCalibrationBytes(spec, 8), 8u * 64 * 64 * 2) << "the wire's dtype";
  EXPECT_EQ(TransferCalibrationBytes(spec, 0), 64u * 64 * 2) << "at least one row";
  spec.mutable_model()->set_d_model(8);
  EXPECT_EQ(TransferCalibrationBytes(spec, 1), 4096u) << "at least 4 KiB (the row is 1 KiB)";
  spec.mutable_model()->set_d_model(4096);
  spec.mutable_model()->set_seq_len(4096);
  EXPECT_EQ(TransferCalibrationBytes(spec, 64), uint64_t{64} << 20) << "at most 64 MiB";
}

TEST(CalibrationCacheTest, ATransferAsksBothEndsAtOnceAndKeepsTheSendersFigures) {
  const pb::StageInfo sender = RingStage(0), receiver = RingStage(1);
  absl::Mutex mu;
  int arrived = 0, calls = 0;
  bool fail = true;
  CalibrationCache cache;
  const auto calibrate = [&](const std::string& address, const pb::CalibrateRequest& request)
      -> absl::StatusOr<pb::CalibrateResponse> {
    const pb::TransferCalibration& t = request.transfer();
    absl::MutexLock lock(&mu);
    ++calls;
    ++arrived;
    EXPECT_EQ(address, t.send() ? sender.address() : receiver.address());
    EXPECT_EQ(t.peer_address(), t.send() ? receiver.address() : "");
    EXPECT_EQ(t.calibration_id(), "calibrate-link-1");
    EXPECT_EQ(t.peer_secret(), "secret");
    EXPECT_EQ(t.bytes(), 1u << 20);
    // The sender's link only starts once the receiver expects it: both must be in.
    const bool met = mu.AwaitWithTimeout(absl::Condition(
        +[](int* n) { return *n >= 2; }, &arrived), absl::Seconds(20));
    if (!met) return absl::DeadlineExceededError("the other end never came");
    if (fail && !t.send()) return absl::UnavailableError("receiver gone");
    pb::CalibrateResponse r;
    if (t.send()) {
      r.set_transfer_s_per_byte(1e-9);
      r.set_send_busy_s(2e-4);
    }
    return r;
  };
  EXPECT_THAT(cache.GetTransfer(sender, receiver, 1 << 20, "calibrate-link-1", "secret",
                                calibrate),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("stage-1")));
  fail = false;
  arrived = 0;
  auto t = cache.GetTransfer(sender, receiver, 1 << 20, "calibrate-link-1", "secret", calibrate);
  ASSERT_THAT(t, IsOk()) << "a failure was not cached";
  EXPECT_DOUBLE_EQ(t->transfer_s_per_byte, 1e-9);
  EXPECT_DOUBLE_EQ(t->send_busy_s, 2e-4);
  EXPECT_THAT(t->source, HasSubstr("1 GB/s"));
  EXPECT_THAT(t->source, HasSubstr("from stage-0 to stage-1"));
  auto again = cache.GetTransfer(sender, receiver, 1 << 20, "calibrate-link-2", "other",
                                 calibrate);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(calls, 4) << "the same pair and bytes come from the cache";
}

}  // namespace
}  // namespace pipetrain::coordinator
