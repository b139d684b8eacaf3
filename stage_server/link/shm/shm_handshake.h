// The same-host handshake's steps, without the stream. For each direction
// of a link the sending end makes a region and offers it (MakeOffer: its name, nonce and
// slot layout, the stream's first message); the receiving end opens it and answers with
// the nonce it read there (AcceptOffer); the sender checks that echo and unlinks the
// name (ConfirmEcho), after which no third process can open the region. Any refusal on
// either side means the link keeps to TCP; the caller says so in the stage's log.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "stage_server/link/shm/shm_region.h"
#include "stage_server/link/shm/shm_transport.h"

namespace pipetrain::stage_server {

struct ShmOffer {
  std::string name;
  std::string nonce_hex;
  ShmLayout layout;
};

// What a receiver admits: at most this many slots, of at most this many bytes each
// (the reassembler's largest frame), in a region of at most max_region_bytes.
struct ShmLimits {
  int max_slots = 256;
  uint64_t max_slot_bytes = uint64_t{64} << 20;
  uint64_t max_region_bytes = uint64_t{1} << 30;
};

// The slots for a link whose largest tensor is `largest_tensor_bytes`: slots of
// min(that, 4 MiB) bytes (at least 4 KiB), enough for four of the largest tensors (at
// least 8 slots: two the receiving stage may hold in place, two in flight), within
// `limits`.
ShmLayout LayoutFor(uint64_t largest_tensor_bytes, const ShmLimits& limits = {});

// The sender's region and its offer.
struct OfferedRegion {
  ShmRegion region;
  ShmOffer offer;
};
absl::StatusOr<OfferedRegion> MakeOffer(const ShmLayout& layout);

// The receiver's end of `offer`: INVALID_ARGUMENT (naming `link` and the field) for a
// layout outside `limits` or a malformed nonce; ShmRegion::Open's refusals otherwise.
// `echo` gets the nonce as read from the region.
absl::StatusOr<ShmReceiver> AcceptOffer(const ShmOffer& offer, const ShmLimits& limits,
                                        const std::string& link, std::string* echo);

// The sender's last step: the echo must be its nonce (PERMISSION_DENIED naming `link`
// otherwise); the name is unlinked either way.
absl::StatusOr<std::unique_ptr<ShmSender>> ConfirmEcho(OfferedRegion offered, const std::string& echo,
                                      const std::string& link);

}  // namespace pipetrain::stage_server
