#include "coordinator/rendezvous/rendezvous_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

namespace {

absl::Status CheckNames(const std::string& job_id, const std::string& key, int max_key_bytes) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous: job_id is empty (key '", key, "')"));
  }
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous: key is empty (job ", job_id, ")"));
  }
  if (static_cast<int64_t>(key.size()) > max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous: job ", job_id, ": key '",
                                                   key.substr(0, 64), "...' is ", key.size(),
                                                   " bytes, more than ", max_key_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RendezvousStore::Set(const std::string& job_id, const std::string& key,
                                  std::string value) {
  if (absl::Status s = CheckNames(job_id, key, limits_.max_key_bytes); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto job_it = jobs_.find(job_id);
  if (job_it == jobs_.end() && static_cast<int>(jobs_.size()) >= limits_.max_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: job ", job_id, ": cannot set key '", key, "': ",
                     limits_.max_jobs, " jobs already hold rendezvous keys"));
  }
  Job& job = job_it != jobs_.end() ? job_it->second : jobs_[job_id];
  auto it = job.values.find(key);
  if (it != job.values.end()) {
    if (it->second == value) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat("rendezvous: job ", job_id, ": key '", key,
                                                 "' is already set to another value"));
  }
  const int64_t size = static_cast<int64_t>(key.size() + value.size());
  absl::Status full;
  if (static_cast<int>(job.values.size()) >= limits_.max_keys_per_job) {
    full = absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: job ", job_id, ": cannot set key '", key, "': the job holds ",
                     job.values.size(), " keys already, the limit"));
  } else if (job.bytes + size > limits_.max_bytes_per_job) {
    full = absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: job ", job_id, ": cannot set key '", key, "' (", size, " bytes): the job ",
        "holds ", job.bytes, " bytes and may hold ", limits_.max_bytes_per_job));
  }
  if (!full.ok()) {
    if (job.values.empty()) jobs_.erase(job_id);  // no empty entry left behind
    return full;
  }
  job.values.emplace(key, std::move(value));
  job.bytes += size;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& job_id,
                                                 const std::string& key, absl::Duration wait) {
  if (absl::Status s = CheckNames(job_id, key, limits_.max_key_bytes); !s.ok()) return s;
  const absl::Duration waited = std::min(wait, limits_.max_wait);
  const absl::Time deadline = absl::Now() + waited;
  absl::MutexLock lock(&mu_);
  auto find = [&]() -> const std::string* {
    auto job = jobs_.find(job_id);
    if (job == jobs_.end()) return nullptr;
    auto it = job->second.values.find(key);
    return it == job->second.values.end() ? nullptr : &it->second;
  };
  if (const std::string* v = find()) return *v;
  if (waited <= absl::ZeroDuration()) {
    return absl::NotFoundError(
        absl::StrCat("rendezvous: job ", job_id, ": key '", key, "' is not set"));
  }
  Waiting& waiting = waiting_[job_id];
  ++waiting.waiters;
  const int64_t forgets = waiting.forgets;
  absl::Status result = absl::OkStatus();
  std::string value;
  while (true) {
    if (const std::string* v = find()) {
      value = *v;
      break;
    }
    if (waiting.forgets != forgets) {
      result = absl::AbortedError(absl::StrCat("rendezvous: job ", job_id,
                                               " ended while waiting for key '", key, "'"));
      break;
    }
    if (absl::Now() >= deadline) {
      result = absl::DeadlineExceededError(
          absl::StrCat("rendezvous: job ", job_id, ": key '", key, "' was not set within ",
                       absl::FormatDuration(waited)));
      break;
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
  // `waiting` stays valid: std::map nodes do not move, and only the last waiter erases.
  if (--waiting.waiters == 0) waiting_.erase(job_id);
  if (!result.ok()) return result;
  return value;
}

void RendezvousStore::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
  if (auto it = waiting_.find(job_id); it != waiting_.end()) ++it->second.forgets;
  changed_.SignalAll();
}

int RendezvousStore::jobs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(jobs_.size());
}

int RendezvousStore::keys(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.values.size());
}

int64_t RendezvousStore::bytes(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.bytes;
}

}  // namespace pipetrain::coordinator
