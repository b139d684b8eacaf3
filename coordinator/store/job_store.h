// The coordinator's durable record of jobs: every job's status, its step history and its
// log lines, and the timelines of its latest steps, in one SQLite database under the
// state dir, so `pipetrain list`, `status` and `timeline` survive a coordinator restart
// and the coordinator need not keep any of it in memory. Thread-safe; every call is one
// transaction.
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
  // How many steps' timelines RecordStep keeps per job, of each kind (at least 1 each):
  // readers ask for up to `measured` steps of measured timelines (`pipetrain timeline
  // --steps`) and for the latest prediction only, so one of those is all that is kept.
  struct TimelinesKept {
    int measured = 20;
    int predicted = 1;
  };
  // A finished step in one transaction: its record (as AppendStep), the job's status (as
  // Update), and the step's measured and predicted timelines (an empty one is not
  // stored), of which the latest `keep` steps' of each kind are kept.
  absl::Status RecordStep(const pipetrain::v1::JobStatus& job,
                          const pipetrain::v1::StepRecord& step,
                          const pipetrain::v1::Timeline& measured,
                          const pipetrain::v1::Timeline& predicted, TimelinesKept keep);

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
  // The stored timelines of the latest `last_steps` (at least 1) steps, oldest first, as
  // one Timeline; no events when none is stored. NOT_FOUND for an unknown job.
  absl::StatusOr<pipetrain::v1::Timeline> Timelines(const std::string& job_id, bool predicted,
                                                    int last_steps) const;

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  mutable absl::Mutex mu_;
  sqlite3* db_;
};

}  // namespace pipetrain::coordinator
