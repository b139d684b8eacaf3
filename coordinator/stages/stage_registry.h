// Which stage servers the coordinator knows: they register and heartbeat; one that
// misses heartbeats for longer than the timeout is LOST until it heartbeats or
// registers again. Jobs take idle stages and give them back. Pure and thread-safe; the
// clock is injected so tests control time.
//
// Identity across a coordinator restart: ids ("stage-1", ...) start again from 1 in a
// new registry, so a stage that registered with the previous coordinator may heartbeat
// with an id that now names another stage. Ids are therefore not trusted alone: every
// registration gets a fresh random secret, and a heartbeat counts only when its id and
// secret both match a registration of this registry. A stage whose heartbeat is
// refused registers again and gets an id (and secret) of its own, so a reused id never
// makes a dead stage look alive. The secret is not authentication (that is the
// bearer token's job); it only tells registrations apart.
//
// No takeover of a live stage: a registration from an address a live stage holds
// replaces that record only when it carries the record's secret (the same stage
// registering again) or once the record has missed its heartbeats for the timeout (a
// restarted process, which has no secret); else ALREADY_EXISTS says how long to wait.
// An address is the endpoint it names (AddressKey), not its spelling: "LOCALHOST:07400"
// is 127.0.0.1:7400's address, and is refused there like the same text.
// With mutual TLS the peer's certificate identity is kept too, and a live record
// refuses another identity even with the secret. A lost record may be taken by any
// authenticated client: a stage redeployed with a new certificate must get back in.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

// The endpoint "HOST:PORT" names, as a key two spellings of it share: the port as a
// number, the host lowercased without a trailing dot, an IP literal in canonical form
// (any form inet_aton takes; IPv4-mapped IPv6 as IPv4) and localhost, 127.0.0.1 and ::1
// as one. Text that does not parse (the service refuses it first) is its own key.
std::string AddressKey(const std::string& address);

struct StageRecord {
  std::string stage_id;  // "stage-1", "stage-2", ... in registration order
  std::string address;
  pipetrain::v1::DeviceInfo device;
  absl::Time registered;
  absl::Time last_heartbeat;
  std::string job_id;  // the job holding it, "" when free
  bool lost = false;
  std::string secret;  // of its latest registration; heartbeats must carry it
  std::string identity;  // the TLS peer identity it registered with, "" without TLS
  std::vector<pipetrain::v1::LinkPath> links = {};  // as its latest heartbeat said
};

// What a stage is told when it registers: its id and the secret its heartbeats carry.
struct StageRegistration {
  std::string stage_id;
  std::string secret;  // 128 random bits as 32 hex digits, new with each registration
};

class StageRegistry {
 public:
  explicit StageRegistry(absl::Duration heartbeat_timeout,
                         std::function<absl::Time()> now = [] { return absl::Now(); });

  // A stage registering again from an address already known keeps its id (and any
  // job holding it); otherwise it gets a new id. Either way it gets a new secret, and
  // the earlier one is no longer accepted. INVALID_ARGUMENT if address is empty.
  // At the address of a live record: `secret` must be that record's, and `identity`
  // (the TLS peer identity, "" without TLS) the one it registered with; else
  // ALREADY_EXISTS (PERMISSION_DENIED for another identity) naming the stage and
  // address, and the record is not touched.
  absl::StatusOr<StageRegistration> Register(const std::string& address,
                                             const pipetrain::v1::DeviceInfo& device,
                                             const std::string& secret = "",
                                             const std::string& identity = "");
  // False unless `stage_id` is known and `secret` is its latest registration's (the
  // stage should register again); the record is not touched then. A lost stage that
  // heartbeats is no longer lost. `links`: its job's peer links as it reports them.
  bool Heartbeat(const std::string& stage_id, const std::string& secret,
                 std::vector<pipetrain::v1::LinkPath> links = {});

  // Marks stages whose last heartbeat is older than the timeout as lost; returns the
  // ids newly marked. Called by Snapshot/Acquire and by the coordinator's timer.
  std::vector<std::string> Sweep();

  // Takes `count` stages that are free and not lost for `job_id`, oldest registration
  // first, each with at least `min_memory_bytes` (0 = any). nullopt if there are not
  // enough; nothing is taken then.
  std::optional<std::vector<StageRecord>> Acquire(const std::string& job_id, int count,
                                                  uint64_t min_memory_bytes = 0);
  // Frees every stage held by `job_id`.
  void Release(const std::string& job_id);
  // Marks one stage lost now (the step driver found it unreachable).
  void MarkLost(const std::string& stage_id);
  // Frees one stage of `job_id` (a lost stage its job no longer waits for), so that it
  // is free when it comes back.
  void ReleaseStage(const std::string& job_id, const std::string& stage_id);
  // Takes for `job_id` the free, live stages at `addresses` (a job continuing on the
  // stages it ran on): one entry per address, nullopt where no such stage is free.
  std::vector<std::optional<StageRecord>> AcquireAt(const std::string& job_id,
                                                    const std::vector<std::string>& addresses);

  // Whether a job holds the stage: taken by Acquire or AcquireAt and not yet freed by
  // Release or ReleaseStage (lost or not). False for an unknown id.
  bool Held(const std::string& stage_id);

  // Stages that are free and not lost, and how many there are in all (not lost).
  int FreeCount(uint64_t min_memory_bytes = 0);
  int LiveCount();
  std::optional<StageRecord> Find(const std::string& stage_id);
  // Every stage in registration order as the API shows it (state IDLE, BUSY or LOST).
  std::vector<pipetrain::v1::StageInfo> Snapshot();

 private:
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration timeout_;
  const std::function<absl::Time()> now_;
  absl::Mutex mu_;
  std::vector<StageRecord> stages_ ABSL_GUARDED_BY(mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::BitGen secrets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::coordinator
