// The same-host path's device memory between GPUs of one node (stage_server/
// cuda_ipc_region.h): bytes copied into a ring come out equal, in this process and in
// another one that opened the ring from its handle (pipetrain-bench cuda-ipc's worker);
// bad handles and ranges are refused. Skips without a GPU, saying why; without one it
// still checks that the region refuses to start with a message naming it.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/cuda_probe.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/link/shm/cuda_ipc_region.h"
#include "tests/testing/subprocess.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

#define REQUIRE_GPU()                                                    \
  do {                                                                   \
    if (!common::HasCudaDevice()) {                                      \
      GTEST_SKIP() << "no usable GPU: " << common::ProbeCuda().reason;   \
    }                                                                    \
  } while (false)

TEST(CudaIpcRegionTest, WithoutAGpuTheRegionSaysSo) {
  if (common::HasCudaDevice()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THAT(CudaIpcRegion::Create(0, 1 << 20),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("CUDA IPC region")));
}

TEST(CudaIpcRegionTest, BytesCopiedInComeOutEqualAndRangesAreChecked) {
  REQUIRE_GPU();
  constexpr size_t kBytes = 3 << 20;
  auto ring = CudaIpcRegion::Create(0, 2 * kBytes);
  ASSERT_THAT(ring, IsOk());
  EXPECT_EQ(ring->handle().size(), 2 * sizeof(cudaIpcMemHandle_t));
  std::vector<unsigned char> host(kBytes), back(kBytes, 0);
  std::mt19937 rng(17);
  for (unsigned char& c : host) c = static_cast<unsigned char>(rng());
  void *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst, 0xAB, kBytes), cudaSuccess);  // poisoned
  ASSERT_EQ(cudaMemcpy(src, host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_THAT(ring->CopyIn(kBytes, src, kBytes), IsOk());
  EXPECT_THAT(ring->CopyOut(kBytes, dst, kBytes), IsOk());
  ASSERT_EQ(cudaMemcpy(back.data(), dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  EXPECT_THAT(ring->CopyIn(kBytes + 1, src, kBytes), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ring->CopyOut(2 * kBytes, dst, 1), StatusIs(absl::StatusCode::kOutOfRange));
  cudaFree(src);
  cudaFree(dst);
}

TEST(CudaIpcRegionTest, AMalformedHandleIsRefused) {
  REQUIRE_GPU();
  EXPECT_THAT(CudaIpcRegion::Open(0, "abc", 1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field handle")));
}

// Another process opens the ring from its handle and reads what this one wrote:
// pipetrain-bench cuda-ipc (its worker fails unless every byte matches).
TEST(CudaIpcRegionTest, AnotherProcessReadsWhatThisOneWrote) {
  REQUIRE_GPU();
  const char* dir = std::getenv("PIPETRAIN_BIN_DIR");
  const std::string bench =
      std::string(dir != nullptr && *dir != '\0' ? dir : PIPETRAIN_BIN_DIR) + "/pipetrain-bench";
  auto run = testing::RunCommand({bench, "cuda-ipc", "--repetitions", "3", "--json"},
                                 std::chrono::seconds(120));
  ASSERT_THAT(run, IsOk());
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_THAT(run->out, HasSubstr("\"same_bytes\":1"));
}

}  // namespace
}  // namespace pipetrain::stage_server
