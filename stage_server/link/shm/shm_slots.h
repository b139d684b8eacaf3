// The sender's account of a same-host link's slots (shm_region.h holds the memory): a
// tensor is written into free slots of the shared region, a header frame on the gRPC
// stream names them, and the receiver, once it has taken the bytes, returns each slot
// with a credit on the stream. The pool hands out free slots (waiting, up to a
// deadline, while all are in flight), takes the credits back (refusing one for a slot
// that is not out: a confused or hostile peer), and frees everything at once when the
// link goes (a peer that died holding slots leaks none). Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pipetrain::stage_server {

class ShmSlots {
 public:
  // `slots` slots (at least 1) of `slot_bytes` each; `link` names the link in errors
  // ("job-000001 stage 0 -> 1").
  ShmSlots(int slots, uint64_t slot_bytes, std::string link);

  // How many slots `bytes` takes (at least 1), and how many bytes one slot holds.
  int SlotsFor(uint64_t bytes) const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  int size() const { return static_cast<int>(out_.size()); }

  // `count` free slots (1 to size()), lowest-numbered first, marked out; waits while
  // fewer are free. DEADLINE_EXCEEDED at `deadline`, ABORTED once Close()d, both naming
  // the link; INVALID_ARGUMENT for a count out of range.
  absl::StatusOr<std::vector<int>> Acquire(int count, absl::Time deadline);
  // The receiver's credit for `slot`: FAILED_PRECONDITION (naming link and slot) for a
  // slot out of range or not out.
  absl::Status Release(int slot);
  // The link went (the peer died, the job was reconfigured): every slot free again,
  // and waiters fail with ABORTED naming `why`.
  void Close(const std::string& why);

  int free_slots() const;

 private:
  const uint64_t slot_bytes_;
  const std::string link_;
  mutable absl::Mutex mu_;
  std::vector<bool> out_ ABSL_GUARDED_BY(mu_);
  int free_ ABSL_GUARDED_BY(mu_);
  std::string closed_ ABSL_GUARDED_BY(mu_);  // why, once closed
};

}  // namespace pipetrain::stage_server
