#include "common/atomic_file.h"

#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::ListFolder;
using ::pipetrain::testing::ReadFileOrDie;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

TEST(AtomicFileTest, WritesAndReplacesLeavingNoTempFile) {
  TempDir dir;
  const std::string path = dir.File("out.bin");
  ASSERT_THAT(WriteFileAtomically(path, "first version"), IsOk());
  EXPECT_EQ(ReadFileOrDie(path), "first version");
  ASSERT_THAT(WriteFileAtomically(path, "second"), IsOk());
  EXPECT_EQ(ReadFileOrDie(path), "second");
  EXPECT_THAT(ListFolder(dir.path()), ElementsAre("out.bin"));
}

TEST(AtomicFileTest, TempFileLivesBesideTheTargetUntilCommit) {
  TempDir dir;
  const std::string path = dir.File("ckpt.safetensors");
  ASSERT_THAT(WriteFileAtomically(path, "old"), IsOk());
  auto writer = AtomicFileWriter::Open(path);
  ASSERT_THAT(writer, IsOk());
  EXPECT_THAT(writer->temp_path(), StartsWith(path + ".tmp."));
  ASSERT_THAT(writer->Write("new contents"), IsOk());
  // Until the commit, readers still see the old file.
  EXPECT_EQ(ReadFileOrDie(path), "old");
  EXPECT_EQ(ListFolder(dir.path()).size(), 2u);
  ASSERT_THAT(writer->Commit(), IsOk());
  EXPECT_EQ(ReadFileOrDie(path), "new contents");
  EXPECT_THAT(ListFolder(dir.path()), ElementsAre("ckpt.safetensors"));
  EXPECT_THAT(writer->Write("more"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(AtomicFileTest, WriteAtOverwritesInPlaceAndLaterWritesAppend) {
  TempDir dir;
  const std::string path = dir.File("tokens.bin");
  auto writer = AtomicFileWriter::Open(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->Write("....body"), IsOk());
  ASSERT_THAT(writer->WriteAt(0, "head"), IsOk());
  ASSERT_THAT(writer->Write("+tail"), IsOk());
  ASSERT_THAT(writer->Commit(), IsOk());
  EXPECT_EQ(ReadFileOrDie(path), "headbody+tail");
  EXPECT_THAT(writer->WriteAt(0, "x"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(AtomicFileTest, AbandonedWriterRemovesItsTempFileAndKeepsTheOldFile) {
  TempDir dir;
  const std::string path = dir.File("out.bin");
  ASSERT_THAT(WriteFileAtomically(path, "keep me"), IsOk());
  {
    auto writer = AtomicFileWriter::Open(path);
    ASSERT_THAT(writer, IsOk());
    ASSERT_THAT(writer->Write("half a"), IsOk());
  }
  EXPECT_EQ(ReadFileOrDie(path), "keep me");
  EXPECT_THAT(ListFolder(dir.path()), ElementsAre("out.bin"));
}

TEST(AtomicFileTest, MissingFolderIsAnErrorNamingThePath) {
  TempDir dir;
  const std::string path = dir.File("no/such/folder/out.bin");
  EXPECT_THAT(WriteFileAtomically(path, "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(ListFolder(dir.path()), IsEmpty());
  EXPECT_THAT(WriteFileAtomically("", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::common
