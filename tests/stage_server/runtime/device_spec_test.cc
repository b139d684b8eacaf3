#include "stage_server/runtime/device_spec.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(DeviceSpecTest, ParsesTheThreeKinds) {
  auto cpu = ParseDeviceSpec("cpu");
  ASSERT_THAT(cpu, IsOk());
  EXPECT_EQ(cpu->kind, DeviceSpec::Kind::kCpu);
  auto cuda = ParseDeviceSpec("cuda:3");
  ASSERT_THAT(cuda, IsOk());
  EXPECT_EQ(cuda->kind, DeviceSpec::Kind::kCuda);
  EXPECT_EQ(cuda->cuda_index, 3);
  EXPECT_EQ(cuda->ToString(), "cuda:3");
  auto emu = ParseDeviceSpec("emulated:h100");
  ASSERT_THAT(emu, IsOk());
  EXPECT_EQ(emu->kind, DeviceSpec::Kind::kEmulated);
  EXPECT_EQ(emu->emulated, "h100");
}

TEST(DeviceSpecTest, AnEmulatedDeviceMayBeShared) {
  auto shared = ParseDeviceSpec("emulated:h100@gpu-0.a_b");
  ASSERT_THAT(shared, IsOk());
  EXPECT_EQ(shared->emulated, "h100");
  EXPECT_EQ(shared->shared, "gpu-0.a_b");
  EXPECT_EQ(shared->ToString(), "emulated:h100@gpu-0.a_b");
  EXPECT_EQ(DeviceId(*shared, ""), "emulated:gpu-0.a_b");
  for (const char* bad : {"emulated:h100@", "emulated:@x", "emulated:h100@a/b"}) {
    EXPECT_THAT(ParseDeviceSpec(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SHARED"))) << bad;
  }
}

TEST(DeviceSpecTest, TheDeviceIdSaysWhoMayShareIt) {
  DeviceSpec cpu;
  const std::string host = DeviceId(cpu, "");
  ASSERT_TRUE(absl::StartsWith(host, "cpu:")) << host;
  EXPECT_GT(host.size(), 4u);
  EXPECT_EQ(DeviceId(cpu, ""), host);  // the same for every stage of this host
  DeviceSpec own;
  own.kind = DeviceSpec::Kind::kEmulated;
  own.emulated = "h100";
  EXPECT_EQ(DeviceId(own, ""), absl::StrCat("emulated:", host.substr(4), "/", getpid()));
  DeviceSpec gpu;
  gpu.kind = DeviceSpec::Kind::kCuda;
  EXPECT_EQ(DeviceId(gpu, "GPU-0a1b"), "cuda:GPU-0a1b");
  // This process may run on at least one CPU, and the list says which as "0-3,8" does.
  const std::string cpus = CpuAffinityList();
  EXPECT_FALSE(cpus.empty());
  EXPECT_EQ(cpus.find_first_not_of("0123456789,-"), std::string::npos) << cpus;
}

TEST(DeviceSpecTest, RejectsOthers) {
  EXPECT_THAT(ParseDeviceSpec("gpu"), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("not one of cpu, cuda:N or emulated:NAME[@SHARED]")));
  EXPECT_THAT(ParseDeviceSpec("cuda:x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("index")));
  EXPECT_THAT(ParseDeviceSpec("cuda:-1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseDeviceSpec("emulated:"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::stage_server
