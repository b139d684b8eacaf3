// CUDA build of the `cuda` backend (cuda_backend.h), its device side: creation (device,
// stream, cuBLAS handle), memory and copies, and the preamble and checks every op shares.
// The ops themselves are in cuda_backend_ops.cc.
#include "stage_server/compute/cuda_backend.h"

#include <climits>
#include <cmath>
#include <type_traits>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_staging.h"
#include "stage_server/compute/cuda_status.h"
#include "stage_server/compute/op_checks.h"

namespace pipetrain::compute {
namespace {

namespace ck = cuda_kernels;

cudaStream_t S(CUstream_st* s) { return s; }

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device,
                                                           CudaBackendOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   CudaBackend::Create(device, options));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device,
                                                                 CudaBackendOptions options) {
  const common::CudaProbe& probe = common::ProbeCuda();
  if (probe.devices.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable GPU: ", probe.reason, "; use --device cpu"));
  }
  if (device < 0 || device >= static_cast<int>(probe.devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat("cuda backend: device ", device,
                                                   " does not exist (", probe.devices.size(),
                                                   " GPU(s) found)"));
  }
  // The constructor is private, so no make_unique; the destructor frees whatever was
  // created if a later step fails.
  std::unique_ptr<CudaBackend> b(new CudaBackend(device, options));
  CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice(", device, ")");
  cudaStream_t stream = nullptr;
  // A blocking stream (not cudaStreamNonBlocking): work on the legacy default stream,
  // e.g. cudaMemcpy by other code, stays ordered with it.
  CUDA_CHECK(cudaStreamCreate(&stream), "cudaStreamCreate on device ", device);
  b->stream_ = stream;
  b->staging_ = std::make_unique<CudaStaging>(stream);
  cublasHandle_t handle = nullptr;
  CUBLAS_CHECK(cublasCreate(&handle), "cublasCreate on device ", device);
  b->cublas_ = handle;
  CUBLAS_CHECK(cublasSetStream(handle, stream), "cublasSetStream");
  CUBLAS_CHECK(cublasSetMathMode(handle, options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                      : CUBLAS_DEFAULT_MATH),
               "cublasSetMathMode(", options.tf32 ? "TF32" : "default", ")");
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, sizeof(int32_t)), "cudaMalloc(bad index)");
  b->bad_index_ = static_cast<int32_t*>(p);
  CUDA_CHECK(cudaMalloc(&p, (ck::kReducePartials + 1) * sizeof(double)),
             "cudaMalloc(reduction scratch)");
  b->reduce_ = static_cast<double*>(p);
  common::LogInfo("cuda", absl::StrCat("backend on device ", device, " (",
                                       probe.devices[device].name, "), matmul ",
                                       options.tf32 ? "tf32" : "fp32"));
  return b;
}

CudaBackend::CudaBackend(int device, CudaBackendOptions options)
    : device_(device), options_(options) {}

CudaBackend::~CudaBackend() {
  // Errors here have nowhere to go; a device that faulted reports them on every call.
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(S(stream_));
  staging_.reset();  // its events and pinned slots go before the stream they were used on
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    (void)ReleaseCachedBlocks();
    // Blocks still live belong to owners that outlived the backend; free them too so
    // the device memory is not lost (their owners must not use them any more).
    for (auto& [p, size] : live_) cudaFree(p);
    live_.clear();
  }
  cudaFree(bad_index_);
  cudaFree(reduce_);
  cudaFree(row_loss_);
  cudaFree(attn_scratch_);
  cudaFree(bf16_a_);
  cudaFree(bf16_b_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(S(stream_));
}

absl::Status CudaBackend::Activate(const char* op) {
  CUDA_CHECK(cudaSetDevice(device_), op, ": cudaSetDevice(", device_, ")");
  return absl::OkStatus();
}

absl::Status CudaBackend::Finish(const std::string& op) {
  if (!options_.check_every_op) return absl::OkStatus();
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), op, " (checked after the op)");
  CUDA_CHECK(cudaGetLastError(), op, " (checked after the op)");
  return absl::OkStatus();
}

absl::Status CudaBackend::EnsureScratch(void** ptr, size_t* capacity, size_t bytes,
                                        const char* what) {
  if (*capacity >= bytes) return absl::OkStatus();
  if (*ptr != nullptr) {
    // Work queued on the stream may still read the old buffer (the bf16 operands are
    // rounded into scratch by one kernel and read by the next product).
    CUDA_CHECK(cudaStreamSynchronize(S(stream_)), "growing ", what);
  }
  CUDA_CHECK(cudaFree(*ptr), "cudaFree(", what, ")");
  *ptr = nullptr;
  *capacity = 0;
  CUDA_CHECK(cudaMalloc(ptr, bytes), "cudaMalloc(", what, ", ", bytes, " bytes)");
  *capacity = bytes;
  return absl::OkStatus();
}

absl::Status CudaBackend::CheckBadIndex(const OpCall& call, const int32_t* ids, int V,
                                        const char* what) {
  int32_t bad = 0;
  CUDA_CHECK(cudaMemcpyAsync(&bad, bad_index_, sizeof(bad), cudaMemcpyDeviceToHost, S(stream_)),
             call.ToString(), ": reading the id check");
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), call.ToString());
  if (bad == INT_MAX) return absl::OkStatus();
  int32_t id = 0;
  CUDA_CHECK(cudaMemcpy(&id, ids + bad, sizeof(id), cudaMemcpyDeviceToHost), call.ToString(),
             ": reading the bad id");
  return IdOutOfRange(Name(), call, what, bad, id, V);
}

// ---- Memory -----------------------------------------------------------------------------

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  RETURN_IF_ERROR(Activate("Allocate"));
  // Round up so that blocks of nearly the same size are shared; 256 bytes is
  // cudaMalloc's own alignment, so every block stays aligned for any element type.
  const size_t rounded = (bytes + 255) / 256 * 256;
  std::lock_guard<std::mutex> lock(alloc_mu_);
  // The smallest cached block that fits, if it wastes at most a quarter of itself.
  if (auto it = cached_.lower_bound(rounded);
      it != cached_.end() && it->first - rounded <= it->first / 4) {
    void* p = it->second;
    live_[p] = it->first;
    cached_bytes_ -= it->first;
    cached_.erase(it);
    return p;
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, rounded);
  if (e == cudaErrorMemoryAllocation && cached_bytes_ > 0) {
    cudaGetLastError();  // clear it, give the cache back, and try once more
    RETURN_IF_ERROR(ReleaseCachedBlocks());
    e = cudaMalloc(&p, rounded);
  }
  CUDA_CHECK(e, "Allocate(", bytes, " bytes)");
  live_[p] = rounded;
  return p;
}

absl::Status CudaBackend::Free(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(
        "cuda backend: Free of a pointer this backend did not allocate (or freed twice)");
  }
  cached_.emplace(it->second, ptr);
  cached_bytes_ += it->second;
  live_.erase(it);
  return absl::OkStatus();
}

absl::Status CudaBackend::ReleaseCachedBlocks() {
  // Called with alloc_mu_ held. cudaFree waits for the device, so no op still uses them.
  absl::Status status;
  for (auto& [size, p] : cached_) {
    if (cudaError_t e = cudaFree(p); e != cudaSuccess && status.ok()) {
      status = CudaStatus(e, absl::StrCat("cudaFree of a cached block of ", size, " bytes"));
    }
  }
  cached_.clear();
  cached_bytes_ = 0;
  return status;
}

absl::Status CudaBackend::Zero(void* ptr, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("Zero"));
  CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, S(stream_)), "Zero(", bytes, " bytes)");
  return Finish("Zero");
}

absl::Status CudaBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  const std::span<const std::byte> piece(static_cast<const std::byte*>(host_src), bytes);
  return CopyFromHostPieces(dst, std::span<const std::span<const std::byte>>(&piece, 1));
}

absl::Status CudaBackend::CopyFromHostPieces(
    void* dst, std::span<const std::span<const std::byte>> pieces) {
  size_t bytes = 0;
  for (const auto& piece : pieces) bytes += piece.size();
  if (bytes == 0) return absl::OkStatus();
  const std::string op =
      pieces.size() == 1
          ? absl::StrCat("CopyFromHost(", bytes, " bytes)")
          : absl::StrCat("CopyFromHostPieces(", bytes, " bytes in ", pieces.size(), " pieces)");
  RETURN_IF_ERROR(Activate("CopyFromHost"));
  RETURN_IF_ERROR(staging_->ToDevice(dst, pieces, op));
  return Finish(op);
}

absl::Status CudaBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("CopyToHost"));
  return staging_->ToHost(host_dst, src, bytes, absl::StrCat("CopyToHost(", bytes, " bytes)"));
}

absl::Status CudaBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("Copy"));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(stream_)),
             "Copy(", bytes, " bytes)");
  return Finish("Copy");
}

absl::Status CudaBackend::Synchronize() {
  RETURN_IF_ERROR(Activate("Synchronize"));
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), "Synchronize (a fault in an earlier op)");
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
