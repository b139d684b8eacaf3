// The job store on SQLite's C API: one transaction per public call under mu_, and
// protobuf blobs for the records so new fields need no schema change. Tables: jobs,
// steps, logs and meta (the job id counter).
#include "coordinator/store/job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "coordinator/store/sqlite_statement.h"

namespace pipetrain::coordinator {
namespace {

using pipetrain::v1::JobStatus;
using pipetrain::v1::LogLine;
using pipetrain::v1::StepRecord;
using pipetrain::v1::Timeline;

constexpr int kBusyTimeoutMs = 5000;
constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, seq INTEGER NOT NULL,
                                created_us INTEGER NOT NULL, status BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_created ON jobs(created_us, seq);
CREATE TABLE IF NOT EXISTS steps(job_id TEXT NOT NULL, step INTEGER NOT NULL,
                                 record BLOB NOT NULL, PRIMARY KEY(job_id, step));
CREATE TABLE IF NOT EXISTS logs(seq INTEGER PRIMARY KEY, job_id TEXT NOT NULL,
                                line BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS logs_by_job ON logs(job_id, seq);
CREATE TABLE IF NOT EXISTS timelines(job_id TEXT NOT NULL, predicted INTEGER NOT NULL,
                                     step INTEGER NOT NULL, timeline BLOB NOT NULL,
                                     PRIMARY KEY(job_id, predicted, step));
INSERT OR IGNORE INTO meta(key, value) VALUES('next_job_id', 1);
)sql";

absl::Status UnknownJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
}

absl::StatusOr<bool> JobExists(sqlite3* db, const std::string& job_id) {
  ASSIGN_OR_RETURN(SqliteStatement select,
                   SqliteStatement::Prepare(db, "SELECT 1 FROM jobs WHERE id = ?"));
  select.Bind(1, job_id);
  return select.Step(absl::StrCat("looking up job '", job_id, "'"));
}

absl::Status RequireJob(sqlite3* db, const std::string& job_id) {
  ASSIGN_OR_RETURN(bool exists, JobExists(db, job_id));
  return exists ? absl::OkStatus() : UnknownJob(job_id);
}

template <typename Message>
absl::Status ParseBlob(sqlite3* db, const std::string& bytes, Message& message,
                       absl::string_view what) {
  if (message.ParseFromString(bytes)) return absl::OkStatus();
  const char* path = sqlite3_db_filename(db, "main");
  return absl::DataLossError(absl::StrCat("database ", path != nullptr ? path : "?", ": ", what,
                                          ": a stored record does not parse"));
}

// Every remaining row of `select`, its column 0 parsed as a Message.
template <typename Message>
absl::StatusOr<std::vector<Message>> ReadAll(sqlite3* db, SqliteStatement& select,
                                             absl::string_view what) {
  std::vector<Message> messages;
  while (true) {
    ASSIGN_OR_RETURN(bool row, select.Step(what));
    if (!row) return messages;
    RETURN_IF_ERROR(ParseBlob(db, select.Blob(0), messages.emplace_back(), what));
  }
}

std::string StatusBlob(const JobStatus& job) {
  JobStatus copy = job;
  copy.clear_history();  // history lives in steps, one row per step
  return copy.SerializeAsString();
}

// The writes Update, AppendStep and RecordStep share, each inside the caller's
// transaction (under mu_); `what` names the call in errors.

// Replaces a job's status; NOT_FOUND for an unknown job. created_us stays as inserted:
// List's order is the order jobs were created in.
absl::Status WriteStatus(sqlite3* db, const JobStatus& job, const std::string& what) {
  ASSIGN_OR_RETURN(SqliteStatement update,
                   SqliteStatement::Prepare(db, "UPDATE jobs SET status = ? WHERE id = ?"));
  update.BindBlob(1, StatusBlob(job)).Bind(2, job.job_id());
  RETURN_IF_ERROR(update.Run(what));
  if (sqlite3_changes(db) == 0) return UnknownJob(job.job_id());
  return absl::OkStatus();
}

// Records a step, replacing a record with the same step number.
absl::Status WriteStep(sqlite3* db, const std::string& job_id, const StepRecord& step,
                       const std::string& what) {
  ASSIGN_OR_RETURN(SqliteStatement insert,
                   SqliteStatement::Prepare(db,
                                            "INSERT OR REPLACE INTO steps(job_id, "
                                            "step, record) VALUES(?, ?, ?)"));
  insert.Bind(1, job_id).Bind(2, step.step()).BindBlob(3, step.SerializeAsString());
  return insert.Run(what);
}

// Stores one step's timeline of one kind (0 measured, 1 predicted) and keeps only the
// latest `keep` steps' of that kind. A step run again after a restart drops the later
// ones, which the run it continues no longer has.
absl::Status WriteTimeline(sqlite3* db, const std::string& job_id, int64_t kind, int64_t step,
                           const Timeline& timeline, int keep, const std::string& what) {
  ASSIGN_OR_RETURN(SqliteStatement put,
                   SqliteStatement::Prepare(db,
                                            "INSERT OR REPLACE INTO timelines(job_id, "
                                            "predicted, step, timeline) VALUES(?, ?, ?, ?)"));
  put.Bind(1, job_id).Bind(2, kind).Bind(3, step).BindBlob(4, timeline.SerializeAsString());
  RETURN_IF_ERROR(put.Run(what));
  ASSIGN_OR_RETURN(SqliteStatement trim,
                   SqliteStatement::Prepare(db,
                                            "DELETE FROM timelines WHERE job_id = ?1 AND "
                                            "predicted = ?2 AND (step <= ?3 - ?4 OR step > ?3)"));
  trim.Bind(1, job_id).Bind(2, kind).Bind(3, step).Bind(4, int64_t{std::max(keep, 1)});
  return trim.Run(what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) {
    return absl::NotFoundError(
        absl::StrCat("job store ", path, ": folder '", folder.string(), "' does not exist"));
  }
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  // The store owns db from here, so every early return below closes it.
  std::unique_ptr<JobStore> store(new JobStore(db));
  if (rc != SQLITE_OK) {
    // A connection that failed to open has no filename for SqlError to show.
    return absl::UnavailableError(
        absl::StrCat("job store ", path,
                     ": cannot open: ", db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
  }
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  // The first statement reads the header: that is where a file that is not a database
  // shows itself.
  rc = sqlite3_exec(db, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
  if ((rc & 0xff) == SQLITE_NOTADB) {
    return absl::FailedPreconditionError(
        absl::StrCat("job store ", path, ": the file is not a SQLite database"));
  }
  if (rc != SQLITE_OK) return SqliteError(db, rc, "setting WAL journal mode");
  RETURN_IF_ERROR(SqliteExec(db, "PRAGMA synchronous=NORMAL", "setting synchronous mode"));
  RETURN_IF_ERROR(SqliteExec(db, kSchema, "creating the schema"));
  return store;
}

JobStore::~JobStore() { sqlite3_close_v2(db_); }

absl::StatusOr<std::string> JobStore::NextJobId() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/true));
  ASSIGN_OR_RETURN(
      SqliteStatement read,
      SqliteStatement::Prepare(db_, "SELECT value FROM meta WHERE key = 'next_job_id'"));
  ASSIGN_OR_RETURN(bool found, read.Step("reading the job id counter"));
  int64_t next = found ? read.Int(0) : 1;
  // Skip ids taken by jobs inserted under names of their own.
  std::string id;
  while (true) {
    id = absl::StrFormat("job-%06d", next++);
    ASSIGN_OR_RETURN(bool taken, JobExists(db_, id));
    if (!taken) break;
  }
  ASSIGN_OR_RETURN(SqliteStatement write,
                   SqliteStatement::Prepare(db_,
                                            "INSERT OR REPLACE INTO meta(key, value) "
                                            "VALUES('next_job_id', ?)"));
  RETURN_IF_ERROR(write.Bind(1, next).Run("advancing the job id counter"));
  RETURN_IF_ERROR(tx.Commit());
  return id;
}

absl::Status JobStore::Insert(const JobStatus& job) {
  if (job.job_id().empty()) return absl::InvalidArgumentError("insert job: job_id is empty");
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/true));
  ASSIGN_OR_RETURN(bool exists, JobExists(db_, job.job_id()));
  if (exists) {
    return absl::AlreadyExistsError(absl::StrCat("job '", job.job_id(), "' already exists"));
  }
  int64_t created_us = job.created().seconds() * 1000000 + job.created().nanos() / 1000;
  ASSIGN_OR_RETURN(SqliteStatement insert,
                   SqliteStatement::Prepare(db_,
                                            "INSERT INTO jobs(id, seq, created_us, status) "
                                            "VALUES(?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM "
                                            "jobs), ?2, ?3)"));
  insert.Bind(1, job.job_id()).Bind(2, created_us).BindBlob(3, StatusBlob(job));
  RETURN_IF_ERROR(insert.Run(absl::StrCat("inserting job '", job.job_id(), "'")));
  return tx.Commit();
}

absl::Status JobStore::Update(const JobStatus& job) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/true));
  RETURN_IF_ERROR(WriteStatus(db_, job, absl::StrCat("updating job '", job.job_id(), "'")));
  return tx.Commit();
}

absl::Status JobStore::AppendStep(const std::string& job_id, const StepRecord& step) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/true));
  RETURN_IF_ERROR(RequireJob(db_, job_id));
  RETURN_IF_ERROR(
      WriteStep(db_, job_id, step, absl::StrCat("recording step ", step.step(), " of job '",
                                                job_id, "'")));
  return tx.Commit();
}

absl::Status JobStore::AppendLog(const std::string& job_id, const LogLine& line) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/true));
  RETURN_IF_ERROR(RequireJob(db_, job_id));
  ASSIGN_OR_RETURN(SqliteStatement insert,
                   SqliteStatement::Prepare(db_, "INSERT INTO logs(job_id, line) VALUES(?, ?)"));
  insert.Bind(1, job_id).BindBlob(2, line.SerializeAsString());
  RETURN_IF_ERROR(insert.Run(absl::StrCat("appending a log line to job '", job_id, "'")));
  return tx.Commit();
}

absl::StatusOr<JobStatus> JobStore::Get(const std::string& job_id, bool include_history) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/false));
  ASSIGN_OR_RETURN(SqliteStatement select,
                   SqliteStatement::Prepare(db_, "SELECT status FROM jobs WHERE id = ?"));
  select.Bind(1, job_id);
  std::string what = absl::StrCat("reading job '", job_id, "'");
  ASSIGN_OR_RETURN(bool found, select.Step(what));
  if (!found) return UnknownJob(job_id);
  JobStatus job;
  RETURN_IF_ERROR(ParseBlob(db_, select.Blob(0), job, what));
  job.clear_history();
  if (include_history) {
    ASSIGN_OR_RETURN(
        SqliteStatement steps,
        SqliteStatement::Prepare(db_, "SELECT record FROM steps WHERE job_id = ? ORDER BY step"));
    steps.Bind(1, job_id);
    ASSIGN_OR_RETURN(std::vector<StepRecord> history, ReadAll<StepRecord>(db_, steps, what));
    for (StepRecord& step : history) *job.add_history() = std::move(step);
  }
  RETURN_IF_ERROR(tx.Commit());
  return job;
}

absl::StatusOr<std::vector<JobStatus>> JobStore::List(int limit) const {
  if (limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat("list limit must be >= 0, got ", limit));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/false));
  // Equal creation times (or none) fall back to insertion order, newest first.
  ASSIGN_OR_RETURN(SqliteStatement select,
                   SqliteStatement::Prepare(db_,
                                            "SELECT status FROM jobs ORDER BY "
                                            "created_us DESC, seq DESC LIMIT ?"));
  select.Bind(1, limit == 0 ? int64_t{-1} : int64_t{limit});  // negative: no limit
  ASSIGN_OR_RETURN(std::vector<JobStatus> jobs, ReadAll<JobStatus>(db_, select, "listing jobs"));
  for (JobStatus& job : jobs) job.clear_history();
  RETURN_IF_ERROR(tx.Commit());
  return jobs;
}

absl::StatusOr<std::vector<StepRecord>> JobStore::Steps(const std::string& job_id,
                                                        int64_t from_step) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/false));
  RETURN_IF_ERROR(RequireJob(db_, job_id));
  ASSIGN_OR_RETURN(SqliteStatement select,
                   SqliteStatement::Prepare(db_,
                                            "SELECT record FROM steps WHERE job_id = ? "
                                            "AND step >= ? ORDER BY step"));
  select.Bind(1, job_id).Bind(2, from_step);
  ASSIGN_OR_RETURN(
      std::vector<StepRecord> steps,
      ReadAll<StepRecord>(db_, select, absl::StrCat("reading the steps of job '", job_id, "'")));
  RETURN_IF_ERROR(tx.Commit());
  return steps;
}

absl::StatusOr<std::vector<LogLine>> JobStore::Logs(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/false));
  RETURN_IF_ERROR(RequireJob(db_, job_id));
  ASSIGN_OR_RETURN(
      SqliteStatement select,
      SqliteStatement::Prepare(db_, "SELECT line FROM logs WHERE job_id = ? ORDER BY seq"));
  select.Bind(1, job_id);
  ASSIGN_OR_RETURN(
      std::vector<LogLine> lines,
      ReadAll<LogLine>(db_, select, absl::StrCat("reading the log of job '", job_id, "'")));
  RETURN_IF_ERROR(tx.Commit());
  return lines;
}

absl::Status JobStore::RecordStep(const JobStatus& job, const StepRecord& step,
                                  const Timeline& measured, const Timeline& predicted,
                                  TimelinesKept keep) {
  const std::string& id = job.job_id();
  const std::string what = absl::StrCat("recording step ", step.step(), " of job '", id, "'");
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/true));
  RETURN_IF_ERROR(WriteStatus(db_, job, what));
  RETURN_IF_ERROR(WriteStep(db_, id, step, what));
  if (measured.events_size() > 0) {
    RETURN_IF_ERROR(WriteTimeline(db_, id, 0, step.step(), measured, keep.measured, what));
  }
  if (predicted.events_size() > 0) {
    RETURN_IF_ERROR(WriteTimeline(db_, id, 1, step.step(), predicted, keep.predicted, what));
  }
  return tx.Commit();
}

absl::StatusOr<Timeline> JobStore::Timelines(const std::string& job_id, bool predicted,
                                             int last_steps) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SqliteTransaction tx, SqliteTransaction::Begin(db_, /*write=*/false));
  RETURN_IF_ERROR(RequireJob(db_, job_id));
  ASSIGN_OR_RETURN(SqliteStatement select,
                   SqliteStatement::Prepare(db_,
                                            "SELECT timeline FROM timelines WHERE job_id = ? "
                                            "AND predicted = ? ORDER BY step DESC LIMIT ?"));
  select.Bind(1, job_id).Bind(2, int64_t{predicted ? 1 : 0});
  select.Bind(3, int64_t{std::max(last_steps, 1)});
  ASSIGN_OR_RETURN(
      std::vector<Timeline> steps,
      ReadAll<Timeline>(db_, select, absl::StrCat("reading the timeline of job '", job_id, "'")));
  RETURN_IF_ERROR(tx.Commit());
  Timeline all;
  all.set_job_id(job_id);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    for (pipetrain::v1::TimelineEvent& e : *it->mutable_events()) *all.add_events() = std::move(e);
  }
  return all;
}

}  // namespace pipetrain::coordinator
