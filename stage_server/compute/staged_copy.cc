// The chunk loops of staged_copy.h. Every slot is waited for before the host touches it
// and before a copy is issued onto it, so an engine whose slots complete out of order
// (or a stream shared with other staged copies) stays correct.
#include "stage_server/compute/staged_copy.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pipetrain::compute {
namespace {

absl::Status CheckEngine(const StagingEngine& engine) {
  if (engine.num_slots() == 0 || engine.slot_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged copy: the engine has ", engine.num_slots(), " slots of ",
                     engine.slot_bytes(), " bytes; it needs at least one non-empty slot"));
  }
  return absl::OkStatus();
}

// Waits for every slot so that no copy still uses a slot (or the caller's memory) once
// we return, and returns the first error: `status` if it is one.
absl::Status Drain(StagingEngine& engine, absl::Status status) {
  for (size_t s = 0; s < engine.num_slots(); ++s) {
    absl::Status waited = engine.WaitSlot(s);
    if (status.ok()) status = waited;
  }
  return status;
}

// Reads consecutive bytes out of a sequence of pieces, skipping empty ones.
class PieceReader {
 public:
  explicit PieceReader(std::span<const std::span<const std::byte>> pieces)
      : pieces_(pieces) {}
  // Copies exactly n bytes to out; the caller asks for no more than the pieces hold.
  void Read(std::byte* out, size_t n) {
    while (n > 0) {
      const std::span<const std::byte> piece = pieces_[index_];
      const size_t take = std::min(n, piece.size() - offset_);
      if (take > 0) std::memcpy(out, piece.data() + offset_, take);
      out += take;
      n -= take;
      offset_ += take;
      if (offset_ == piece.size()) {
        ++index_;
        offset_ = 0;
      }
    }
  }

 private:
  std::span<const std::span<const std::byte>> pieces_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

}  // namespace

absl::Status StagedCopyToDevice(StagingEngine& engine,
                                std::span<const std::span<const std::byte>> pieces,
                                void* device_dst) {
  if (absl::Status s = CheckEngine(engine); !s.ok()) return s;
  size_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  auto* dst = static_cast<std::byte*>(device_dst);
  PieceReader reader(pieces);
  for (size_t done = 0, chunk = 0; done < total; ++chunk) {
    const size_t s = chunk % engine.num_slots();
    const size_t n = std::min(engine.slot_bytes(), total - done);
    // The slot's previous copy (this call's chunk - num_slots, or an earlier call's)
    // must have read the slot before we overwrite it.
    if (absl::Status st = engine.WaitSlot(s); !st.ok()) return Drain(engine, st);
    reader.Read(engine.slot(s), n);
    if (absl::Status st = engine.CopySlotToDevice(s, dst + done, n); !st.ok()) {
      return Drain(engine, st);
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status StagedCopyToHost(StagingEngine& engine, const void* device_src, size_t bytes,
                              std::byte* host_dst) {
  if (absl::Status s = CheckEngine(engine); !s.ok()) return s;
  const size_t slots = engine.num_slots();
  const size_t slot_bytes = engine.slot_bytes();
  const size_t chunks = (bytes + slot_bytes - 1) / slot_bytes;
  const auto* src = static_cast<const std::byte*>(device_src);
  // Issues chunk c into its slot, once whatever still used the slot has completed.
  auto issue = [&](size_t c) -> absl::Status {
    const size_t s = c % slots;
    if (absl::Status st = engine.WaitSlot(s); !st.ok()) return st;
    const size_t offset = c * slot_bytes;
    return engine.CopyDeviceToSlot(s, src + offset, std::min(slot_bytes, bytes - offset));
  };
  for (size_t c = 0; c < std::min(slots, chunks); ++c) {
    if (absl::Status st = issue(c); !st.ok()) return Drain(engine, st);
  }
  for (size_t c = 0; c < chunks; ++c) {
    const size_t s = c % slots;
    const size_t offset = c * slot_bytes;
    if (absl::Status st = engine.WaitSlot(s); !st.ok()) return Drain(engine, st);
    // The other slots' copies run while this one is emptied.
    std::memcpy(host_dst + offset, engine.slot(s), std::min(slot_bytes, bytes - offset));
    if (c + slots < chunks) {
      if (absl::Status st = issue(c + slots); !st.ok()) return Drain(engine, st);
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
