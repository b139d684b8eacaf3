#include "stage_server/link/shm/shm_handshake.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::stage_server {

ShmLayout LayoutFor(uint64_t largest_tensor_bytes, const ShmLimits& limits) {
  constexpr uint64_t kMinSlot = 4096, kMaxSlot = uint64_t{4} << 20;
  ShmLayout layout;
  layout.slot_bytes = std::clamp<uint64_t>(largest_tensor_bytes, kMinSlot,
                                           std::min(kMaxSlot, limits.max_slot_bytes));
  const uint64_t per_tensor = (largest_tensor_bytes + layout.slot_bytes - 1) / layout.slot_bytes;
  const uint64_t fit = std::max<uint64_t>(1, limits.max_region_bytes / layout.slot_bytes);
  layout.slots = static_cast<int>(std::min<uint64_t>(
      {std::max<uint64_t>(8, 4 * per_tensor), static_cast<uint64_t>(limits.max_slots), fit}));
  return layout;
}

absl::StatusOr<OfferedRegion> MakeOffer(const ShmLayout& layout) {
  ASSIGN_OR_RETURN(ShmRegion region, ShmRegion::Create(layout.payload_bytes()));
  ShmOffer offer{region.name(), ShmNonceHex(region.nonce()), layout};
  return OfferedRegion{std::move(region), std::move(offer)};
}

absl::StatusOr<ShmReceiver> AcceptOffer(const ShmOffer& offer, const ShmLimits& limits,
                                        const std::string& link, std::string* echo) {
  const ShmLayout& l = offer.layout;
  if (l.slots < 1 || l.slots > limits.max_slots || l.slot_bytes < 1 ||
      l.slot_bytes > limits.max_slot_bytes || l.payload_bytes() > limits.max_region_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link ", link, ": a shared-memory offer of ", l.slots, " slots of ", l.slot_bytes,
        " bytes is outside 1..", limits.max_slots, " slots of at most ", limits.max_slot_bytes,
        " bytes, ", limits.max_region_bytes, " in all"));
  }
  absl::StatusOr<ShmNonce> nonce = ShmNonceFromHex(offer.nonce_hex);
  if (!nonce.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("link ", link, ": ", nonce.status().message()));
  }
  ASSIGN_OR_RETURN(ShmRegion region, ShmRegion::Open(offer.name, l.payload_bytes(), *nonce));
  *echo = ShmNonceHex(region.nonce());
  return ShmReceiver(std::move(region), l, link);
}

absl::StatusOr<std::unique_ptr<ShmSender>> ConfirmEcho(OfferedRegion offered, const std::string& echo,
                                      const std::string& link) {
  const absl::Status unlinked = offered.region.Unlink();
  if (echo != offered.offer.nonce_hex) {
    return absl::PermissionDeniedError(absl::StrCat(
        "link ", link, ": the neighbour echoed another nonce for shared-memory region ",
        offered.offer.name, "; keeping to TCP"));
  }
  RETURN_IF_ERROR(unlinked);
  return std::make_unique<ShmSender>(std::move(offered.region), offered.offer.layout, link);
}

}  // namespace pipetrain::stage_server
