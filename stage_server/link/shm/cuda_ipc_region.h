// The same-host path between GPUs of one node: a stage's ring of device memory
// exported with cudaIpcGetMemHandle and opened by its neighbour's process on the same
// node, so that a tensor crosses from one stage's device memory to the next's as two
// device-to-device copies (in, out) instead of device -> host -> TCP -> host -> device.
// The slots, headers and credits are the shared-memory path's (shm_transport.h, shm_slots.h);
// this is only the memory. Builds without CUDA answer FAILED_PRECONDITION.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::stage_server {

class CudaIpcRegion {
 public:
  // `bytes` of device memory on `device`, exportable; its handle() goes to the peer.
  static absl::StatusOr<CudaIpcRegion> Create(int device, uint64_t bytes);
  // The peer's region from its handle (hex, as handle() gives it), mapped on `device`
  // of this process. A handle from this same process, or malformed, is refused.
  static absl::StatusOr<CudaIpcRegion> Open(int device, const std::string& handle_hex,
                                            uint64_t bytes);

  CudaIpcRegion(CudaIpcRegion&& other) noexcept;
  CudaIpcRegion& operator=(CudaIpcRegion&&) = delete;
  ~CudaIpcRegion();  // frees (Create) or closes (Open) the memory

  const std::string& handle() const { return handle_; }
  uint64_t size() const { return bytes_; }

  // Device-to-device copies between [offset, offset + bytes) of the region and device
  // memory of this process, finished on return (the peer may read what CopyIn wrote
  // once a header says so). OUT_OF_RANGE past the region.
  absl::Status CopyIn(uint64_t offset, const void* device_src, uint64_t bytes);
  absl::Status CopyOut(uint64_t offset, void* device_dst, uint64_t bytes) const;

 private:
  CudaIpcRegion() = default;
  absl::Status CheckRange(uint64_t offset, uint64_t bytes, const char* what) const;

  int device_ = 0;
  void* memory_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t
  uint64_t bytes_ = 0;
  bool opened_ = false;  // from the peer's handle (closed, not freed)
  std::string handle_;
};

}  // namespace pipetrain::stage_server
