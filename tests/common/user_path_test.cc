// common/user_path: what is refused (FIFOs, devices, folders, too-big files, paths out
// of --data-root) and with which words, and that a FIFO never blocks a read.
#include "common/user_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::common {
namespace {

using ::testing::HasSubstr;

namespace fs = std::filesystem;

// Runs `f` on another thread and fails (rather than hangs) when it takes over 10 s: a
// FIFO that is opened for reading blocks until a writer comes, which would hang CI.
template <typename F>
auto WithDeadline(F f) {
  auto done = std::async(std::launch::async, f);
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked for 10 s: the FIFO was opened";
    std::fflush(nullptr);  // _Exit flushes nothing: keep the failure's text
    std::_Exit(1);         // the blocked thread cannot be joined
  }
  return done.get();
}

TEST(UserPathTest, RegularFileGivesItsSize) {
  pipetrain::testing::TempDir dir;
  pipetrain::testing::WriteFileOrDie(dir.File("a.txt"), "hello");
  absl::StatusOr<int64_t> size = CheckRegularFile(dir.File("a.txt"), 100, "job-1: data.corpus");
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 5);
  absl::StatusOr<std::string> text = ReadRegularFile(dir.File("a.txt"), 100, "data.corpus");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "hello");
}

TEST(UserPathTest, EmptyFileReadsEmpty) {
  pipetrain::testing::TempDir dir;
  pipetrain::testing::WriteFileOrDie(dir.File("empty"), "");
  absl::StatusOr<std::string> text = ReadRegularFile(dir.File("empty"), 100, "f");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "");
}

TEST(UserPathTest, FifoIsRefusedWithoutBlocking) {
  pipetrain::testing::TempDir dir;
  const std::string fifo = dir.File("pipe");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::Status checked = WithDeadline([&] {
    return CheckRegularFile(fifo, 100, "job-7: data.corpus").status();
  });
  EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(checked.message(), HasSubstr("job-7: data.corpus " + fifo +
                                           " is a FIFO, not a regular file"));
  absl::Status read = WithDeadline([&] { return ReadRegularFile(fifo, 100, "x").status(); });
  EXPECT_THAT(read.message(), HasSubstr("is a FIFO"));
}

TEST(UserPathTest, DevZeroIsACharacterDevice) {
  absl::Status s = ReadRegularFile("/dev/zero", 100, "job-7: data.corpus").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("job-7: data.corpus /dev/zero is a character device, not a regular file"));
}

TEST(UserPathTest, FolderIsNotAFileAndAFileIsNotAFolder) {
  pipetrain::testing::TempDir dir;
  absl::Status s = CheckRegularFile(dir.path(), 100, "init_from").status();
  EXPECT_THAT(s.message(), HasSubstr("is a folder, not a regular file"));
  EXPECT_TRUE(CheckFolder(dir.path(), "init_from").ok());
  pipetrain::testing::WriteFileOrDie(dir.File("f"), "x");
  absl::Status f = CheckFolder(dir.File("f"), "init_from");
  EXPECT_EQ(f.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.message(), HasSubstr("is a regular file, not a folder"));
}

TEST(UserPathTest, TooBigIsRefusedWithBothSizes) {
  pipetrain::testing::TempDir dir;
  pipetrain::testing::WriteFileOrDie(dir.File("big"), std::string(2000, 'x'));
  absl::Status s = ReadRegularFile(dir.File("big"), 1000, "--token-file").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is 2000 bytes, more than the 1000 B allowed"));
  EXPECT_TRUE(ReadRegularFile(dir.File("big"), 2000, "--token-file").ok());
}

TEST(UserPathTest, MissingFileSaysSo) {
  pipetrain::testing::TempDir dir;
  absl::Status s = CheckRegularFile(dir.File("nope"), 10, "data.tokens[0]").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("data.tokens[0] cannot read " + dir.File("nope") +
                                     ": No such file or directory"));
}

TEST(UserPathTest, ResolvesMissingPathsThroughTheirNearestParent) {
  pipetrain::testing::TempDir dir;
  const std::string real = fs::canonical(dir.path()).string();
  fs::create_directory(dir.File("sub"));
  fs::create_directory_symlink(dir.File("sub"), dir.File("link"));
  absl::StatusOr<std::string> r = ResolvePath(dir.File("link/new/deeper"), "x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, real + "/sub/new/deeper");
  absl::Status dots = ResolvePath(dir.File("new/../../etc"), "x").status();
  EXPECT_THAT(dots.message(), HasSubstr("'..' below a folder that does not exist"));
}

TEST(UserPathTest, UnconfinedRootsAllowAnything) {
  DataRoots none;
  EXPECT_FALSE(none.confining());
  EXPECT_TRUE(none.Check("/etc/passwd", "data.corpus").ok());
}

TEST(UserPathTest, RootsConfineAfterSymlinks) {
  pipetrain::testing::TempDir dir;
  fs::create_directory(dir.File("root"));
  fs::create_directory(dir.File("outside"));
  pipetrain::testing::WriteFileOrDie(dir.File("root/in.txt"), "x");
  pipetrain::testing::WriteFileOrDie(dir.File("outside/secret.txt"), "x");
  fs::create_symlink(dir.File("outside/secret.txt"), dir.File("root/escape.txt"));
  fs::create_directory_symlink(dir.File("outside"), dir.File("root/escape_dir"));
  absl::StatusOr<DataRoots> roots = DataRoots::Make({dir.File("root")});
  ASSERT_TRUE(roots.ok()) << roots.status();
  ASSERT_TRUE(roots->confining());

  EXPECT_TRUE(roots->Check(dir.File("root/in.txt"), "data.corpus").ok());
  EXPECT_TRUE(roots->Check(dir.File("root"), "init_from").ok());
  // A folder not made yet under the root (a new checkpoint) is inside.
  EXPECT_TRUE(roots->Check(dir.File("root/new/step-1"), "checkpoint").ok());

  absl::Status link = roots->Check(dir.File("root/escape.txt"), "job-3: data.corpus");
  EXPECT_EQ(link.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(link.message(), HasSubstr("job-3: data.corpus " + dir.File("root/escape.txt") +
                                        " resolves to "));
  EXPECT_THAT(link.message(), HasSubstr("outside the coordinator's --data-root folders (" +
                                        fs::canonical(dir.File("root")).string() + ")"));
  EXPECT_FALSE(roots->Check(dir.File("root/escape_dir/new"), "init_from").ok());
  EXPECT_FALSE(roots->Check(dir.File("root/../outside/secret.txt"), "data.corpus").ok());
  // A sibling whose name starts with the root's is not inside it.
  fs::create_directory(dir.File("rootless"));
  EXPECT_FALSE(roots->Check(dir.File("rootless"), "init_from").ok());
  EXPECT_FALSE(roots->Check("/etc/passwd", "data.corpus").ok());
}

TEST(UserPathTest, AllowAddsAFolderOnlyWhenConfining) {
  pipetrain::testing::TempDir dir;
  DataRoots none;
  ASSERT_TRUE(none.Allow(dir.File("state/checkpoints")).ok());
  EXPECT_FALSE(none.confining());
  fs::create_directory(dir.File("data"));
  absl::StatusOr<DataRoots> roots = DataRoots::Make({dir.File("data")});
  ASSERT_TRUE(roots.ok());
  EXPECT_FALSE(roots->Check(dir.File("state/checkpoints/job-1/step-2"), "init_from").ok());
  ASSERT_TRUE(roots->Allow(dir.File("state/checkpoints")).ok());
  EXPECT_TRUE(roots->Check(dir.File("state/checkpoints/job-1/step-2"), "init_from").ok());
}

TEST(UserPathTest, RootMustBeAnExistingFolder) {
  pipetrain::testing::TempDir dir;
  absl::Status missing = DataRoots::Make({dir.File("nope")}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("--data-root cannot read " + dir.File("nope")));
  pipetrain::testing::WriteFileOrDie(dir.File("f"), "x");
  EXPECT_THAT(DataRoots::Make({dir.File("f")}).status().message(), HasSubstr("not a folder"));
}

}  // namespace
}  // namespace pipetrain::common
