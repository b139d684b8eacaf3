// SQLite wrappers: see sqlite_statement.h.
#include "coordinator/store/sqlite_statement.h"

#include <sqlite3.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::coordinator {

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  const char* path = sqlite3_db_filename(db, "main");
  std::string message =
      absl::StrCat("database ", path != nullptr ? path : "?", ": ", what, ": ", sqlite3_errmsg(db));
  switch (rc & 0xff) {  // the primary code of an extended one
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status SqliteExec(sqlite3* db, const char* sql, absl::string_view what) {
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? absl::OkStatus() : SqliteError(db, rc, what);
}

absl::StatusOr<SqliteStatement> SqliteStatement::Prepare(sqlite3* db, const char* sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db, rc, absl::StrCat("preparing '", sql, "'"));
  return SqliteStatement(db, stmt);
}

SqliteStatement::SqliteStatement(SqliteStatement&& other) noexcept
    : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), bind_rc_(other.bind_rc_) {}

SqliteStatement::~SqliteStatement() { sqlite3_finalize(stmt_); }

SqliteStatement& SqliteStatement::Check(int rc) {
  if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

SqliteStatement& SqliteStatement::Bind(int index, int64_t value) {
  return Check(sqlite3_bind_int64(stmt_, index, value));
}

SqliteStatement& SqliteStatement::Bind(int index, const std::string& text) {
  return Check(sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()),
                                 SQLITE_TRANSIENT));
}

SqliteStatement& SqliteStatement::BindBlob(int index, const std::string& bytes) {
  // data() is never null, so an empty string binds an empty blob rather than NULL.
  return Check(sqlite3_bind_blob(stmt_, index, bytes.data(), static_cast<int>(bytes.size()),
                                 SQLITE_TRANSIENT));
}

absl::StatusOr<bool> SqliteStatement::Step(absl::string_view what) {
  if (bind_rc_ != SQLITE_OK) return SqliteError(db_, bind_rc_, what);
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqliteError(db_, rc, what);
}

int64_t SqliteStatement::Int(int column) { return sqlite3_column_int64(stmt_, column); }

std::string SqliteStatement::Blob(int column) {
  const void* data = sqlite3_column_blob(stmt_, column);
  int size = sqlite3_column_bytes(stmt_, column);
  return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), size);
}

absl::StatusOr<SqliteTransaction> SqliteTransaction::Begin(sqlite3* db, bool write) {
  RETURN_IF_ERROR(SqliteExec(db, write ? "BEGIN IMMEDIATE" : "BEGIN", "beginning a transaction"));
  return SqliteTransaction(db);
}

SqliteTransaction::SqliteTransaction(SqliteTransaction&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)) {}

SqliteTransaction::~SqliteTransaction() {
  if (db_ != nullptr) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

absl::Status SqliteTransaction::Commit() {
  absl::Status status = SqliteExec(db_, "COMMIT", "committing");
  if (status.ok()) db_ = nullptr;
  return status;
}

}  // namespace pipetrain::coordinator
