#include "stage_server/link/peer_link.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "grpcpp/generic/generic_stub.h"
#include "stage_server/link/frame_wire.h"
#include "stage_server/link/link_core.h"

namespace pipetrain::stage_server {
namespace {

constexpr char kExchangeMethod[] = "/pipetrain.v1.Stage/Exchange";

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// The upstream end: a client stream. It holds the call open (AddHold) until the core
// shuts it down, so that OnDone, after which the reactor must not be touched, comes
// only once the core has stopped using it.
class ClientEndpoint final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                             public LinkCore::Io {
 public:
  explicit ClientEndpoint(std::shared_ptr<LinkCore> core) : core_(std::move(core)) {}

  void Start(grpc::GenericStub& stub) {
    context_.set_wait_for_ready(false);
    stub.PrepareBidiStreamingCall(&context_, kExchangeMethod, grpc::StubOptions(), this);
    core_->Attach(this);
    AddHold();
    StartRead(&read_buffer_);
    StartCall();
  }

  // LinkCore::Io
  void StartWrite(const grpc::ByteBuffer* buffer) override {
    ClientBidiReactor::StartWrite(buffer);
  }
  void StartRead(grpc::ByteBuffer* buffer) override { ClientBidiReactor::StartRead(buffer); }
  void Shutdown(const grpc::Status&, bool cancel) override {
    if (cancel) context_.TryCancel();
    RemoveHold();
  }

  // Reactions
  void OnReadDone(bool ok) override { core_->OnReadDone(ok, &read_buffer_); }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(ok); }
  void OnDone(const grpc::Status& status) override { core_->OnDone(status); }

 private:
  std::shared_ptr<LinkCore> core_;
  grpc::ClientContext context_;
  grpc::ByteBuffer read_buffer_;
};

// Owns the client reactor for as long as the link lives (the reactor must outlive
// its call, which ends in Close).
struct ClientLink {
  std::unique_ptr<grpc::GenericStub> stub;
  std::unique_ptr<ClientEndpoint> endpoint;
};

// The downstream end: a server stream. Its first message must be a hello that the
// acceptor admits; it deletes itself when gRPC is done with the call.
class ServerEndpoint final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                             public LinkCore::Io {
 public:
  explicit ServerEndpoint(LinkAcceptor* acceptor)
      : acceptor_(acceptor), core_(std::make_shared<LinkCore>(PeerLinkOptions{})) {
    ServerBidiReactor::StartRead(&read_buffer_);
  }

  void StartWrite(const grpc::ByteBuffer* buffer) override {
    ServerBidiReactor::StartWrite(buffer);
  }
  void StartRead(grpc::ByteBuffer* buffer) override { ServerBidiReactor::StartRead(buffer); }
  void Shutdown(const grpc::Status& status, bool) override { Finish(status); }

  void OnReadDone(bool ok) override {
    if (admitted_) {
      core_->OnReadDone(ok, &read_buffer_);
      return;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream ended before its hello"));
      return;
    }
    grpc::Status refusal = Admit();
    read_buffer_.Clear();
    if (!refusal.ok()) {
      Finish(refusal);
      return;
    }
    admitted_ = true;
    core_->Attach(this);
    core_->StartSameHost();
    ServerBidiReactor::StartRead(&read_buffer_);
  }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(ok); }
  void OnCancel() override {}
  void OnDone() override {
    core_->OnDone(admitted_ ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           "the upstream stage closed the stream")
                            : grpc::Status::OK);
    delete this;
  }

 private:
  grpc::Status Admit() {
    std::vector<grpc::Slice> slices;
    if (!read_buffer_.Dump(&slices).ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unreadable hello");
    }
    std::vector<std::span<const std::byte>> pieces;
    for (const grpc::Slice& s : slices) {
      pieces.emplace_back(reinterpret_cast<const std::byte*>(s.begin()), s.size());
    }
    auto msg = ParseExchange(pieces);
    if (!msg.ok()) return common::ToGrpcStatus(msg.status());
    if (msg->kind != ParsedExchange::Kind::kHello) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "the first message on an Exchange stream must be a hello");
    }
    auto options = acceptor_->Admit(msg->hello.job_id(), msg->hello.from_stage(),
                                    msg->hello.peer_secret(), core_);
    if (!options.ok()) return common::ToGrpcStatus(options.status());
    return grpc::Status::OK;
  }

  LinkAcceptor* acceptor_;
  std::shared_ptr<LinkCore> core_;
  grpc::ByteBuffer read_buffer_;
  bool admitted_ = false;
};

}  // namespace

// ---- PeerLink ---------------------------------------------------------------------

PeerLink::PeerLink(std::shared_ptr<LinkCore> core) : core_(std::move(core)) {}
PeerLink::~PeerLink() { Close(); }
void PeerLink::BeginStep(uint64_t step) { core_->BeginStep(step); }
absl::Status PeerLink::Send(const common::FrameTag& tag,
                            std::shared_ptr<const common::Tensor> tensor, absl::Time deadline) {
  return core_->Send(tag, std::move(tensor), deadline);
}
absl::StatusOr<common::PiecewiseTensor> PeerLink::Receive(const common::FrameTag& tag,
                                                          absl::Time deadline) {
  return core_->Receive(tag, deadline);
}
absl::Status PeerLink::Flush(absl::Time deadline) { return core_->Flush(deadline); }
void PeerLink::Close() { core_->Close(); }
absl::Status PeerLink::status() const { return core_->status(); }
std::string PeerLink::sending_path() const { return core_->sending_path(); }
std::string PeerLink::receiving_path() const { return core_->receiving_path(); }
int PeerLink::peer_stage() const { return core_->options().peer_stage; }
uint64_t PeerLink::bytes_sent() const { return core_->bytes_sent(); }
uint64_t PeerLink::bytes_sent_same_host() const { return core_->bytes_sent_same_host(); }
uint64_t PeerLink::bytes_received() const { return core_->bytes_received(); }

// ---- Client side ------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<PeerLink>> ConnectPeerLink(
    std::shared_ptr<grpc::Channel> channel, const PeerLinkOptions& options,
    const std::string& peer_secret, absl::Time deadline) {
  if (!channel->WaitForConnected(absl::ToChronoTime(deadline))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach stage ", options.peer_stage, " at ", options.peer_address,
        " for job '", options.job_id, "' before the deadline"));
  }
  PeerLinkOptions o = options;
  o.receive_kind = common::TensorKind::kGradient;
  auto core = std::make_shared<LinkCore>(o);
  auto link = std::make_shared<ClientLink>();
  link->stub = std::make_unique<grpc::GenericStub>(channel);
  link->endpoint = std::make_unique<ClientEndpoint>(core);
  core->KeepAlive(link);
  pipetrain::v1::PeerHello hello;
  hello.set_job_id(options.job_id);
  hello.set_from_stage(options.local_stage);
  hello.set_peer_secret(peer_secret);
  link->endpoint->Start(*link->stub);
  core->SendRaw(ToByteBuffer(EncodeHello(hello)));
  core->StartSameHost();
  return std::make_unique<PeerLink>(core);
}

// ---- Server side ------------------------------------------------------------------

struct LinkAcceptor::State {
  struct Expected {
    PeerLinkOptions options;
    std::string secret;
    std::shared_ptr<LinkCore> core;  // set once the peer's stream is admitted
  };
  absl::Mutex mu;
  std::map<std::pair<std::string, int>, Expected> expected ABSL_GUARDED_BY(mu);
};

LinkAcceptor::LinkAcceptor() : state_(std::make_unique<State>()) {}

LinkAcceptor::~LinkAcceptor() {
  std::vector<std::shared_ptr<LinkCore>> unclaimed;
  {
    absl::MutexLock lock(&state_->mu);
    for (auto& [key, e] : state_->expected) {
      if (e.core) unclaimed.push_back(e.core);
    }
    state_->expected.clear();
  }
  for (auto& core : unclaimed) core->Close();
}

void LinkAcceptor::Expect(const PeerLinkOptions& options, const std::string& secret) {
  absl::MutexLock lock(&state_->mu);
  PeerLinkOptions o = options;
  o.receive_kind = common::TensorKind::kActivation;
  state_->expected[{options.job_id, options.peer_stage}] = {o, secret, nullptr};
}

absl::StatusOr<PeerLinkOptions> LinkAcceptor::Admit(const std::string& job_id, int from_stage,
                                                    const std::string& secret,
                                                    std::shared_ptr<LinkCore> core) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->expected.find({job_id, from_stage});
  if (it == state_->expected.end()) {
    return absl::NotFoundError(absl::StrCat("this stage expects no stream from stage ",
                                            from_stage, " of job '", job_id, "'"));
  }
  if (it->second.secret != secret) {
    return absl::PermissionDeniedError(absl::StrCat("wrong peer_secret from stage ",
                                                    from_stage, " of job '", job_id, "'"));
  }
  if (it->second.core) {
    return absl::AlreadyExistsError(absl::StrCat("stage ", from_stage, " of job '", job_id,
                                                 "' is already connected"));
  }
  core->SetOptions(it->second.options);
  it->second.core = std::move(core);
  return it->second.options;
}

absl::StatusOr<std::unique_ptr<PeerLink>> LinkAcceptor::WaitForPeer(const std::string& job_id,
                                                                    int peer_stage,
                                                                    absl::Time deadline) {
  absl::MutexLock lock(&state_->mu);
  const auto key = std::make_pair(job_id, peer_stage);
  auto connected = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    auto it = state_->expected.find(key);
    return it == state_->expected.end() || it->second.core != nullptr;
  };
  state_->mu.AwaitWithDeadline(absl::Condition(&connected), deadline);
  auto it = state_->expected.find(key);
  if (it == state_->expected.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", peer_stage, " of job '", job_id, "' is not expected (Expect it first)"));
  }
  if (it->second.core == nullptr) {
    return absl::UnavailableError(absl::StrCat("stage ", peer_stage, " of job '", job_id,
                                               "' did not connect before the deadline"));
  }
  auto link = std::make_unique<PeerLink>(std::move(it->second.core));
  state_->expected.erase(it);
  return link;
}

void LinkAcceptor::Forget(const std::string& job_id) {
  std::vector<std::shared_ptr<LinkCore>> unclaimed;
  {
    absl::MutexLock lock(&state_->mu);
    for (auto it = state_->expected.begin(); it != state_->expected.end();) {
      if (it->first.first == job_id) {
        if (it->second.core) unclaimed.push_back(it->second.core);
        it = state_->expected.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& core : unclaimed) core->Close();
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* LinkAcceptor::Accept(
    grpc::CallbackServerContext* context) {
  return new ServerEndpoint(this);
}

}  // namespace pipetrain::stage_server
