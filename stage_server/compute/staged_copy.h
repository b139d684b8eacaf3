// Host <-> device copies staged through a ring of pinned host slots, as pure logic: the
// chunking, the double (N-) buffering and the slot discipline live here and are tested
// on the CPU; the asynchronous copies and their completion come from a StagingEngine.
#pragma once

#include <cstddef>
#include <span>

#include "absl/status/status.h"

namespace pipetrain::compute {

// The asynchronous side of a staged copy. The cuda backend implements it with pinned
// buffers, cudaMemcpyAsync on its stream and one event per slot; tests with a fake.
// "Device" pointers are never dereferenced by the staging logic, only offset.
class StagingEngine {
 public:
  virtual ~StagingEngine() = default;
  virtual size_t num_slots() const = 0;
  virtual size_t slot_bytes() const = 0;
  // Host memory of slot s (slot_bytes() long). Touched only after WaitSlot(s).
  virtual std::byte* slot(size_t s) = 0;
  // Issue an asynchronous copy of `bytes` between slot s and device memory and return at
  // once; the slot stays busy until WaitSlot(s) has seen the copy complete.
  virtual absl::Status CopySlotToDevice(size_t s, void* device_dst, size_t bytes) = 0;
  virtual absl::Status CopyDeviceToSlot(size_t s, const void* device_src, size_t bytes) = 0;
  // Block until the last copy issued on slot s has completed (at once if there is none).
  virtual absl::Status WaitSlot(size_t s) = 0;
};

// Copies host pieces, in order, to consecutive device bytes from device_dst, chunk by
// chunk through the slots: while slot s's copy runs, the next chunk is gathered into
// slot s+1. Returns once every host byte is in a slot, so the pieces may be reused;
// the last copies may still be in flight (a later staged copy waits for its slot, and
// the engine's stream orders them with later device work). On an error it waits for
// the copies already issued before returning it.
absl::Status StagedCopyToDevice(StagingEngine& engine,
                                std::span<const std::span<const std::byte>> pieces,
                                void* device_dst);

// Copies `bytes` device bytes from device_src to host_dst: up to num_slots() copies
// into slots are kept in flight, and each slot is emptied into host_dst while the next
// ones run. Returns once every byte is in host_dst (no copy is left in flight).
absl::Status StagedCopyToHost(StagingEngine& engine, const void* device_src, size_t bytes,
                              std::byte* host_dst);

}  // namespace pipetrain::compute
