// Thin RAII wrappers over SQLite's C API for the coordinator's stores: prepared
// statements with bound parameters, transactions that roll back unless committed, and
// errors that carry SQLite's message and the database path.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct sqlite3;
struct sqlite3_stmt;

namespace pipetrain::coordinator {

// "database PATH: WHAT: sqlite message". UNAVAILABLE for what may pass (busy, locked,
// I/O, disk full, cannot open, read-only), INTERNAL for the rest.
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what);

// Runs SQL text that binds no parameters (schema, pragmas).
absl::Status SqliteExec(sqlite3* db, const char* sql, absl::string_view what);

// A prepared statement, finalized on destruction. A failed bind is kept and reported by
// the next Step(), so call sites stay one line per parameter.
class SqliteStatement {
 public:
  static absl::StatusOr<SqliteStatement> Prepare(sqlite3* db, const char* sql);
  SqliteStatement(SqliteStatement&& other) noexcept;
  SqliteStatement& operator=(SqliteStatement&&) = delete;
  ~SqliteStatement();

  // Parameters count from 1, as in SQLite.
  SqliteStatement& Bind(int index, int64_t value);
  SqliteStatement& Bind(int index, const std::string& text);
  SqliteStatement& BindBlob(int index, const std::string& bytes);

  // True while a row is available, false when done; `what` goes into the error.
  absl::StatusOr<bool> Step(absl::string_view what);
  absl::Status Run(absl::string_view what) { return Step(what).status(); }

  // Columns of the current row, counting from 0.
  int64_t Int(int column);
  std::string Blob(int column);

 private:
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  SqliteStatement& Check(int rc);

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int bind_rc_ = 0;  // SQLITE_OK
};

// BEGIN (IMMEDIATE for writers, so another connection waits on the busy timeout up
// front instead of failing at its first write); rolled back unless committed.
class SqliteTransaction {
 public:
  static absl::StatusOr<SqliteTransaction> Begin(sqlite3* db, bool write);
  SqliteTransaction(SqliteTransaction&& other) noexcept;
  SqliteTransaction& operator=(SqliteTransaction&&) = delete;
  ~SqliteTransaction();

  absl::Status Commit();

 private:
  explicit SqliteTransaction(sqlite3* db) : db_(db) {}
  sqlite3* db_;  // null once committed or moved from
};

}  // namespace pipetrain::coordinator
