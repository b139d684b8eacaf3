// `pipetrain-bench cuda-ipc`: a 16 MiB activation from one stage process's device memory
// to another's on the same GPU through a CUDA IPC ring (stage_server/link/shm/cuda_ipc_region.h:
// the sender copies in, the neighbour's process copies out, both device to device),
// against the TCP path's device -> pinned host -> device copies of the same bytes and
// against one device-to-device copy, in the same run. The receiving process is a hidden
// worker (`pipetrain-bench --cuda-ipc-worker HANDLE REPS`) that checks the bytes.
#include <cuda_runtime_api.h>

#include <chrono>
#include <iostream>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/cuda_bench.h"
#include "common/cuda_probe.h"
#include "common/status_macros.h"
#include "stage_server/compute/cuda_status.h"
#include "stage_server/link/shm/cuda_ipc_region.h"
#include "tests/testing/subprocess.h"

namespace pipetrain::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBytes = uint64_t{16} << 20;
constexpr int kSlots = 4;

std::vector<char> Pattern() {
  std::vector<char> bytes(kBytes);
  std::mt19937 rng(11);
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

// Seconds of `op` run `reps` times, one sample each.
template <typename Op>
absl::StatusOr<std::vector<double>> Time(int reps, Op op) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    RETURN_IF_ERROR(op(r));
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return t;
}

// Device buffers freed on every path.
struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};
struct PinnedBuffer {
  void* p = nullptr;
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
};

absl::Status Synced(cudaError_t e, const char* what) {
  CUDA_CHECK(e, "cuda-ipc bench: ", what);
  CUDA_CHECK(cudaDeviceSynchronize(), "cuda-ipc bench: ", what);
  return absl::OkStatus();
}

// The worker: opens the ring, times copying each slot out, checks the bytes.
absl::Status Work(const std::string& handle, int reps) {
  ASSIGN_OR_RETURN(stage_server::CudaIpcRegion ring,
                   stage_server::CudaIpcRegion::Open(0, handle, kSlots * kBytes));
  DeviceBuffer dst;
  CUDA_CHECK(cudaMalloc(&dst.p, kBytes), "cuda-ipc worker: allocating");
  ASSIGN_OR_RETURN(std::vector<double> out, Time(reps, [&](int r) {
                     return ring.CopyOut((r % kSlots) * kBytes, dst.p, kBytes);
                   }));
  std::vector<char> got(kBytes);
  CUDA_CHECK(cudaMemcpy(got.data(), dst.p, kBytes, cudaMemcpyDeviceToHost),
             "cuda-ipc worker: reading back");
  if (got != Pattern()) return absl::DataLossError("cuda-ipc worker: the bytes differ");
  std::cout << "times " << absl::StrJoin(out, ",") << std::endl;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ParseTimes(const std::string& line) {
  std::vector<double> t;
  for (absl::string_view v : absl::StrSplit(line.substr(line.find("times ") + 6), ',')) {
    double x = 0;
    if (!absl::SimpleAtod(v, &x)) return absl::InternalError("cuda-ipc worker: bad times");
    t.push_back(x);
  }
  return t;
}

}  // namespace

int RunCudaIpcWorker(int argc, char** argv) {
  int reps = 0;
  if (argc != 4 || !absl::SimpleAtoi(argv[3], &reps) || reps < 1) {
    std::cerr << "usage: pipetrain-bench --cuda-ipc-worker HANDLE REPS\n";
    return 2;
  }
  absl::Status s = Work(argv[2], reps);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}

absl::StatusOr<BenchResult> RunCudaIpcBench(const BenchOptions& options) {
  if (!common::HasCudaDevice()) {
    return absl::FailedPreconditionError(absl::StrCat("no usable GPU: ", common::ProbeCuda().reason));
  }
  const int reps = options.repetitions > 0 ? options.repetitions : 20;
  const std::vector<char> pattern = Pattern();
  DeviceBuffer src, dst;
  PinnedBuffer host;
  CUDA_CHECK(cudaMalloc(&src.p, kBytes), "cuda-ipc bench: allocating");
  CUDA_CHECK(cudaMalloc(&dst.p, kBytes), "cuda-ipc bench: allocating");
  CUDA_CHECK(cudaMallocHost(&host.p, kBytes), "cuda-ipc bench: allocating pinned memory");
  CUDA_CHECK(cudaMemcpy(src.p, pattern.data(), kBytes, cudaMemcpyHostToDevice),
             "cuda-ipc bench: filling");
  ASSIGN_OR_RETURN(stage_server::CudaIpcRegion ring,
                   stage_server::CudaIpcRegion::Create(0, kSlots * kBytes));
  ASSIGN_OR_RETURN(std::vector<double> in, Time(reps, [&](int r) {
                     return ring.CopyIn((r % kSlots) * kBytes, src.p, kBytes);
                   }));
  ASSIGN_OR_RETURN(std::vector<double> d2d, Time(reps, [&](int) {
                     return Synced(cudaMemcpy(dst.p, src.p, kBytes, cudaMemcpyDeviceToDevice),
                                   "device-to-device copy");
                   }));
  ASSIGN_OR_RETURN(std::vector<double> staged, Time(reps, [&](int) -> absl::Status {
                     RETURN_IF_ERROR(Synced(cudaMemcpy(host.p, src.p, kBytes, cudaMemcpyDeviceToHost),
                                            "device to pinned host"));
                     return Synced(cudaMemcpy(dst.p, host.p, kBytes, cudaMemcpyHostToDevice),
                                   "pinned host to device");
                   }));
  // Every slot now holds the pattern; the worker reads them from its own process.
  ASSIGN_OR_RETURN(testing::Subprocess worker,
                   testing::Subprocess::Start({"/proc/self/exe", "--cuda-ipc-worker",
                                               ring.handle(), std::to_string(reps)}));
  absl::StatusOr<std::string> line = worker.WaitForLine("times ", std::chrono::seconds(120));
  if (!line.ok()) {
    return absl::UnavailableError(absl::StrCat("cuda-ipc worker: ", line.status().message(), ": ",
                                               worker.stderr_text()));
  }
  ASSIGN_OR_RETURN(std::vector<double> out, ParseTimes(*line));
  absl::StatusOr<int> code = worker.Wait(std::chrono::seconds(30));
  if (!code.ok() || *code != 0) {
    return absl::InternalError(absl::StrCat("cuda-ipc worker failed: ", worker.stderr_text()));
  }
  const double gb = static_cast<double>(kBytes) / 1e9;
  const double in_s = Median(in), out_s = Median(out), d2d_s = Median(d2d);
  const double staged_s = Median(staged);
  BenchResult result;
  result.Label("transfer", "16 MiB between two processes on GPU 0 through a CUDA IPC ring");
  result.Add("repetitions", reps);
  result.Add("same_bytes", 1);  // the worker checked them (it fails otherwise)
  result.Add("ipc_copy_in_gb_per_s", gb / in_s);
  result.Add("ipc_copy_out_gb_per_s", gb / out_s);
  result.Add("ipc_transfer_gb_per_s", gb / (in_s + out_s));
  result.Add("device_to_device_gb_per_s", gb / d2d_s);
  result.Add("pinned_staged_gb_per_s", gb / staged_s);
  result.Add("ipc_over_pinned_staged", staged_s / (in_s + out_s));
  result.Add("ipc_over_device_to_device", d2d_s / (in_s + out_s));
  return result;
}

}  // namespace pipetrain::bench
