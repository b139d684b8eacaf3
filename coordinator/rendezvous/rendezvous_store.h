// The coordinator's per-job key-value store for collective rendezvous (gloo's store,
// NCCL's unique id): replicas of one stage position publish their addresses and wait
// for each other's. Pure and thread-safe; bounded per job; a job's keys go with it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pipetrain::coordinator {

struct RendezvousLimits {
  // gloo's full mesh sets one key per replica; these leave room for many stage
  // positions and restarts while bounding what one job (or a bad client) can hold.
  int max_keys_per_job = 4096;
  int64_t max_bytes_per_job = 16 << 20;  // keys and values together
  int max_jobs = 1024;
  int max_key_bytes = 1024;
  // A Get waits at most this long whatever it asks for, so no call holds a server
  // thread for ever.
  absl::Duration max_wait = absl::Minutes(5);
};

class RendezvousStore {
 public:
  explicit RendezvousStore(RendezvousLimits limits = RendezvousLimits()) : limits_(limits) {}

  // Setting a key again with the same value is OK (a retried call); with another
  // value ALREADY_EXISTS. INVALID_ARGUMENT for an empty job_id or key, or a key over
  // max_key_bytes; RESOURCE_EXHAUSTED past a limit. Every error names job and key.
  absl::Status Set(const std::string& job_id, const std::string& key, std::string value);

  // The key's value, waiting up to `wait` (capped at max_wait) for it to be set.
  // NOT_FOUND when `wait` <= 0 and the key is absent, DEADLINE_EXCEEDED after waiting,
  // ABORTED when Forget(job_id) drops the job meanwhile; INVALID_ARGUMENT as Set.
  absl::StatusOr<std::string> Get(const std::string& job_id, const std::string& key,
                                  absl::Duration wait);

  // Drops every key of the job (the job ended) and wakes its waiters.
  void Forget(const std::string& job_id);

  // How many jobs hold keys, and how many keys and bytes one holds (for tests and
  // the coordinator's metrics).
  int jobs() const;
  int keys(const std::string& job_id) const;
  int64_t bytes(const std::string& job_id) const;

 private:
  struct Job {
    std::map<std::string, std::string> values;
    int64_t bytes = 0;
  };

  const RendezvousLimits limits_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // a key was set or a job forgotten
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // The jobs somebody waits on: a waiter that sees its job's `forgets` change gives
  // up. An entry lives only while it has waiters, so this stays as small as the waits.
  struct Waiting {
    int waiters = 0;
    int64_t forgets = 0;
  };
  std::map<std::string, Waiting> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::coordinator
