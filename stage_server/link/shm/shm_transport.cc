#include "stage_server/link/shm/shm_transport.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::stage_server {

ShmSender::ShmSender(ShmRegion region, ShmLayout layout, std::string link)
    : region_(std::move(region)),
      layout_(layout),
      link_(std::move(link)),
      slots_(layout.slots, layout.slot_bytes, link_) {}

absl::Status ShmSender::Send(const common::FrameTag& tag, const common::Tensor& tensor,
                             absl::Time deadline, const Emit& emit) {
  ASSIGN_OR_RETURN(const common::TensorEncoder parts,
                   common::TensorEncoder::Create(tag, tensor, layout_.max_part_bytes()));
  std::span<std::byte> memory = region_.payload();
  for (size_t p = 0; p < parts.num_frames(); ++p) {
    const common::FrameView part = parts.frame(p);
    ASSIGN_OR_RETURN(const std::vector<int> slots,
                     slots_.Acquire(slots_.SlotsFor(part.payload.size()), deadline));
    size_t done = 0;
    for (int s : slots) {
      const size_t n = std::min<size_t>(layout_.slot_bytes, part.payload.size() - done);
      std::memcpy(memory.data() + static_cast<size_t>(s) * layout_.slot_bytes,
                  part.payload.data() + done, n);
      done += n;
    }
    RETURN_IF_ERROR(emit(part.header, slots, part.payload.size()));
  }
  return absl::OkStatus();
}

ShmReceiver::ShmReceiver(ShmRegion region, ShmLayout layout, std::string link)
    : region_(std::move(region)), layout_(layout), link_(std::move(link)) {}

absl::StatusOr<std::vector<std::span<const std::byte>>> ShmReceiver::Pieces(
    std::span<const int> slots, uint64_t bytes) const {
  const uint64_t needed = std::max<uint64_t>(1, (bytes + layout_.slot_bytes - 1) / layout_.slot_bytes);
  if (slots.empty() || slots.size() != needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link ", link_, ": a shared-memory frame of ", bytes, " bytes names ", slots.size(),
        " slots of ", layout_.slot_bytes, " bytes, not ", needed));
  }
  std::set<int> seen;
  std::vector<std::span<const std::byte>> pieces;
  const std::span<std::byte> memory = region_.payload();
  uint64_t left = bytes;
  for (int s : slots) {
    if (s < 0 || s >= layout_.slots || !seen.insert(s).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "link ", link_, ": a shared-memory frame names slot ", s, " (out of 0..",
          layout_.slots - 1, " or named twice)"));
    }
    const uint64_t n = std::min(left, layout_.slot_bytes);
    pieces.emplace_back(memory.data() + static_cast<size_t>(s) * layout_.slot_bytes, n);
    left -= n;
  }
  return pieces;
}

}  // namespace pipetrain::stage_server
