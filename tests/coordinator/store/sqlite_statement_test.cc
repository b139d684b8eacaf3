// Tests of the SQLite wrappers: bound parameters round-trip (text with quotes, empty
// blobs), uncommitted transactions roll back, and errors carry the path and the right code.
#include "coordinator/store/sqlite_statement.h"

#include <sqlite3.h>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::coordinator {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// An open connection, closed on destruction, with a table t(k TEXT, v BLOB).
class Db {
 public:
  explicit Db(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    EXPECT_THAT(SqliteExec(db_, "CREATE TABLE IF NOT EXISTS t(k TEXT, v BLOB)", "schema"), IsOk());
  }
  ~Db() { sqlite3_close_v2(db_); }
  sqlite3* get() const { return db_; }

  int64_t Count() {
    auto select = SqliteStatement::Prepare(db_, "SELECT COUNT(*) FROM t");
    EXPECT_THAT(select, IsOk());
    EXPECT_THAT(select->Step("count"), IsOk());
    return select->Int(0);
  }

 private:
  sqlite3* db_ = nullptr;
};

TEST(SqliteStatementTest, BoundValuesRoundTrip) {
  ::pipetrain::testing::TempDir dir;
  Db db(dir.File("t.db"));
  const std::string key = "it's; DROP TABLE t; --";
  const std::string blob("\0\1\2", 3);
  for (const std::string& value : {blob, std::string()}) {
    auto insert = SqliteStatement::Prepare(db.get(), "INSERT INTO t(k, v) VALUES(?, ?)");
    ASSERT_THAT(insert, IsOk());
    ASSERT_THAT(insert->Bind(1, key).BindBlob(2, value).Run("insert"), IsOk());
  }
  auto select = SqliteStatement::Prepare(db.get(), "SELECT v, v IS NULL FROM t WHERE k = ?");
  ASSERT_THAT(select, IsOk());
  select->Bind(1, key);
  ASSERT_EQ(select->Step("select").value_or(false), true);
  EXPECT_EQ(select->Blob(0), blob);
  ASSERT_EQ(select->Step("select").value_or(false), true);
  EXPECT_EQ(select->Blob(0), "");
  EXPECT_EQ(select->Int(1), 0);  // an empty blob, not NULL
  EXPECT_EQ(select->Step("select").value_or(true), false);
}

TEST(SqliteStatementTest, TransactionsRollBackUnlessCommitted) {
  ::pipetrain::testing::TempDir dir;
  Db db(dir.File("t.db"));
  for (bool commit : {false, true}) {
    auto tx = SqliteTransaction::Begin(db.get(), /*write=*/true);
    ASSERT_THAT(tx, IsOk());
    ASSERT_THAT(SqliteExec(db.get(), "INSERT INTO t(k) VALUES('x')", "insert"), IsOk());
    if (commit) {
      ASSERT_THAT(tx->Commit(), IsOk());
    }
  }
  EXPECT_EQ(db.Count(), 1);
}

TEST(SqliteStatementTest, ErrorsNameThePathAndMapCodes) {
  ::pipetrain::testing::TempDir dir;
  const std::string path = dir.File("t.db");
  Db db(path);
  EXPECT_THAT(SqliteStatement::Prepare(db.get(), "SELECT nope FROM t"),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr(path), HasSubstr("no such column: nope"))));
  EXPECT_THAT(SqliteExec(db.get(), "INSERT INTO missing VALUES(1)", "inserting"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("inserting")));

  // A second connection that cannot get the write lock is UNAVAILABLE (it may pass).
  Db other(path);
  sqlite3_busy_timeout(other.get(), 0);
  auto held = SqliteTransaction::Begin(db.get(), /*write=*/true);
  ASSERT_THAT(held, IsOk());
  EXPECT_THAT(SqliteTransaction::Begin(other.get(), /*write=*/true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(path)));
}

}  // namespace
}  // namespace pipetrain::coordinator
