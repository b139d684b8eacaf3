// The state of one peer-link stream end, shared by the gRPC reactors that drive it and
// the PeerLink handle the executor holds: the send queue (zero-copy frames, byte
// budget), the receive side (parse, check, keep the payload in the network's slices
// without copying, mailbox by tag) and the stream's health. Reactor I/O is started
// outside the lock, counted, so that closing waits for no reactor call in flight. A
// send hands the stream's first write to the core's own thread: gRPC may write to the
// socket inside StartWrite, and the executor should be computing meanwhile.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/buffer_pool.h"
#include "common/piecewise_tensor.h"
#include "common/tensor.h"
#include "common/tensor_codec.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "stage_server/link/link_shm.h"
#include "stage_server/link/shm/shm_holds.h"
#include "stage_server/link/peer_link.h"

namespace pipetrain::stage_server {

class LinkCore {
 public:
  // What a reactor does for the core.
  class Io {
   public:
    virtual ~Io() = default;
    virtual void StartWrite(const grpc::ByteBuffer* buffer) = 0;
    virtual void StartRead(grpc::ByteBuffer* buffer) = 0;
    // Ends the call; OnDone follows. Server: Finish(status). Client: release its hold
    // on the call, cancelling it first when `cancel` (otherwise the server's own
    // status, which says why, reaches OnDone).
    virtual void Shutdown(const grpc::Status& status, bool cancel) = 0;
  };

  explicit LinkCore(PeerLinkOptions options);
  ~LinkCore();

  void SetOptions(PeerLinkOptions options);  // before Attach (server: from the hello)
  const PeerLinkOptions& options() const { return options_; }
  // The stream is up; `io` stays valid until OnDone.
  void Attach(Io* io);

  // Reactor events.
  void OnReadDone(bool ok, grpc::ByteBuffer* buffer);  // issues the next read itself
  void OnWriteDone(bool ok);
  void OnDone(const grpc::Status& status);

  // Queues raw bytes (the client's hello) ahead of any frame.
  void SendRaw(grpc::ByteBuffer buffer);
  // Offers the peer a shared-memory region for this end's tensors (options().same_host;
  // after the client's hello, or once the server admitted the stream); until the peer
  // accepts, and for good if it refuses, tensors go on the stream.
  void StartSameHost();
  // Each direction's path, as the log says it: "shared memory (...)" or "tcp (why)".
  std::string sending_path() { return shm_.sending_path(); }
  std::string receiving_path() { return shm_.receiving_path(); }

  // PeerLink's API.
  void BeginStep(uint64_t step);
  absl::Status Send(const common::FrameTag& tag, std::shared_ptr<const common::Tensor> tensor,
                    absl::Time deadline);
  absl::StatusOr<common::PiecewiseTensor> Receive(const common::FrameTag& tag,
                                                  absl::Time deadline);
  absl::Status Flush(absl::Time deadline);
  void Close();
  absl::Status status() const;
  uint64_t bytes_sent() const;
  uint64_t bytes_sent_same_host() const;
  uint64_t bytes_received() const;

  // Keeps `owner` (the client's reactor and stub) alive until the call is done.
  void KeepAlive(std::shared_ptr<void> owner);

  // Waits until the stream is attached or broken (client start-up).
  absl::Status WaitAttached(absl::Time deadline);

 private:
  struct Outgoing {
    grpc::ByteBuffer buffer;
    size_t payload_bytes = 0;
  };
  using Key = std::tuple<uint64_t, uint32_t, uint32_t, int>;  // step, micro-batch, chunk, kind
  static Key KeyOf(const common::FrameTag& tag);

  // Marks the stream broken with `status` (the first cause wins) and wakes waiters.
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleMessage(grpc::ByteBuffer* buffer);
  // A same-host message: the peer's part in the region, or the handshake's and
  // credits (LinkShm).
  absl::Status HandleControl(const pipetrain::v1::ExchangeMessage& message);
  // A received frame's tag: this job, a kind this link carries to that chunk, not stale.
  absl::Status CheckTag(const common::FrameTag& tag);
  // A finished tensor into the mailbox; `bytes` more were received.
  absl::Status Deliver(std::optional<std::pair<common::FrameTag, common::PiecewiseTensor>> done,
                       uint64_t bytes);
  // Queues `frames` (`bytes` of tensor payload) once the queue has room, or fails.
  absl::Status Enqueue(std::vector<Outgoing> frames, size_t bytes, const common::FrameTag& tag,
                       absl::Time deadline);
  // A tensor through the region's slots; the stream carries only the parts' headers.
  absl::Status SendShm(ShmSender& shm, const common::FrameTag& tag, const common::Tensor& tensor,
                       absl::Time deadline);
  void SendMessage(const std::string& bytes);
  // The credit for slots the stage let go of (ShmHolds), from whichever thread dropped
  // them: queued for the write starter, or nothing once the link is over.
  void SendCredit(std::span<const int> slots);
  // A part that came whole: kept in the peer's slots (credited when the stage drops it)
  // while the receiver keeps fewer than half of them, else copied out and credited now.
  // `bytes`: the part's, as its frame says (ShmReceiver::Pieces checked the pieces).
  absl::StatusOr<std::optional<common::ReceivedPieces>> AcceptShmPart(LinkShm::Part part,
                                                                      uint64_t bytes);
  // Hands the queue's first write to the starter thread unless a write is under way.
  void WakeStarterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A tensor copied out of shared memory, whose buffer goes back to shm_pool_ when the
  // last piece of it is dropped.
  absl::StatusOr<common::PiecewiseTensor> Pooled(common::Tensor tensor);
  // Points the same-host transport at options_ (the link's name, limits, the flag).
  void ConfigureShm();
  // Runs f(io) outside the lock unless the link is closing; false if it did not run.
  template <typename F>
  bool CallIo(F f);
  // Ends the call once (Close, or a rejected message).
  void RequestShutdown(const grpc::Status& status, bool cancel);
  std::string PeerName() const;
  // The write starter: starts the queue's first write when a send asks for it.
  void StartWrites();

  PeerLinkOptions options_;
  std::shared_ptr<void> keep_alive_;  // released once the call is done
  // Warm buffers for tensors copied out of shared memory, back here when dropped.
  std::shared_ptr<common::BufferPool> shm_pool_;
  common::TensorReassembler reassembler_;  // used only by the read reaction
  LinkShm shm_;                            // thread-safe on its own
  std::shared_ptr<ShmHolds> holds_;        // tensors the stage views in the peer's slots

  mutable absl::Mutex mu_;
  Io* io_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int io_calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool start_pending_ ABSL_GUARDED_BY(mu_) = false;  // for the write starter
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;       // the core is going away
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_sent_same_host_ ABSL_GUARDED_BY(mu_) = 0;  // of bytes_sent_
  uint64_t bytes_received_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t min_step_ ABSL_GUARDED_BY(mu_) = 0;  // frames of earlier steps are stale
  std::map<Key, common::PiecewiseTensor> mailbox_ ABSL_GUARDED_BY(mu_);
  std::thread starter_;  // last: it runs StartWrites until the destructor stops it
};

}  // namespace pipetrain::stage_server
