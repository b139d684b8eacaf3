#include "stage_server/link/shm/cuda_ipc_region.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stage_server/compute/cuda_status.h"

namespace pipetrain::stage_server {
namespace {

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

absl::StatusOr<CudaIpcRegion> CudaIpcRegion::Create(int device, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("CUDA IPC region: zero bytes");
  CudaIpcRegion r;
  r.device_ = device;
  r.bytes_ = bytes;
  CUDA_CHECK(cudaSetDevice(device), "CUDA IPC region: selecting device ", device);
  CUDA_CHECK(cudaMalloc(&r.memory_, bytes), "CUDA IPC region: allocating ", bytes,
             " bytes on device ", device);
  cudaIpcMemHandle_t handle;
  CUDA_CHECK(cudaIpcGetMemHandle(&handle, r.memory_), "CUDA IPC region: exporting ", bytes,
             " bytes on device ", device);
  r.handle_ = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(&handle), sizeof handle));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
             "CUDA IPC region: creating its copy stream");
  r.stream_ = stream;
  return r;
}

absl::StatusOr<CudaIpcRegion> CudaIpcRegion::Open(int device, const std::string& handle_hex,
                                                  uint64_t bytes) {
  const bool hex = std::all_of(handle_hex.begin(), handle_hex.end(),
                               [](unsigned char c) { return std::isxdigit(c) != 0; });
  if (handle_hex.size() != 2 * sizeof(cudaIpcMemHandle_t) || !hex) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC region: the peer's handle is not ", 2 * sizeof(cudaIpcMemHandle_t),
        " hex digits (field handle)"));
  }
  const std::string raw = absl::HexStringToBytes(handle_hex);
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, raw.data(), sizeof handle);
  CudaIpcRegion r;
  r.device_ = device;
  r.bytes_ = bytes;
  r.opened_ = true;
  r.handle_ = handle_hex;
  CUDA_CHECK(cudaSetDevice(device), "CUDA IPC region: selecting device ", device);
  CUDA_CHECK(cudaIpcOpenMemHandle(&r.memory_, handle, cudaIpcMemLazyEnablePeerAccess),
             "CUDA IPC region: opening the peer's region on device ", device);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
             "CUDA IPC region: creating its copy stream");
  r.stream_ = stream;
  return r;
}

CudaIpcRegion::CudaIpcRegion(CudaIpcRegion&& o) noexcept
    : device_(o.device_),
      memory_(std::exchange(o.memory_, nullptr)),
      stream_(std::exchange(o.stream_, nullptr)),
      bytes_(o.bytes_),
      opened_(o.opened_),
      handle_(std::move(o.handle_)) {}

CudaIpcRegion::~CudaIpcRegion() {
  if (memory_ == nullptr && stream_ == nullptr) return;
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamDestroy(AsStream(stream_));
  if (memory_ == nullptr) return;
  if (opened_) {
    cudaIpcCloseMemHandle(memory_);
  } else {
    cudaFree(memory_);
  }
}

absl::Status CudaIpcRegion::CheckRange(uint64_t offset, uint64_t bytes, const char* what) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("CUDA IPC region: ", what, " [", offset, ", ",
                                              offset + bytes, ") of a ", bytes_,
                                              "-byte region"));
  }
  return absl::OkStatus();
}

absl::Status CudaIpcRegion::CopyIn(uint64_t offset, const void* device_src, uint64_t bytes) {
  if (absl::Status s = CheckRange(offset, bytes, "copying into"); !s.ok()) return s;
  CUDA_CHECK(cudaSetDevice(device_), "CUDA IPC region: selecting device ", device_);
  CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(memory_) + offset, device_src, bytes,
                             cudaMemcpyDeviceToDevice, AsStream(stream_)),
             "CUDA IPC region: copying ", bytes, " bytes in at ", offset);
  // A device-to-device copy may return before it is done; the peer reads once told.
  CUDA_CHECK(cudaStreamSynchronize(AsStream(stream_)), "CUDA IPC region: copying ", bytes,
             " bytes in at ", offset);
  return absl::OkStatus();
}

absl::Status CudaIpcRegion::CopyOut(uint64_t offset, void* device_dst, uint64_t bytes) const {
  if (absl::Status s = CheckRange(offset, bytes, "copying out of"); !s.ok()) return s;
  CUDA_CHECK(cudaSetDevice(device_), "CUDA IPC region: selecting device ", device_);
  CUDA_CHECK(cudaMemcpyAsync(device_dst, static_cast<const char*>(memory_) + offset, bytes,
                             cudaMemcpyDeviceToDevice, AsStream(stream_)),
             "CUDA IPC region: copying ", bytes, " bytes out at ", offset);
  CUDA_CHECK(cudaStreamSynchronize(AsStream(stream_)), "CUDA IPC region: copying ", bytes,
             " bytes out at ", offset);
  return absl::OkStatus();
}

}  // namespace pipetrain::stage_server
