#include "coordinator/planner/shared_devices.h"

#include "common/testing/status_matchers.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SharedDevicesTest, StagesOfOneReplicaShareTheSlots) {
  // K = 4 on a host of 2 slots: two of them compute at once, at full speed.
  const ReplicaDevices r = ForReplica(EvenlyShared(4, 4, 2), 4, 1);
  EXPECT_THAT(r.device_of_stage, ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(r.slots, ElementsAre(2));
  EXPECT_THAT(r.slowdown, ElementsAre(1, 1, 1, 1));
  EXPECT_THAT(r.shared_name, ElementsAre("device 0"));
}

TEST(SharedDevicesTest, ReplicasOnOneDeviceSlowEachOther) {
  // K = 1, R = 4 on 2 slots: the four copies compute in step, two slots' worth between
  // them, so the one simulated runs at half speed.
  const ReplicaDevices four = ForReplica(EvenlyShared(4, 4, 2), 1, 4);
  EXPECT_THAT(four.slots, ElementsAre(1));
  EXPECT_THAT(four.slowdown, ElementsAre(2));
  // K = 2, R = 2 on 2 slots: one slot's worth for each replica's two stages.
  const ReplicaDevices two = ForReplica(EvenlyShared(4, 4, 2), 2, 2);
  EXPECT_THAT(two.slots, ElementsAre(1));
  EXPECT_THAT(two.slowdown, ElementsAre(1, 1));
  // K = 2, R = 3 on 2 slots: 2/3 of a slot, so one slot at 1.5x the time.
  const ReplicaDevices three = ForReplica(EvenlyShared(6, 6, 2), 2, 3);
  EXPECT_THAT(three.slots, ElementsAre(1));
  EXPECT_DOUBLE_EQ(three.slowdown[0], 1.5);
}

TEST(SharedDevicesTest, DevicesOfTheirOwnAreNotShared) {
  // Two servers a device: K = 2, R = 2 puts each replica on a device of its own.
  const ReplicaDevices r = ForReplica(EvenlyShared(4, 2, 1), 2, 2);
  EXPECT_THAT(r.device_of_stage, ElementsAre(0, 0));
  EXPECT_THAT(r.slots, ElementsAre(1));
  EXPECT_THAT(r.slowdown, ElementsAre(1, 1));
  // Servers past the list have a device each.
  const ReplicaDevices past = ForReplica(EvenlyShared(1, 1, 1), 3, 1);
  EXPECT_THAT(past.device_of_stage, ElementsAre(0, 1, 2));
  EXPECT_THAT(past.shared_name, ElementsAre("", "", ""));
  EXPECT_TRUE(ForReplica(SharedDevices{}, 4, 1).device_of_stage.empty());
}

TEST(SharedDevicesTest, TheDescriptionNamesWhoShares) {
  SharedDevices d = EvenlyShared(4, 4, 2);
  d.names = {"cpu:host"};
  EXPECT_EQ(DescribeSharing(d, 4, 1), "stages 0-3 share cpu:host (2 at once)");
  EXPECT_EQ(DescribeSharing(d, 1, 2), "r0.s0, r1.s0 share cpu:host (2 at once)");
  EXPECT_EQ(DescribeSharing(EvenlyShared(4, 1, 1), 4, 1), "");
}

TEST(SharedDevicesTest, RefusesDevicesThatDoNotAddUp) {
  EXPECT_THAT(CheckSharedDevices(EvenlyShared(4, 2, 1)), IsOk());
  SharedDevices d = EvenlyShared(4, 2, 1);
  d.of_server[3] = 5;
  EXPECT_THAT(CheckSharedDevices(d),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage server 3")));
  d = EvenlyShared(4, 2, 1);
  d.slots[1] = 0;
  EXPECT_THAT(CheckSharedDevices(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("device 1 has 0 slots")));
}

PlanOptions FourStages() {
  PlanOptions o;
  o.model.vocab_size = 256;
  o.model.seq_len = 64;
  o.model.d_model = 128;
  o.model.n_heads = 4;
  o.model.n_layers = 6;
  o.stages = 4;
  o.micro_batches = 8;
  o.batch_size = 16;
  o.schedule = ScheduleKind::kOneFOneB;
  o.device_flops = 1e9;
  o.link_bytes_per_s = 1e15;  // transfers free: the compute decides
  return o;
}

// One slot for four stages: nothing overlaps, so the step is all of their work, which
// is the one-stage plan's step (the same FLOPs on one device).
TEST(SharedDevicesTest, FourStagesOnOneSlotTakeAsLongAsOneStage) {
  PlanOptions shared = FourStages();
  shared.devices = EvenlyShared(4, 4, 1);
  PlanOptions one = FourStages();
  one.stages = 1;
  auto a = MakePlan(shared);
  auto b = MakePlan(one);
  auto apart = MakePlan(FourStages());
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(apart, IsOk());
  EXPECT_NEAR(a->simulation.step_time_s, b->simulation.step_time_s,
              1e-9 * b->simulation.step_time_s);
  EXPECT_LT(apart->simulation.step_time_s, 0.5 * a->simulation.step_time_s);
  EXPECT_EQ(a->sharing, "stages 0-3 share device 0 (1 at once)");
  EXPECT_EQ(a->stages[2].shared_device, "device 0");
  EXPECT_EQ(apart->stages[2].shared_device, "");
}

// Four replicas of one stage on two slots: each replica's compute takes twice as long.
TEST(SharedDevicesTest, ReplicasSharingADevicePlanTheirSlowdown) {
  PlanOptions o = FourStages();
  o.stages = 1;
  o.replicas = 4;
  o.micro_batches = 2;
  o.collective_bytes_per_s = 1e15;
  PlanOptions shared = o;
  shared.devices = EvenlyShared(4, 4, 2);
  auto a = MakePlan(shared);
  auto b = MakePlan(o);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_DOUBLE_EQ(a->stages[0].device_slowdown, 2);
  EXPECT_DOUBLE_EQ(a->costs.chunks[0][0].forward_s, 2 * b->costs.chunks[0][0].forward_s);
  EXPECT_GT(a->simulation.step_time_s, 1.9 * b->simulation.step_time_s);
}

// Two stages twice as fast as the other two: the layers follow the speeds, and the step
// is near what the four do together (6 slow stages' worth), not what four slow ones do.
TEST(StageSpeedsTest, FasterStagesTakeMoreLayers) {
  PlanOptions o = FourStages();
  o.model.n_layers = 22;
  o.micro_batches = 16;
  PlanOptions fast = o;
  fast.server_speed = {2, 2, 1, 1};
  auto mixed = MakePlan(fast);
  auto slow = MakePlan(o);
  ASSERT_THAT(mixed, IsOk());
  ASSERT_THAT(slow, IsOk());
  auto layers = [](const StagePlan& sp) { return sp.chunks[0].second - sp.chunks[0].first; };
  EXPECT_GT(layers(mixed->stages[1]), layers(mixed->stages[2]));
  EXPECT_DOUBLE_EQ(mixed->stages[0].speed, 2);
  EXPECT_DOUBLE_EQ(mixed->stages[3].speed, 1);
  EXPECT_LT(mixed->simulation.step_time_s, slow->simulation.step_time_s / 1.3);
  // Split by count, which is by FLOPs here (equal blocks), the two slow stages bound
  // the step.
  PlanOptions even = fast;
  even.partition = PartitionMode::kCount;
  auto by_count = MakePlan(even);
  ASSERT_THAT(by_count, IsOk());
  EXPECT_GT(by_count->simulation.step_time_s, 1.25 * mixed->simulation.step_time_s);
  // A replica's stage goes at its slowest copy's speed.
  PlanOptions two = o;
  two.stages = 2;
  two.replicas = 2;
  two.micro_batches = 4;
  two.server_speed = {2, 4, 1, 4};
  EXPECT_THAT(StageSpeeds(two), ElementsAre(1, 4));
  two.server_speed = {2, 0};
  EXPECT_THAT(MakePlan(two), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("stage server 1 has speed 0")));
}

}  // namespace
}  // namespace pipetrain::planner
