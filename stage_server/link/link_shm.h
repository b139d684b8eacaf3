// The same-host transport of one peer-link end: the handshake's state for
// both directions of the stream and the translation of its messages. This end offers a
// shared-memory region for what it sends (Offer, right after the stream starts); the
// peer's answer either names the nonce it read there (from then on this end's tensors
// go through the region's slots: sender()) or says why not (they keep to the stream).
// The peer's offer for what it sends is answered the same way (OnControl), and its
// frames' slots are read here (OnFrame) and returned with a credit. Everything that
// fails leaves that direction on TCP and says why in path(). Thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor_codec.h"
#include "pipetrain/v1/stage.pb.h"
#include "stage_server/link/shm/shm_handshake.h"

namespace pipetrain::stage_server {

class LinkShm {
 public:
  // Tensors smaller than this go on the stream even where the region was accepted: the
  // stream carries them in one message, shared memory in two (header, credit), and the
  // copy it saves is worth less than the second message below about this size.
  static constexpr uint64_t kMinTensorBytes = uint64_t{256} << 10;

  // This end's region for what it sends: four of the largest tensors (LayoutFor), at
  // most 64 MiB of the host's /dev/shm per direction.
  static ShmLayout OwnLayout(uint64_t largest_tensor_bytes);
  // The most a link end keeps of warm buffers for tensors it copied out (of the peer's
  // slots, or reassembled from the stream's frames): as much as its own region.
  static uint64_t WarmBufferBytes(uint64_t largest_tensor_bytes);

  struct Options {
    bool enabled = false;               // pipetrain-stage --same-host-transport auto
    std::string link;                   // names the link in logs and errors
    uint64_t largest_tensor_bytes = 0;  // the link's limit, for the slots' size
    ShmLimits limits;                   // what this end admits of the peer's offer
  };
  LinkShm() = default;
  void Configure(Options options);  // before the stream starts

  // This end's offer, an ExchangeMessage to send; nullopt when off or when no region
  // could be made (path() says why).
  std::optional<std::string> Offer();

  // The peer's offer, answer or credit: the reply to send, if any. An error is the
  // peer's breach of the protocol (an answer nobody asked for, a credit for a slot not
  // in flight) and fails the link.
  absl::StatusOr<std::optional<std::string>> OnControl(const pipetrain::v1::ExchangeMessage& m);

  // The peer's part in the region: its header, its bytes where they lie (valid until the
  // credit for `slots` is sent), those slots, and the region (mapped while held).
  struct Part {
    common::FrameHeader header;
    std::vector<std::span<const std::byte>> pieces;
    std::vector<int> slots;
    std::shared_ptr<const ShmReceiver> receiver;
  };
  absl::StatusOr<Part> OnFrame(const pipetrain::v1::ShmFrame& frame);
  static std::string CreditMessage(std::span<const int> slots);
  static std::string FrameMessage(const common::FrameHeader& header, std::span<const int> slots,
                                  uint64_t bytes);

  // This end's sender once the peer accepted; null until then or when refused. It
  // lives as long as this object.
  ShmSender* sender();
  // "shared memory (8 slots of 4 MiB)" or "tcp (why)", for each direction.
  std::string sending_path();
  std::string receiving_path();
  // The link went: sends waiting for slots fail with `why`.
  void Close(const std::string& why);

 private:
  absl::StatusOr<std::optional<std::string>> OnOffer(const pipetrain::v1::ShmOffer& offer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OnAnswer(const pipetrain::v1::ShmAnswer& answer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  Options options_ ABSL_GUARDED_BY(mu_);
  std::optional<OfferedRegion> offered_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ShmSender> sender_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const ShmReceiver> receiver_ ABSL_GUARDED_BY(mu_);
  std::string send_path_ ABSL_GUARDED_BY(mu_) = "tcp (--same-host-transport off)";
  std::string receive_path_ ABSL_GUARDED_BY(mu_) = "tcp (--same-host-transport off)";
};

}  // namespace pipetrain::stage_server
