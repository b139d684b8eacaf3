// The coordinator's durable record of jobs: every job's status, its step history and its
// log lines, in one SQLite database under the state dir, so `pipetrain list` and
// `status` survive a coordinator restart. Thread-safe; every call is one transaction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

struct sqlite3;

namespace pipetrain::coordinator {

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`; its folder must exist.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // A new job id, unique in this database: "job-000001", "job-000002", ... (numbers
  // keep growing across restarts).
  absl::StatusOr<std::string> NextJobId();

  // Adds a job (status without history). ALREADY_EXISTS if the id is taken.
  absl::Status Insert(const pipetrain::v1::JobStatus& job);
  // Replaces a job's status (its history field is ignored; steps are appended with
  // AppendStep). NOT_FOUND naming the id if unknown.
  absl::Status Update(const pipetrain::v1::JobStatus& job);
  // Records one finished step; replaces a record with the same step number.
  absl::Status AppendStep(const std::string& job_id, const pipetrain::v1::StepRecord& step);
  absl::Status AppendLog(const std::string& job_id, const pipetrain::v1::LogLine& line);

  // NOT_FOUND "unknown job 'ID'" if absent. With include_history, history holds every
  // step in order.
  absl::StatusOr<pipetrain::v1::JobStatus> Get(const std::string& job_id,
                                               bool include_history) const;
  // Most recently created first, without history; limit 0 = all.
  absl::StatusOr<std::vector<pipetrain::v1::JobStatus>> List(int limit) const;
  // Steps with step >= from_step, in order.
  absl::StatusOr<std::vector<pipetrain::v1::StepRecord>> Steps(const std::string& job_id,
                                                               int64_t from_step) const;
  absl::StatusOr<std::vector<pipetrain::v1::LogLine>> Logs(const std::string& job_id) const;

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  mutable absl::Mutex mu_;
  sqlite3* db_;
};

}  // namespace pipetrain::coordinator
