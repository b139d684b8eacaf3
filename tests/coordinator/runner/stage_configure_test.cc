// What the job runner tells each stage before its first step (BuildConfigureRequest,
// OptimizerFromSpec) and the costs it plans with (SetCostsFromDevices), as pure
// functions of the plan, the spec and the stages' devices.
#include "coordinator/runner/stage_configure.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "coordinator/stages/stage_costs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::testing::ElementsAre;

planner::Plan MakeTestPlan(int stages, int chunks, planner::ScheduleKind schedule,
                           pb::RecomputeMode recompute = pb::RECOMPUTE_NEVER) {
  planner::PlanOptions o;
  o.model = {.vocab_size = 256, .seq_len = 16, .d_model = 32, .n_heads = 2, .n_layers = 6};
  o.stages = stages;
  o.chunks = chunks;
  o.micro_batches = 4;
  o.batch_size = 8;
  o.schedule = schedule;
  o.recompute = recompute;
  auto plan = planner::MakePlan(o);
  EXPECT_THAT(plan, IsOk());
  return plan.ok() ? *plan : planner::Plan{};
}

StageWiring Wiring(int stages) {
  StageWiring w{"job-7", {}, "s3cret", 1234};
  for (int s = 0; s < stages; ++s) w.addresses.push_back("10.0.0." + std::to_string(s) + ":7401");
  return w;
}

TEST(StageConfigureTest, EveryStageGetsItsLayersModelAndRunSettings) {
  const planner::Plan plan = MakeTestPlan(3, 1, planner::ScheduleKind::kOneFOneB,
                                          pb::RECOMPUTE_ALWAYS);
  pb::OptimizerConfig adam;
  adam.set_lr(0.01f);
  int covered = 0;
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE(s);
    const pb::ConfigureRequest r = BuildConfigureRequest(plan, s, 99, adam, Wiring(3));
    EXPECT_EQ(r.job_id(), "job-7");
    EXPECT_EQ(r.stage(), s);
    EXPECT_EQ(r.num_stages(), 3);
    EXPECT_EQ(r.model().n_layers(), 6);
    EXPECT_EQ(r.model().d_model(), 32);
    EXPECT_EQ(r.seed(), 99u);
    EXPECT_EQ(r.optimizer().lr(), 0.01f);
    EXPECT_THAT(r.chunk_recompute(), ElementsAre(true));  // always: every chunk
    EXPECT_EQ(r.micro_batch_size(), 2);
    EXPECT_EQ(r.peer_secret(), "s3cret");
    EXPECT_EQ(r.recv_deadline_ms(), 1234);
    ASSERT_EQ(r.chunks_size(), 1);
    EXPECT_EQ(r.chunks(0).chunk(), 0);
    EXPECT_EQ(r.chunks(0).begin_layer(), plan.stages[s].chunks[0].first);
    EXPECT_EQ(r.chunks(0).end_layer(), plan.stages[s].chunks[0].second);
    EXPECT_EQ(r.chunks(0).begin_layer(), covered);  // contiguous, in stage order
    covered = r.chunks(0).end_layer();
  }
  EXPECT_EQ(covered, 8);  // embedding, 6 blocks, head
}

// The stages form a ring: an interleaved schedule's last stage sends its chunk's output
// on to the first stage's next chunk.
TEST(StageConfigureTest, NeighboursAreTheRingOfStages) {
  const planner::Plan plan = MakeTestPlan(3, 1, planner::ScheduleKind::kGpipe);
  const StageWiring w = Wiring(3);
  const pb::ConfigureRequest first = BuildConfigureRequest(plan, 0, 1, {}, w);
  EXPECT_EQ(first.upstream_address(), w.addresses[2]);
  EXPECT_EQ(first.downstream_address(), w.addresses[1]);
  const pb::ConfigureRequest last = BuildConfigureRequest(plan, 2, 1, {}, w);
  EXPECT_EQ(last.upstream_address(), w.addresses[1]);
  EXPECT_EQ(last.downstream_address(), w.addresses[0]);
}

TEST(StageConfigureTest, OneStageHasNoNeighbours) {
  const planner::Plan plan = MakeTestPlan(1, 1, planner::ScheduleKind::kGpipe);
  const pb::ConfigureRequest r = BuildConfigureRequest(plan, 0, 1, {}, Wiring(1));
  EXPECT_EQ(r.upstream_address(), "");
  EXPECT_EQ(r.downstream_address(), "");
}

TEST(StageConfigureTest, AnInterleavedStageGetsOneRangePerChunk) {
  const planner::Plan plan = MakeTestPlan(2, 2, planner::ScheduleKind::kInterleaved);
  const pb::ConfigureRequest r = BuildConfigureRequest(plan, 1, 1, {}, Wiring(2));
  ASSERT_EQ(r.chunks_size(), 2);
  for (int c = 0; c < 2; ++c) {
    EXPECT_EQ(r.chunks(c).chunk(), c);
    EXPECT_EQ(r.chunks(c).begin_layer(), plan.stages[1].chunks[c].first);
    EXPECT_EQ(r.chunks(c).end_layer(), plan.stages[1].chunks[c].second);
  }
}

// Each stage is told the plan's yes/no for each of its chunks and decides nothing itself:
// under except-last with interleaved chunks, neither chunk of the last stage recomputes.
TEST(StageConfigureTest, EachStageGetsThePlansRecomputationPerChunk) {
  const planner::Plan plan =
      MakeTestPlan(2, 2, planner::ScheduleKind::kInterleaved, pb::RECOMPUTE_EXCEPT_LAST);
  ASSERT_EQ(plan.stages.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    const pb::ConfigureRequest r = BuildConfigureRequest(plan, s, 1, {}, Wiring(2));
    ASSERT_EQ(r.chunk_recompute_size(), r.chunks_size()) << s;
    for (int c = 0; c < r.chunk_recompute_size(); ++c) {
      EXPECT_EQ(r.chunk_recompute(c), plan.stages[s].chunk_recompute[c]) << s << " " << c;
    }
  }
  EXPECT_THAT(BuildConfigureRequest(plan, 0, 1, {}, Wiring(2)).chunk_recompute(),
              ElementsAre(true, true));
  EXPECT_THAT(BuildConfigureRequest(plan, 1, 1, {}, Wiring(2)).chunk_recompute(),
              ElementsAre(false, false));
  const planner::Plan never = MakeTestPlan(2, 1, planner::ScheduleKind::kOneFOneB);
  EXPECT_THAT(BuildConfigureRequest(never, 0, 1, {}, Wiring(2)).chunk_recompute(),
              ElementsAre(false));
}

TEST(StageConfigureTest, TheOptimizerIsTheSpecsWithPyTorchsEpsilon) {
  pb::TrainingSpec t;
  t.set_lr(3e-4f);
  t.set_beta1(0.8f);
  t.set_beta2(0.9f);
  t.set_weight_decay(0.05f);
  t.set_grad_clip_norm(1.5f);
  const pb::OptimizerConfig o = OptimizerFromSpec(t);
  EXPECT_EQ(o.lr(), 3e-4f);
  EXPECT_EQ(o.beta1(), 0.8f);
  EXPECT_EQ(o.beta2(), 0.9f);
  EXPECT_EQ(o.weight_decay(), 0.05f);
  EXPECT_EQ(o.grad_clip_norm(), 1.5f);
  EXPECT_EQ(o.eps(), 1e-8f);
}

TEST(StageCostsTest, TheSlowestStageSetsTheRate) {
  std::vector<pb::DeviceInfo> devices(3);
  devices[0].set_peak_flops(400e12);
  devices[1].set_threads(4);  // a CPU: 10 GFLOP/s a thread
  devices[2].set_peak_flops(100e12);
  planner::PlanOptions o;
  SetCostsFromDevices(devices, o);
  EXPECT_DOUBLE_EQ(o.device_flops, 40e9);
  EXPECT_DOUBLE_EQ(o.link_bytes_per_s, 1e9);

  devices.erase(devices.begin() + 1);
  SetCostsFromDevices(devices, o);
  EXPECT_DOUBLE_EQ(o.device_flops, 100e12);
}

TEST(StageCostsTest, ACpuWithoutAThreadCountCountsAsOneThread) {
  std::vector<pb::DeviceInfo> devices(1);
  planner::PlanOptions o;
  SetCostsFromDevices(devices, o);
  EXPECT_DOUBLE_EQ(o.device_flops, 10e9);
}

TEST(StageCostsTest, TheSmallestStageMemoryCapsThePartition) {
  std::vector<pb::DeviceInfo> devices(3);
  devices[0].set_memory_bytes(80ull << 30);   // a GPU's whole memory
  devices[1].set_memory_bytes(256ull << 20);  // a CPU stage's --memory-limit
  devices[2].set_memory_bytes(1ull << 30);
  planner::PlanOptions o;
  SetCostsFromDevices(devices, o);
  EXPECT_DOUBLE_EQ(o.memory_cap_bytes, 256.0 * (1 << 20));

  devices.erase(devices.begin() + 1);
  SetCostsFromDevices(devices, o);
  EXPECT_DOUBLE_EQ(o.memory_cap_bytes, 1.0 * (1 << 30));
}

TEST(StageCostsTest, AStageOfUnknownMemoryLeavesTheCapOff) {
  std::vector<pb::DeviceInfo> devices(2);
  devices[0].set_memory_bytes(256ull << 20);  // devices[1] says nothing: no --memory-limit
  planner::PlanOptions o;
  o.memory_cap_bytes = 1e9;  // whatever was there before is replaced
  SetCostsFromDevices(devices, o);
  EXPECT_DOUBLE_EQ(o.memory_cap_bytes, 0);
}

// What the cap is for: the coordinator's plan is then made within the stages' memory,
// and a model that cannot fit is refused by the planner, naming the stage and figures.
TEST(StageCostsTest, WithTheStagesMemoryTheTooBigModelIsRefusedByThePlanner) {
  planner::PlanOptions o;
  o.model = {.vocab_size = 256, .seq_len = 16, .d_model = 64, .n_heads = 2, .n_layers = 8};
  o.stages = 2;
  o.micro_batches = 4;
  o.batch_size = 8;
  o.schedule = planner::ScheduleKind::kGpipe;
  auto uncapped = planner::MakePlan(o);
  ASSERT_THAT(uncapped, IsOk());
  double need = 0;
  for (const planner::StagePlan& s : uncapped->stages)
    need = std::max(need, s.state_bytes + s.peak_activation_bytes);

  std::vector<pb::DeviceInfo> devices(2);
  for (pb::DeviceInfo& d : devices) d.set_memory_bytes(static_cast<uint64_t>(need / 4));
  SetCostsFromDevices(devices, o);
  auto refused = planner::MakePlan(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("does not fit"));

  for (pb::DeviceInfo& d : devices) d.set_memory_bytes(static_cast<uint64_t>(need * 2));
  SetCostsFromDevices(devices, o);
  auto fits = planner::MakePlan(o);
  ASSERT_THAT(fits, IsOk());
  for (const planner::StagePlan& s : fits->stages)
    EXPECT_LE(s.state_bytes + s.peak_activation_bytes, need * 2) << "stage " << s.stage;
}

}  // namespace
}  // namespace pipetrain::coordinator
