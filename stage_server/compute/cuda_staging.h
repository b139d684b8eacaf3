// The cuda backend's host <-> device copies: a lazily allocated ring of pinned host
// slots with one CUDA event each, driven by the chunk loops of staged_copy.h. Copies
// that gain nothing from staging (small ones, or from/to memory already pinned) go
// directly. Only CUDA builds compile this; the header needs no CUDA include.
#pragma once

#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stage_server/compute/staged_copy.h"

struct CUstream_st;
struct CUevent_st;

namespace pipetrain::compute {

class CudaStaging final : private StagingEngine {
 public:
  // 3 x 4 MiB: large enough that a copy's fixed cost is small next to its transfer,
  // small enough to pin once per backend without thought.
  static constexpr size_t kSlots = 3;
  static constexpr size_t kSlotBytes = size_t{4} << 20;
  // Below this a single pageable copy costs about as much as gathering into a slot.
  static constexpr size_t kDirectBelow = size_t{64} << 10;

  // Copies run on `stream` (the backend's), so they stay ordered with its kernels. The
  // caller makes the backend's device current before every call, destructor included.
  explicit CudaStaging(CUstream_st* stream, size_t num_slots = kSlots,
                       size_t slot_bytes = kSlotBytes)
      : stream_(stream), num_slots_(num_slots), slot_bytes_(slot_bytes) {}
  // Waits for the copies in flight, then frees the slots and their events.
  ~CudaStaging() override;
  CudaStaging(const CudaStaging&) = delete;
  CudaStaging& operator=(const CudaStaging&) = delete;

  // Host pieces, in order, to consecutive device bytes from dst. Returns once the pieces
  // may be reused; the device copy may still be running, ordered before later work on
  // the stream. `op` (e.g. "CopyFromHost(4096 bytes)") starts every error message.
  absl::Status ToDevice(void* dst, std::span<const std::span<const std::byte>> pieces,
                        const std::string& op);
  // Device bytes to host_dst, after the work already on the stream; returns once they
  // are all in host_dst.
  absl::Status ToHost(void* host_dst, const void* src, size_t bytes, const std::string& op);

 private:
  // StagingEngine, used by the staged loops with mu_ held.
  size_t num_slots() const override { return num_slots_; }
  size_t slot_bytes() const override { return slot_bytes_; }
  std::byte* slot(size_t s) override { return slots_[s]; }
  absl::Status CopySlotToDevice(size_t s, void* device_dst, size_t bytes) override;
  absl::Status CopyDeviceToSlot(size_t s, const void* device_src, size_t bytes) override;
  absl::Status WaitSlot(size_t s) override;

  // Whether to stage a copy that `wanted` it (a large one from/to pageable memory):
  // allocates the slots on first use. False (copy directly) if not wanted, or if pinned
  // memory cannot be had; that is logged once and not retried.
  absl::StatusOr<bool> UseSlots(bool wanted);
  void FreeSlots();

  CUstream_st* const stream_;
  const size_t num_slots_;
  const size_t slot_bytes_;
  // Held for a whole copy: the slots (and op_) are shared by every caller.
  std::mutex mu_;
  std::vector<std::byte*> slots_;       // pinned, slot_bytes_ each; empty until first use
  std::vector<CUevent_st*> events_;     // the last copy issued on each slot
  bool pinned_unavailable_ = false;
  std::string op_;                      // the copy in progress, for error messages
};

}  // namespace pipetrain::compute
