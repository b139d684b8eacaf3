// Copies a stage's snapshots to its snapshot peer (the ring successor) on a background
// thread, so that a step never waits for the copy: one push in flight at a time, and a
// newer step's push replaces one that has not started. Failures are logged (job, stage,
// step, peer) and never reach the step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "stage_server/snapshots/snapshot_store.h"

namespace pipetrain::stage_server {

struct SnapshotPusherOptions {
  std::string job_id;
  int stage = 0;
  int peer_stage = 0;
  std::string peer_address;
  std::string peer_secret;
  absl::Duration deadline = absl::Seconds(60);  // for one blob's copy
  size_t piece_bytes = size_t{4} << 20;
  // Called after the first piece of a step's copy is written (fault injection: --fail-at
  // ...:snapshot dies mid-copy; with it set, every blob goes in two pieces at least).
  // May not return.
  std::function<void(int64_t step)> after_first_piece;
};

// Every chunk's blob of one step.
struct SnapshotPush {
  int64_t step = 0;
  std::vector<std::pair<SnapshotMeta, std::shared_ptr<const std::string>>> blobs;
};

class SnapshotPusher {
 public:
  SnapshotPusher(SnapshotPusherOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials);
  // Cancels the copy in flight and waits for the thread.
  ~SnapshotPusher();

  void Enqueue(SnapshotPush push);
  // Pushes done (ok or not) and the newest step copied completely, for tests and logs.
  int64_t pushes_done() const;
  std::optional<int64_t> newest_pushed_step() const;

 private:
  void Loop();
  absl::Status Push(const SnapshotMeta& meta, const std::string& blob);

  const SnapshotPusherOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  mutable absl::Mutex mu_;
  std::optional<SnapshotPush> next_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t pushes_done_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<int64_t> newest_pushed_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pipetrain::stage_server
