// One end of the data-plane stream between two neighbouring stages. The upstream stage
// opens the Exchange stream to its downstream neighbour; activations flow down and
// gradients flow up on it. Sends are asynchronous and zero-copy (frames are slices of
// the tensor's own memory, kept alive until gRPC has written them), bounded by a byte
// budget for back-pressure; received frames are checked and their payloads kept in
// the network's own buffers (zero-copy on receipt too) until the executor asks for the
// tensor by tag and copies it into its compute memory. Every wait has a deadline
// and a lost peer becomes an UNAVAILABLE naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "common/tensor_codec.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/server_callback.h"
#include "stage_server/link/tensor_channel.h"

namespace pipetrain::stage_server {

struct PeerLinkOptions {
  std::string job_id;
  int local_stage = 0;
  int peer_stage = 0;
  std::string peer_address;  // for messages only
  size_t frame_bytes = common::kDefaultFrameBytes;
  // Sends block while more than this many payload bytes wait to be written.
  size_t max_queued_bytes = size_t{256} << 20;
  common::ReassemblerOptions limits;
  // Set by ConnectPeerLink (gradients come back upstream) and LinkAcceptor
  // (activations come down); a frame of the other kind fails the link, except
  // kTiedGradient, which either direction may carry.
  common::TensorKind receive_kind = common::TensorKind::kActivation;
  // When set, per chunk of this stage (a frame's tag names the receiving chunk), the
  // kind this link carries to it, in place of receive_kind (kUnspecified: nothing): with
  // the V placement one link carries activations to one chunk and gradients to another.
  std::vector<common::TensorKind> receive_kinds;
  // pipetrain-stage --same-host-transport auto: offer the peer a shared-memory region
  // for this end's tensors and accept its offer (stage_server/link/link_shm.h); either end
  // off, another host or any failure keeps that direction on the stream.
  bool same_host = false;
};

class LinkCore;

class PeerLink final : public TensorChannel {
 public:
  explicit PeerLink(std::shared_ptr<LinkCore> core);
  ~PeerLink();  // closes the stream
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // From now on a frame of an earlier step is stale and fails the link (a neighbour
  // may already send the next step's); unclaimed tensors of earlier steps are dropped.
  void BeginStep(uint64_t step) override;
  // Queues the tensor for sending and returns; blocks only while the queue is over its
  // byte budget. The tensor is shared, not copied: do not modify it afterwards.
  absl::Status Send(const common::FrameTag& tag,
                    std::shared_ptr<const common::Tensor> tensor, absl::Time deadline) override;
  // Waits for the tensor with exactly this tag. Its pieces are the received network
  // buffers themselves (no copy was made).
  absl::StatusOr<common::PiecewiseTensor> Receive(const common::FrameTag& tag,
                                                  absl::Time deadline) override;
  // Waits until every queued frame has been handed to the transport.
  absl::Status Flush(absl::Time deadline) override;
  // Ends the stream; pending sends are dropped. Idempotent.
  void Close();

  absl::Status status() const;  // OK while the stream is healthy
  // Each direction's path: "shared memory (N slots of S)" or "tcp (why)"; this end's
  // offer may still await its answer ("tcp (shared memory offered, not answered yet)").
  std::string sending_path() const;
  std::string receiving_path() const;
  int peer_stage() const;  // the neighbour's position in the job
  uint64_t bytes_sent() const override;
  // Of those, the bytes that went through shared memory (the same-host path).
  uint64_t bytes_sent_same_host() const;
  uint64_t bytes_received() const override;

 private:
  std::shared_ptr<LinkCore> core_;
};

// Opens the stream to the downstream neighbour at `channel` and introduces itself
// (job, stage, secret). Fails if the stream cannot start before `deadline`.
absl::StatusOr<std::unique_ptr<PeerLink>> ConnectPeerLink(
    std::shared_ptr<grpc::Channel> channel, const PeerLinkOptions& options,
    const std::string& peer_secret, absl::Time deadline);

// The downstream side: admits streams whose hello matches an expected peer.
class LinkAcceptor {
 public:
  LinkAcceptor();
  ~LinkAcceptor();

  // A stream from options.peer_stage for options.job_id, carrying `secret`, may come.
  void Expect(const PeerLinkOptions& options, const std::string& secret);
  // Waits for the expected peer's stream.
  absl::StatusOr<std::unique_ptr<PeerLink>> WaitForPeer(const std::string& job_id,
                                                        int peer_stage, absl::Time deadline);
  // Drops expectations and unclaimed streams of a job.
  void Forget(const std::string& job_id);

  // gRPC glue for Stage.Exchange (raw callback method).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Accept(
      grpc::CallbackServerContext* context);

  // Called by a server stream when its hello arrives: the link core to use, or an
  // error for the peer (PERMISSION_DENIED, NOT_FOUND).
  absl::StatusOr<PeerLinkOptions> Admit(const std::string& job_id, int from_stage,
                                        const std::string& secret,
                                        std::shared_ptr<LinkCore> core);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pipetrain::stage_server
