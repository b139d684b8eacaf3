#include "stage_server/link/link_core.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/support/slice.h"
#include "stage_server/link/frame_wire.h"

namespace pipetrain::stage_server {
namespace {

using common::FrameTag;
using common::Tensor;

// Keeps the tensor alive while gRPC holds a slice of it.
void ReleaseTensorRef(void* user_data) {
  delete static_cast<std::shared_ptr<const Tensor>*>(user_data);
}

std::string DescribeWanted(const FrameTag& tag) {
  return absl::StrCat(common::TensorKindName(tag.kind), " of step ", tag.step,
                      " micro-batch ", tag.micro_batch, " chunk ", tag.chunk);
}

// Reactor calls this thread has in flight: a reaction that runs inline inside one of
// them must not wait for it to finish.
thread_local int tls_io_calls = 0;

}  // namespace

LinkCore::LinkCore(PeerLinkOptions options)
    : options_(std::move(options)),
      shm_pool_(std::make_shared<common::BufferPool>(
          LinkShm::WarmBufferBytes(options_.limits.max_tensor_bytes))),
      reassembler_(options_.limits, shm_pool_.get()),
      holds_(std::make_shared<ShmHolds>([this](std::span<const int> s) { SendCredit(s); })) {
  ConfigureShm();
  starter_ = std::thread([this] { StartWrites(); });
}

void LinkCore::ConfigureShm() {
  shm_.Configure({.enabled = options_.same_host,
                  .link = PeerName(),
                  .largest_tensor_bytes = options_.limits.max_tensor_bytes,
                  .limits = {}});
}

void LinkCore::SendMessage(const std::string& bytes) {
  grpc::Slice slice(bytes);
  SendRaw(grpc::ByteBuffer(&slice, 1));
}

void LinkCore::SendCredit(std::span<const int> slots) {
  grpc::Slice slice(LinkShm::CreditMessage(slots));
  absl::MutexLock lock(&mu_);
  if (closing_ || done_ || !status_.ok()) return;
  queue_.push_back({grpc::ByteBuffer(&slice, 1), 0});
  WakeStarterLocked();  // the starter thread writes, not the stage's executor
}

void LinkCore::WakeStarterLocked() {
  if (!writing_ && attached_) {
    writing_ = true;
    start_pending_ = true;
  }
}

void LinkCore::StartSameHost() {
  if (std::optional<std::string> offer = shm_.Offer()) {
    SendMessage(*offer);  // the answer's handling logs the path
  } else {
    common::LogInfo("link", absl::StrCat("to ", PeerName(), ": sending on ", shm_.sending_path()));
  }
}

LinkCore::~LinkCore() {
  holds_->Detach();  // tensors still held credit nothing after this
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  starter_.join();
}

void LinkCore::StartWrites() {
  for (;;) {
    const grpc::ByteBuffer* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return start_pending_ || stopping_;
      };
      mu_.Await(absl::Condition(&wanted));
      if (stopping_) return;
      start_pending_ = false;
      // Only OnWriteDone pops the queue, and no write is in flight yet.
      if (!queue_.empty()) start = &queue_.front().buffer;
    }
    if (start) CallIo([start](Io* io) { io->StartWrite(start); });
  }
}

void LinkCore::SetOptions(PeerLinkOptions options) {
  options_ = std::move(options);
  // Tensors still out hold the old pool; the new one is sized for the new limits.
  shm_pool_ = std::make_shared<common::BufferPool>(
      LinkShm::WarmBufferBytes(options_.limits.max_tensor_bytes));
  reassembler_ = common::TensorReassembler(options_.limits, shm_pool_.get());
  ConfigureShm();
}

std::string LinkCore::PeerName() const {
  return absl::StrCat("stage ", options_.peer_stage,
                      options_.peer_address.empty() ? "" : " at ", options_.peer_address,
                      " (job '", options_.job_id, "')");
}

LinkCore::Key LinkCore::KeyOf(const FrameTag& tag) {
  return {tag.step, tag.micro_batch, tag.chunk, static_cast<int>(tag.kind)};
}

template <typename F>
bool LinkCore::CallIo(F f) {
  Io* io;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_requested_ || done_ || io_ == nullptr) return false;
    io = io_;
    ++io_calls_in_flight_;
  }
  ++tls_io_calls;
  f(io);
  --tls_io_calls;
  absl::MutexLock lock(&mu_);
  --io_calls_in_flight_;
  return true;
}

void LinkCore::Attach(Io* io) {
  const grpc::ByteBuffer* start = nullptr;
  {
    absl::MutexLock lock(&mu_);
    io_ = io;
    attached_ = true;
    if (!writing_ && !queue_.empty()) {
      writing_ = true;
      start = &queue_.front().buffer;
    }
  }
  if (start) CallIo([start](Io* io) { io->StartWrite(start); });
}

void LinkCore::RequestShutdown(const grpc::Status& status, bool cancel) {
  Io* io = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_requested_ || done_ || io_ == nullptr) return;
    shutdown_requested_ = true;
    // Wait out reactor calls started by other threads so none follows the shutdown.
    const int mine = tls_io_calls;
    auto idle = [this, mine]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return io_calls_in_flight_ <= mine;
    };
    mu_.Await(absl::Condition(&idle));
    io = io_;
  }
  io->Shutdown(status, cancel);
}

void LinkCore::FailLocked(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
  shm_.Close(std::string(status_.message()));  // sends waiting for slots fail too
  // Frames not yet written will never be: let their tensors go.
  queue_.clear();
  queued_bytes_ = 0;
  writing_ = false;
}

void LinkCore::SendRaw(grpc::ByteBuffer buffer) {
  const grpc::ByteBuffer* start = nullptr;
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back({std::move(buffer), 0});
    if (!writing_) {
      writing_ = true;
      start = &queue_.front().buffer;
    }
  }
  if (start) CallIo([start](Io* io) { io->StartWrite(start); });
}

absl::Status LinkCore::Send(const FrameTag& tag, std::shared_ptr<const Tensor> tensor,
                            absl::Time deadline) {
  // Small tensors keep to the stream: there one message carries them, where shared
  // memory takes two (the header, the credit) to save a copy that costs less.
  ShmSender* shm = shm_.sender();
  if (shm != nullptr && tensor->num_bytes() >= LinkShm::kMinTensorBytes) {
    absl::Status sent = SendShm(*shm, tag, *tensor, deadline);
    absl::MutexLock lock(&mu_);
    // A link that failed says why, not the slots it closed.
    return sent.ok() || status_.ok() ? sent : status_;
  }
  ASSIGN_OR_RETURN(common::TensorEncoder encoder,
                   common::TensorEncoder::Create(tag, *tensor, options_.frame_bytes));
  std::vector<Outgoing> frames;
  frames.reserve(encoder.num_frames());
  for (size_t i = 0; i < encoder.num_frames(); ++i) {
    const common::FrameView f = encoder.frame(i);
    const std::string prefix = EncodeFramePrefix(f);
    grpc::Slice slices[2] = {grpc::Slice(prefix), grpc::Slice()};
    size_t n = 1;
    if (!f.payload.empty()) {
      // The payload slice points into the tensor; the slice owns one reference to it.
      auto* ref = new std::shared_ptr<const Tensor>(tensor);
      slices[1] = grpc::Slice(const_cast<std::byte*>(f.payload.data()), f.payload.size(),
                              &ReleaseTensorRef, ref);
      n = 2;
    }
    frames.push_back({grpc::ByteBuffer(slices, n), f.payload.size()});
  }
  return Enqueue(std::move(frames), tensor->num_bytes(), tag, deadline);
}

absl::Status LinkCore::SendShm(ShmSender& shm, const FrameTag& tag, const Tensor& tensor,
                               absl::Time deadline) {
  return shm.Send(tag, tensor, deadline,
                  [&](const common::FrameHeader& header, std::span<const int> slots,
                      uint64_t bytes) -> absl::Status {
                    grpc::Slice slice(LinkShm::FrameMessage(header, slots, bytes));
                    std::vector<Outgoing> one;
                    one.push_back({grpc::ByteBuffer(&slice, 1), 0});
                    RETURN_IF_ERROR(Enqueue(std::move(one), 0, tag, deadline));
                    absl::MutexLock lock(&mu_);
                    bytes_sent_ += bytes;
                    bytes_sent_same_host_ += bytes;
                    return absl::OkStatus();
                  });
}

absl::Status LinkCore::Enqueue(std::vector<Outgoing> frames, size_t bytes, const FrameTag& tag,
                               absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    auto has_room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !status_.ok() || closing_ || bytes == 0 || queued_bytes_ == 0 ||
             queued_bytes_ + bytes <= options_.max_queued_bytes;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&has_room), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "sending ", DescribeWanted(tag), " to ", PeerName(), ": the send queue stayed full (",
          queued_bytes_, " bytes) until the deadline"));
    }
    if (!status_.ok()) return status_;
    if (closing_) return absl::CancelledError(absl::StrCat("link to ", PeerName(), " is closed"));
    for (Outgoing& o : frames) {
      queued_bytes_ += o.payload_bytes;
      queue_.push_back(std::move(o));
    }
    WakeStarterLocked();  // the starter thread writes; this one goes on computing
  }
  return absl::OkStatus();
}

void LinkCore::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* next = nullptr;
  if (!ok) {
    // The stream is over for writing (the peer finished it or went away), and no write
    // follows (writing_ stays set). The read that is always pending ends too, and the
    // call's final status, which says why (a refused frame, a wrong secret), fails the
    // link in OnDone: a failure of its own here would hide that reason.
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!queue_.empty()) {
      bytes_sent_ += queue_.front().payload_bytes;
      queued_bytes_ -= queue_.front().payload_bytes;
      queue_.pop_front();
    }
    if (queue_.empty()) {
      writing_ = false;
    } else {
      next = &queue_.front().buffer;
    }
  }
  if (next) CallIo([next](Io* io) { io->StartWrite(next); });
}

absl::Status LinkCore::HandleMessage(grpc::ByteBuffer* buffer) {
  // The message's slices (references, not copies) become the tensor's storage: the
  // payload is never copied here, only viewed, and the slices live as long as the
  // received tensor does.
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer->Dump(slices.get()).ok()) {
    return absl::InvalidArgumentError("could not read a message's bytes");
  }
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(slices->size());
  for (const grpc::Slice& s : *slices) {
    pieces.emplace_back(reinterpret_cast<const std::byte*>(s.begin()), s.size());
  }
  ASSIGN_OR_RETURN(ParsedExchange msg, ParseExchange(pieces));
  if (msg.kind == ParsedExchange::Kind::kControl) return HandleControl(msg.control);
  if (msg.kind != ParsedExchange::Kind::kFrame) {
    return absl::InvalidArgumentError("a second hello arrived on an established link");
  }
  RETURN_IF_ERROR(CheckTag(msg.header.tag));
  ASSIGN_OR_RETURN(std::optional<common::ReceivedPieces> done,
                   reassembler_.AcceptPieces(msg.header, msg.payload, std::move(slices)));
  uint64_t bytes = 0;
  for (const auto& p : msg.payload) bytes += p.size();
  if (!done.has_value()) return Deliver(std::nullopt, bytes);
  return Deliver(std::make_pair(done->tag, std::move(done->tensor)), bytes);
}

absl::Status LinkCore::HandleControl(const pipetrain::v1::ExchangeMessage& message) {
  if (!message.has_shm_frame()) {
    ASSIGN_OR_RETURN(std::optional<std::string> reply, shm_.OnControl(message));
    if (reply) SendMessage(*reply);
    if (message.has_shm_offer()) {
      common::LogInfo("link", absl::StrCat("from ", PeerName(), ": receiving on ",
                                           shm_.receiving_path()));
    } else if (message.has_shm_answer()) {
      common::LogInfo("link", absl::StrCat("to ", PeerName(), ": sending on ",
                                           shm_.sending_path()));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(LinkShm::Part part, shm_.OnFrame(message.shm_frame()));
  RETURN_IF_ERROR(CheckTag(part.header.tag));
  const uint64_t bytes = message.shm_frame().bytes();  // what part.pieces add up to
  ASSIGN_OR_RETURN(std::optional<common::ReceivedPieces> done,
                   AcceptShmPart(std::move(part), bytes));
  if (!done.has_value()) return Deliver(std::nullopt, bytes);
  return Deliver(std::make_pair(done->tag, std::move(done->tensor)), bytes);
}

absl::StatusOr<std::optional<common::ReceivedPieces>> LinkCore::AcceptShmPart(LinkShm::Part part,
                                                                             uint64_t bytes) {
  const bool whole = part.header.offset == 0 && !reassembler_.in_progress() &&
                     bytes == part.header.total_bytes;
  if (whole) {
    const int limit = part.receiver->layout().max_held_slots();
    if (std::shared_ptr<const void> hold = holds_->TryHold(part.receiver, part.slots, limit)) {
      // Checked like any frame; a refusal drops the hold, which credits the slots.
      return reassembler_.AcceptPieces(part.header, part.pieces, std::move(hold));
    }
  }
  // The bytes are copied out of the slots here (or refused): they go back either way.
  absl::StatusOr<std::optional<common::ReceivedTensor>> done =
      reassembler_.Accept(part.header, part.pieces);
  SendMessage(LinkShm::CreditMessage(part.slots));
  if (!done.ok()) return done.status();
  if (!done->has_value()) return std::optional<common::ReceivedPieces>();
  ASSIGN_OR_RETURN(common::PiecewiseTensor tensor, Pooled(std::move((*done)->tensor)));
  return std::optional<common::ReceivedPieces>(
      common::ReceivedPieces{(*done)->tag, std::move(tensor)});
}

absl::StatusOr<common::PiecewiseTensor> LinkCore::Pooled(Tensor tensor) {
  auto* owned = new Tensor(std::move(tensor));
  std::shared_ptr<const void> owner(owned, [pool = shm_pool_](Tensor* t) {
    pool->Release(t->ReleaseBuffer());
    delete t;
  });
  std::vector<common::PiecewiseTensor::Piece> pieces;
  if (owned->num_bytes() > 0) pieces.push_back(owned->bytes());
  return common::PiecewiseTensor::FromPieces(owned->dtype(), owned->shape(), std::move(pieces),
                                             {std::move(owner)});
}

absl::Status LinkCore::CheckTag(const FrameTag& tag) {
  if (tag.job_id != options_.job_id) {
    return absl::InvalidArgumentError(absl::StrCat("frame of job '", tag.job_id,
                                                   "' on the link of job '", options_.job_id,
                                                   "' (field job_id)"));
  }
  // Besides its own kind, a link may carry the once-a-step tied-embedding gradient
  // (the executor asks for it by tag only on the first and last stage's ring link).
  const common::TensorKind want = tag.chunk < options_.receive_kinds.size()
                                      ? options_.receive_kinds[tag.chunk]
                                      : options_.receive_kind;
  if (tag.kind != want && tag.kind != common::TensorKind::kTiedGradient) {
    if (want == common::TensorKind::kUnspecified) {
      return absl::InvalidArgumentError(absl::StrCat(common::DescribeTag(tag),
                                                     ": this link carries nothing to chunk ",
                                                     tag.chunk, " (field chunk)"));
    }
    const std::string to_chunk =
        options_.receive_kinds.empty() ? "" : absl::StrCat(" for chunk ", tag.chunk);
    return absl::InvalidArgumentError(absl::StrCat(common::DescribeTag(tag),
                                                   ": this link receives only ",
                                                   common::TensorKindName(want), "s", to_chunk,
                                                   " (field kind)"));
  }
  absl::MutexLock lock(&mu_);
  // A neighbour may start a step before this stage does, so later steps are kept;
  // an earlier one is stale.
  if (tag.step < min_step_) {
    return absl::InvalidArgumentError(absl::StrCat(
        common::DescribeTag(tag), ": stale, this stage is at step ", min_step_, " (field step)"));
  }
  return absl::OkStatus();
}

absl::Status LinkCore::Deliver(std::optional<std::pair<FrameTag, common::PiecewiseTensor>> done,
                               uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_received_ += bytes;
  if (!done.has_value()) return absl::OkStatus();
  const Key key = KeyOf(done->first);
  if (mailbox_.count(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::DescribeTag(done->first), " arrived twice"));
  }
  mailbox_.emplace(key, std::move(done->second));
  return absl::OkStatus();
}

void LinkCore::KeepAlive(std::shared_ptr<void> owner) { keep_alive_ = std::move(owner); }

void LinkCore::OnReadDone(bool ok, grpc::ByteBuffer* buffer) {
  if (!ok) {
    // The peer ended the stream or went away; the call's final status, which says
    // why, arrives in OnDone.
    RequestShutdown(grpc::Status::OK, /*cancel=*/false);
    return;
  }
  absl::Status s = HandleMessage(buffer);
  buffer->Clear();
  if (!s.ok()) {
    common::LogWarning("link", absl::StrCat("rejected a message from ", PeerName(), ": ",
                                            s.message()));
    {
      absl::MutexLock lock(&mu_);
      FailLocked(s);
    }
    RequestShutdown(common::ToGrpcStatus(s), /*cancel=*/true);
    return;
  }
  CallIo([buffer](Io* io) { io->StartRead(buffer); });
}

void LinkCore::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    absl::Status cause = common::FromGrpcStatus(status);
    if (cause.code() == absl::StatusCode::kCancelled ||
        cause.code() == absl::StatusCode::kUnavailable) {
      cause = absl::UnavailableError(
          absl::StrCat("link to ", PeerName(), " broke: ", status.error_message()));
    }
    FailLocked(cause);
  } else if (status_.ok()) {
    FailLocked(absl::UnavailableError(absl::StrCat("link to ", PeerName(), " ended")));
  }
  done_ = true;
  io_ = nullptr;
}

absl::Status LinkCore::WaitAttached(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return attached_ || !status_.ok() || done_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("link to ", PeerName(), " did not start before the deadline"));
  }
  return status_;
}

void LinkCore::BeginStep(uint64_t step) {
  // Dropped after the lock: a tensor held in the peer's slots sends its credit.
  std::vector<common::PiecewiseTensor> stale;
  absl::MutexLock lock(&mu_);
  min_step_ = step;
  for (auto it = mailbox_.begin(); it != mailbox_.end();) {
    if (std::get<0>(it->first) >= step) {
      ++it;
      continue;
    }
    common::LogWarning("link", absl::StrCat("dropping an unclaimed tensor of step ",
                                            std::get<0>(it->first), " from ", PeerName(),
                                            " at the start of step ", step));
    stale.push_back(std::move(it->second));
    it = mailbox_.erase(it);
  }
}

absl::StatusOr<common::PiecewiseTensor> LinkCore::Receive(const FrameTag& tag, absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  const Key key = KeyOf(tag);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return mailbox_.count(key) > 0 || !status_.ok() || closing_;
  };
  const bool arrived = mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (auto it = mailbox_.find(key); it != mailbox_.end()) {
    common::PiecewiseTensor t = std::move(it->second);
    mailbox_.erase(it);
    return t;
  }
  if (!status_.ok()) {
    return common::ErrorContext(absl::StrCat("waiting for ", DescribeWanted(tag), " from ",
                                             PeerName()))
        .Wrap(status_);
  }
  if (closing_) return absl::CancelledError(absl::StrCat("link to ", PeerName(), " is closed"));
  (void)arrived;
  return absl::DeadlineExceededError(absl::StrCat(
      "no ", DescribeWanted(tag), " from ", PeerName(), " within ",
      absl::FormatDuration(absl::Now() - start)));
}

absl::Status LinkCore::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() || !status_.ok() || closing_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&drained), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("sends to ", PeerName(),
                                                    " did not drain before the deadline (",
                                                    queued_bytes_, " bytes left)"));
  }
  return status_;
}

void LinkCore::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
  }
  shm_.Close(absl::StrCat("link to ", PeerName(), " is closed"));
  RequestShutdown(grpc::Status::OK, /*cancel=*/true);
  std::shared_ptr<void> owner;
  {
    absl::MutexLock lock(&mu_);
    // OnDone follows the shutdown once gRPC has finished with the call; bounded so
    // that a wedged transport cannot hang the stage.
    auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !attached_; };
    mu_.AwaitWithTimeout(absl::Condition(&finished), absl::Seconds(10));
    if (status_.ok()) {
      status_ = absl::CancelledError(absl::StrCat("link to ", PeerName(), " is closed"));
    }
    queue_.clear();
    queued_bytes_ = 0;
    // The reactor may be released only once gRPC is done with it; if it never
    // finished, leaking it is safer than freeing memory a late callback would touch.
    if (done_) owner = std::move(keep_alive_);
  }
}

absl::Status LinkCore::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}
uint64_t LinkCore::bytes_sent() const {
  absl::MutexLock lock(&mu_);
  return bytes_sent_;
}
uint64_t LinkCore::bytes_sent_same_host() const {
  absl::MutexLock lock(&mu_);
  return bytes_sent_same_host_;
}
uint64_t LinkCore::bytes_received() const {
  absl::MutexLock lock(&mu_);
  return bytes_received_;
}

}  // namespace pipetrain::stage_server
