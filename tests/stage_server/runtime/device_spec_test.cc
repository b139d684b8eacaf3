#include "stage_server/runtime/device_spec.h"

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

TEST(DeviceSpecTest, RejectsOthers) {
  EXPECT_THAT(ParseDeviceSpec("gpu"), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("not one of cpu, cuda:N or emulated:NAME")));
  EXPECT_THAT(ParseDeviceSpec("cuda:x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("index")));
  EXPECT_THAT(ParseDeviceSpec("cuda:-1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseDeviceSpec("emulated:"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::stage_server
