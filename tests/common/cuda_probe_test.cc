// GPU test (label `gpu`): the CUDA toolkit's code runs on every device found. Skips,
// with the reason, where no GPU is usable.
#include "common/cuda_probe.h"

#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

TEST(CudaProbeTest, SmokeKernelRunsOnEveryDevice) {
  const CudaProbe& probe = ProbeCuda();
  if (probe.devices.empty()) GTEST_SKIP() << "no usable GPU: " << probe.reason;
  for (const CudaDevice& d : probe.devices) {
    std::string error;
    EXPECT_TRUE(CudaSmokeTest(d.index, &error)) << d.name << ": " << error;
    EXPECT_GT(d.total_memory_bytes, 0u);
  }
}

TEST(CudaProbeTest, NoDeviceAlwaysComesWithAReason) {
  const CudaProbe& probe = ProbeCuda();
  if (probe.devices.empty()) {
    EXPECT_FALSE(probe.reason.empty());
  }
  EXPECT_EQ(HasCudaDevice(), !probe.devices.empty());
}

}  // namespace
}  // namespace pipetrain::common
