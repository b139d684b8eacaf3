// One direction of a same-host link, without the stream: the sender writes a
// tensor's bytes into free slots of its shared-memory region (shm_region.h) part by part
// and hands each part's frame header and slot numbers to `emit` (the stream carries them
// instead of the payload); the receiver turns a header's slots back into the payload's
// pieces, which the usual reassembler (common/tensor_codec.h) checks, and returns the
// slots with a credit: at once when it copied them out, or when its stage drops the
// tensor it viewed in place (shm_holds.h). Slot i is the payload's bytes
// [i x slot_bytes, (i + 1) x slot_bytes).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "common/tensor_codec.h"
#include "stage_server/link/shm/shm_region.h"
#include "stage_server/link/shm/shm_slots.h"

namespace pipetrain::stage_server {

// A region's slot layout, as the offer on the stream announces it.
struct ShmLayout {
  int slots = 0;
  uint64_t slot_bytes = 0;
  uint64_t payload_bytes() const { return static_cast<uint64_t>(slots) * slot_bytes; }
  // The protocol's split of the slots: a receiver keeps at most max_held_slots() of
  // them while its stage holds tensors in place (shm_holds.h); a sender's part takes at
  // most the rest, so it always gets them back from tensors the receiver copies out.
  int max_held_slots() const { return slots / 2; }
  uint64_t max_part_bytes() const {
    return static_cast<uint64_t>(slots - max_held_slots()) * slot_bytes;
  }
};

class ShmSender {
 public:
  // `region` must hold layout.payload_bytes(); `link` names the link in errors.
  ShmSender(ShmRegion region, ShmLayout layout, std::string link);

  // Called once a part's bytes are in its slots: the part's header (offset, total), the
  // slots holding it in order, and its bytes.
  using Emit = std::function<absl::Status(const common::FrameHeader&, std::span<const int>,
                                          uint64_t)>;
  // Writes `tensor` in parts of at most layout().max_part_bytes(), waiting (up to `deadline`) for
  // credits when the slots are in flight; the first error of a wait or of `emit`.
  absl::Status Send(const common::FrameTag& tag, const common::Tensor& tensor,
                    absl::Time deadline, const Emit& emit);
  // The receiver's credit for a slot (ShmSlots::Release's refusals).
  absl::Status Credit(int slot) { return slots_.Release(slot); }
  // The link went: every slot free, waiting sends fail with `why`.
  void Close(const std::string& why) { slots_.Close(why); }

  const ShmRegion& region() const { return region_; }
  const ShmLayout& layout() const { return layout_; }
  int free_slots() const { return slots_.free_slots(); }

 private:
  ShmRegion region_;
  const ShmLayout layout_;
  const std::string link_;
  ShmSlots slots_;
};

class ShmReceiver {
 public:
  ShmReceiver(ShmRegion region, ShmLayout layout, std::string link);
  // The `bytes` a header announces, as the named slots' pieces in order (the last one
  // partly filled). INVALID_ARGUMENT, naming the link and the slot, for no slots, a slot
  // out of range or named twice, or bytes that do not need exactly these slots.
  absl::StatusOr<std::vector<std::span<const std::byte>>> Pieces(std::span<const int> slots,
                                                                 uint64_t bytes) const;
  const ShmRegion& region() const { return region_; }
  const ShmLayout& layout() const { return layout_; }

 private:
  ShmRegion region_;
  const ShmLayout layout_;
  const std::string link_;
};

}  // namespace pipetrain::stage_server
