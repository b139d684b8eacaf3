#include "stage_server/link/link_shm.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_format.h"
#include "common/frame_proto.h"
#include "common/status_macros.h"

namespace pipetrain::stage_server {
namespace {

namespace pb = ::pipetrain::v1;

// What this end's region may take: four of the largest tensors (LayoutFor), but no
// more than this of the host's /dev/shm per direction.
constexpr uint64_t kMaxOwnRegionBytes = uint64_t{64} << 20;

std::string Describe(const ShmLayout& l) {
  return absl::StrCat("shared memory (", l.slots, " slots of ",
                      common::FormatBytes(static_cast<double>(l.slot_bytes)), ")");
}

std::string Serialize(const pb::ExchangeMessage& m) { return m.SerializeAsString(); }

constexpr char kOff[] = "tcp (--same-host-transport off)";
constexpr char kNotAnswered[] = "tcp (shared memory offered, not answered yet)";

}  // namespace

ShmLayout LinkShm::OwnLayout(uint64_t largest_tensor_bytes) {
  ShmLimits own;
  own.max_region_bytes = kMaxOwnRegionBytes;
  return LayoutFor(largest_tensor_bytes, own);
}

uint64_t LinkShm::WarmBufferBytes(uint64_t largest_tensor_bytes) {
  return OwnLayout(largest_tensor_bytes).payload_bytes();
}

void LinkShm::Configure(Options options) {
  absl::MutexLock lock(&mu_);
  options_ = std::move(options);
  send_path_ = options_.enabled ? kNotAnswered : kOff;
  receive_path_ = options_.enabled ? "tcp (no offer came)" : kOff;
}

std::optional<std::string> LinkShm::Offer() {
  absl::MutexLock lock(&mu_);
  if (!options_.enabled) return std::nullopt;
  absl::StatusOr<OfferedRegion> offered = MakeOffer(OwnLayout(options_.largest_tensor_bytes));
  if (!offered.ok()) {
    send_path_ = absl::StrCat("tcp (", offered.status().message(), ")");
    return std::nullopt;
  }
  pb::ExchangeMessage m;
  pb::ShmOffer& o = *m.mutable_shm_offer();
  o.set_name(offered->offer.name);
  o.set_nonce_hex(offered->offer.nonce_hex);
  o.set_slots(offered->offer.layout.slots);
  o.set_slot_bytes(offered->offer.layout.slot_bytes);
  offered_ = *std::move(offered);
  send_path_ = kNotAnswered;
  return Serialize(m);
}

absl::StatusOr<std::optional<std::string>> LinkShm::OnControl(const pb::ExchangeMessage& m) {
  absl::MutexLock lock(&mu_);
  switch (m.body_case()) {
    case pb::ExchangeMessage::kShmOffer:
      return OnOffer(m.shm_offer());
    case pb::ExchangeMessage::kShmAnswer:
      RETURN_IF_ERROR(OnAnswer(m.shm_answer()));
      return std::nullopt;
    case pb::ExchangeMessage::kShmCredit:
      if (sender_ == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "link ", options_.link, ": a shared-memory credit, but this end sends on TCP"));
      }
      for (int slot : m.shm_credit().slots()) RETURN_IF_ERROR(sender_->Credit(slot));
      return std::nullopt;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("link ", options_.link, ": not a same-host control message"));
  }
}

absl::StatusOr<std::optional<std::string>> LinkShm::OnOffer(const pb::ShmOffer& offer) {
  if (receiver_ != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("link ", options_.link, ": a second shared-memory offer"));
  }
  pb::ExchangeMessage m;
  pb::ShmAnswer& answer = *m.mutable_shm_answer();
  if (!options_.enabled) {
    answer.set_refusal("the receiving stage runs --same-host-transport off");
    return Serialize(m);
  }
  std::string echo;
  absl::StatusOr<ShmReceiver> receiver = AcceptOffer(
      {offer.name(), offer.nonce_hex(), {offer.slots(), offer.slot_bytes()}}, options_.limits,
      options_.link, &echo);
  if (!receiver.ok()) {
    answer.set_refusal(std::string(receiver.status().message()));
    receive_path_ = absl::StrCat("tcp (", receiver.status().message(), ")");
    return Serialize(m);
  }
  answer.set_nonce_echo(echo);
  receive_path_ = Describe({offer.slots(), offer.slot_bytes()});
  receiver_ = std::make_shared<const ShmReceiver>(*std::move(receiver));
  return Serialize(m);
}

absl::Status LinkShm::OnAnswer(const pb::ShmAnswer& answer) {
  if (!offered_.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link ", options_.link, ": a shared-memory answer to no offer"));
  }
  OfferedRegion offered = *std::move(offered_);
  offered_.reset();
  if (!answer.refusal().empty()) {
    send_path_ = absl::StrCat("tcp (the peer: ", answer.refusal(), ")");
    return absl::OkStatus();  // the region goes, and its name with it
  }
  const ShmLayout layout = offered.offer.layout;
  absl::StatusOr<std::unique_ptr<ShmSender>> sender =
      ConfirmEcho(std::move(offered), answer.nonce_echo(), options_.link);
  if (!sender.ok()) {
    send_path_ = absl::StrCat("tcp (", sender.status().message(), ")");
    return absl::OkStatus();
  }
  sender_ = *std::move(sender);
  send_path_ = Describe(layout);
  return absl::OkStatus();
}

absl::StatusOr<LinkShm::Part> LinkShm::OnFrame(const pb::ShmFrame& frame) {
  absl::MutexLock lock(&mu_);
  if (receiver_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link ", options_.link, ": a shared-memory frame, but no region was accepted"));
  }
  Part part;
  part.slots.assign(frame.slots().begin(), frame.slots().end());
  ASSIGN_OR_RETURN(part.pieces, receiver_->Pieces(part.slots, frame.bytes()));
  part.header = common::HeaderFromProto(frame.header());
  part.receiver = receiver_;
  return part;
}

std::string LinkShm::CreditMessage(std::span<const int> slots) {
  pb::ExchangeMessage m;
  for (int s : slots) m.mutable_shm_credit()->add_slots(s);
  return Serialize(m);
}

std::string LinkShm::FrameMessage(const common::FrameHeader& header, std::span<const int> slots,
                                  uint64_t bytes) {
  pb::ExchangeMessage m;
  pb::ShmFrame& f = *m.mutable_shm_frame();
  common::FrameToProto(common::FrameView{header, {}}, f.mutable_header());
  f.mutable_header()->clear_payload();
  for (int s : slots) f.add_slots(s);
  f.set_bytes(bytes);
  return Serialize(m);
}

ShmSender* LinkShm::sender() {
  absl::MutexLock lock(&mu_);
  return sender_.get();
}

std::string LinkShm::sending_path() {
  absl::MutexLock lock(&mu_);
  return send_path_;
}

std::string LinkShm::receiving_path() {
  absl::MutexLock lock(&mu_);
  return receive_path_;
}

void LinkShm::Close(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (sender_) sender_->Close(why);
}

}  // namespace pipetrain::stage_server
