#include "coordinator/stages/device_groups.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

pb::DeviceInfo Cpu(const std::string& host, const std::string& cpus, int threads) {
  pb::DeviceInfo d;
  d.set_kind("cpu");
  d.set_device_id("cpu:" + host);
  d.set_cpus(cpus);
  d.set_threads(threads);
  return d;
}

pb::DeviceInfo Gpu(const std::string& uuid) {
  pb::DeviceInfo d;
  d.set_kind("cuda");
  d.set_device_id("cuda:" + uuid);
  return d;
}

// The quickstart's cluster: four one-thread stages on a 2-core host.
TEST(DeviceGroupsTest, StagesOfOneHostShareItsCores) {
  const std::vector<pb::DeviceInfo> four(4, Cpu("8f3ac2d1-aaaa", "0-1", 1));
  const planner::SharedDevices d = GroupDevices(four);
  EXPECT_THAT(d.of_server, ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(d.slots, ElementsAre(2));
  EXPECT_THAT(d.names, ElementsAre("cpu:8f3ac2d1 cpus 0-1"));
  // Two threads each: one at a time.
  EXPECT_THAT(GroupDevices(std::vector<pb::DeviceInfo>(2, Cpu("h", "0-1", 2))).slots,
              ElementsAre(1));
}

TEST(DeviceGroupsTest, DisjointCpuSetsAndOtherHostsAreDevicesOfTheirOwn) {
  const planner::SharedDevices d = GroupDevices(
      {Cpu("a", "0-1", 1), Cpu("a", "2-3", 1), Cpu("a", "1-2", 1), Cpu("b", "0-1", 1)});
  // The third overlaps both of the first two: the three share cpus 0-3.
  EXPECT_THAT(d.of_server, ElementsAre(0, 0, 0, 1));
  EXPECT_THAT(d.slots, ElementsAre(4, 2));
  EXPECT_THAT(GroupDevices({Cpu("a", "0-1", 1), Cpu("a", "2-3", 1)}).of_server, IsEmpty());
}

TEST(DeviceGroupsTest, StagesOfOneGpuTakeTurns) {
  const planner::SharedDevices d = GroupDevices({Gpu("GPU-1"), Gpu("GPU-2"), Gpu("GPU-1")});
  EXPECT_THAT(d.of_server, ElementsAre(0, 1, 0));
  EXPECT_THAT(d.slots, ElementsAre(1, 1));
  EXPECT_THAT(d.names, ElementsAre("cuda:GPU-1", "cuda:GPU-2"));
}

TEST(DeviceGroupsTest, StagesWithoutAnIdShareNothing) {
  std::vector<pb::DeviceInfo> old(3);
  for (pb::DeviceInfo& d : old) d.set_kind("cpu");
  EXPECT_TRUE(GroupDevices(old).empty());
}

}  // namespace
}  // namespace pipetrain::coordinator
