// CUDA build of common/cuda_probe.h.
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_probe.h"
#include "common/logging.h"
#include "common/tensor.h"

namespace pipetrain::common {
namespace {

__global__ void AddKernel(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

std::string Uuid(const cudaUUID_t& id) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto byte = static_cast<unsigned char>(id.bytes[i]);
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

std::string Describe(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace

const CudaProbe& ProbeCuda() {
  static CudaProbe probe;
  static std::once_flag once;
  std::call_once(once, [] {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      probe.reason = Describe(e, "cudaGetDeviceCount");
    } else if (count == 0) {
      probe.reason = "the CUDA runtime reports no device";
    }
    for (int i = 0; e == cudaSuccess && i < count; ++i) {
      cudaDeviceProp prop;
      if (cudaError_t pe = cudaGetDeviceProperties(&prop, i); pe != cudaSuccess) {
        probe.devices.clear();
        probe.reason = Describe(pe, "cudaGetDeviceProperties");
        break;
      }
      probe.devices.push_back({i, prop.name, static_cast<uint64_t>(prop.totalGlobalMem),
                               prop.major, prop.minor, Uuid(prop.uuid)});
    }
    if (probe.devices.empty()) {
      LogInfo("cuda", "no usable GPU, CUDA code paths are off: " + probe.reason);
    }
  });
  return probe;
}

bool CudaSmokeTest(int device, std::string* error) {
  constexpr int n = 1 << 16;
  std::vector<float> a(n), b(n), c(n);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int i = 0; i < n; ++i) { a[i] = dist(rng); b[i] = dist(rng); }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  auto fail = [&](cudaError_t e, const char* what) {
    *error = Describe(e, what);
    cudaFree(da); cudaFree(db); cudaFree(dc);
    return false;
  };
  cudaError_t e;
  if ((e = cudaSetDevice(device)) != cudaSuccess) return fail(e, "cudaSetDevice");
  const size_t bytes = n * common::DTypeSize(common::DType::kF32);
  if ((e = cudaMalloc(&da, bytes)) != cudaSuccess) return fail(e, "cudaMalloc");
  if ((e = cudaMalloc(&db, bytes)) != cudaSuccess) return fail(e, "cudaMalloc");
  if ((e = cudaMalloc(&dc, bytes)) != cudaSuccess) return fail(e, "cudaMalloc");
  cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice);
  AddKernel<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  if ((e = cudaGetLastError()) != cudaSuccess) return fail(e, "AddKernel launch");
  if ((e = cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
    return fail(e, "cudaMemcpy");
  for (int i = 0; i < n; ++i) {
    if (std::fabs(c[i] - (a[i] + b[i])) > 1e-6f) {
      *error = "AddKernel gave a wrong sum at element " + std::to_string(i);
      cudaFree(da); cudaFree(db); cudaFree(dc);
      return false;
    }
  }
  cudaFree(da); cudaFree(db); cudaFree(dc);
  return true;
}

}  // namespace pipetrain::common
