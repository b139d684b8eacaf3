// CUDA build of the copy staging (cuda_staging.h): pinned slots from cudaHostAlloc, one
// event per slot recorded after each copy on the backend's stream, and the direct
// copies for small or already pinned host memory.
#include "stage_server/compute/cuda_staging.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "stage_server/compute/cuda_status.h"

namespace pipetrain::compute {
namespace {

cudaStream_t S(CUstream_st* s) { return s; }

// Whether host memory at p is page-locked (cudaHostAlloc or cudaHostRegister): the DMA
// engine reads it directly and staging would only add a copy. Pageable memory is
// "unregistered" (CUDA 11 and later); an error also means "not pinned" and is cleared.
bool IsPinned(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

bool AllPinned(std::span<const std::span<const std::byte>> pieces) {
  for (const auto& piece : pieces) {
    if (!piece.empty() && !IsPinned(piece.data())) return false;
  }
  return true;
}

}  // namespace

CudaStaging::~CudaStaging() {
  std::lock_guard<std::mutex> lock(mu_);
  FreeSlots();
}

void CudaStaging::FreeSlots() {
  // Errors here have nowhere to go; a faulted device reports them on every later call.
  for (CUevent_st* event : events_) {
    cudaEventSynchronize(event);  // a slot's last copy must be done before it is freed
    cudaEventDestroy(event);
  }
  for (std::byte* slot : slots_) cudaFreeHost(slot);
  events_.clear();
  slots_.clear();
}

absl::StatusOr<bool> CudaStaging::UseSlots(bool wanted) {
  if (!wanted || pinned_unavailable_) return false;
  if (!slots_.empty()) return true;
  for (size_t s = 0; s < num_slots_; ++s) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, slot_bytes_, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      // Pinned memory is a limited resource on some hosts; copying directly is slower
      // but correct, so degrade instead of failing the copy.
      cudaGetLastError();
      FreeSlots();
      pinned_unavailable_ = true;
      common::LogWarning("cuda", absl::StrCat("no pinned memory for ", num_slots_, " x ",
                                              slot_bytes_, " byte copy slots (",
                                              cudaGetErrorString(e),
                                              "); host copies go unstaged"));
      return false;
    }
    if (e != cudaSuccess) {
      FreeSlots();
      return CudaStatus(e, absl::StrCat(op_, ": cudaHostAlloc(", slot_bytes_, " bytes)"));
    }
    slots_.push_back(static_cast<std::byte*>(p));
  }
  for (size_t s = 0; s < num_slots_; ++s) {
    cudaEvent_t event = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
      FreeSlots();
      return CudaStatus(e, absl::StrCat(op_, ": cudaEventCreate for copy slot ", s));
    }
    events_.push_back(event);
  }
  return true;
}

absl::Status CudaStaging::ToDevice(void* dst,
                                   std::span<const std::span<const std::byte>> pieces,
                                   const std::string& op) {
  size_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  if (total == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  op_ = op;
  // The size test comes first: it saves small copies the pointer queries.
  ASSIGN_OR_RETURN(const bool staged, UseSlots(total >= kDirectBelow && !AllPinned(pieces)));
  if (staged) return StagedCopyToDevice(*this, pieces, dst);
  auto* out = static_cast<std::byte*>(dst);
  for (const auto& piece : pieces) {
    if (piece.empty()) continue;
    CUDA_CHECK(cudaMemcpyAsync(out, piece.data(), piece.size(), cudaMemcpyHostToDevice,
                               S(stream_)),
               op, ": cudaMemcpyAsync of ", piece.size(), " bytes to the device");
    out += piece.size();
  }
  // The caller may reuse the pieces once we return, and from pinned memory the copy is
  // truly asynchronous, so wait for it.
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), op, ": waiting for the copy");
  return absl::OkStatus();
}

absl::Status CudaStaging::ToHost(void* host_dst, const void* src, size_t bytes,
                                 const std::string& op) {
  if (bytes == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  op_ = op;
  ASSIGN_OR_RETURN(const bool staged, UseSlots(bytes >= kDirectBelow && !IsPinned(host_dst)));
  if (staged) return StagedCopyToHost(*this, src, bytes, static_cast<std::byte*>(host_dst));
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, S(stream_)),
             op, ": cudaMemcpyAsync to the host");
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), op, ": waiting for the copy");
  return absl::OkStatus();
}

absl::Status CudaStaging::CopySlotToDevice(size_t s, void* device_dst, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(device_dst, slots_[s], bytes, cudaMemcpyHostToDevice,
                             S(stream_)),
             op_, ": cudaMemcpyAsync of ", bytes, " bytes from pinned slot ", s);
  CUDA_CHECK(cudaEventRecord(events_[s], S(stream_)), op_, ": cudaEventRecord for slot ", s);
  return absl::OkStatus();
}

absl::Status CudaStaging::CopyDeviceToSlot(size_t s, const void* device_src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(slots_[s], device_src, bytes, cudaMemcpyDeviceToHost,
                             S(stream_)),
             op_, ": cudaMemcpyAsync of ", bytes, " bytes to pinned slot ", s);
  CUDA_CHECK(cudaEventRecord(events_[s], S(stream_)), op_, ": cudaEventRecord for slot ", s);
  return absl::OkStatus();
}

absl::Status CudaStaging::WaitSlot(size_t s) {
  // An event never recorded counts as complete, so a fresh slot does not block.
  CUDA_CHECK(cudaEventSynchronize(events_[s]), op_, ": waiting for the copy of slot ", s);
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
