// A disk that fills up during a checkpoint: with the coordinator's checkpoint folder on
// a small tmpfs, the checkpoint that does not fit fails the job with a reason that names
// ENOSPC and the file, leaves nothing half-written, and the previous checkpoint stays
// whole: it loads, and `pipetrain resume` continues from it to the losses of a run that
// never failed. The tmpfs is mounted in a private mount namespace (root only; skipped
// with a message elsewhere), which the servers the test starts inherit.
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint_folder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/tolerance.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::ListFolder;
using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::Losses;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

int64_t UsedBytes(const std::string& path) {
  struct statvfs s;
  if (statvfs(path.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_blocks - s.f_bfree) * static_cast<int64_t>(s.f_frsize);
}

// Mounts (or, with `remount`, resizes) a tmpfs of `bytes` at `path`; errno's text or "".
std::string MountTmpfs(const std::string& path, int64_t bytes, bool remount) {
  const std::string options = absl::StrCat("size=", bytes);
  const unsigned long flags = remount ? MS_REMOUNT : 0;
  if (mount("tmpfs", path.c_str(), "tmpfs", flags, options.c_str()) != 0) {
    return std::strerror(errno);
  }
  return "";
}

class CheckpointDiskFullTest : public testing::ClusterJobTest {};

TEST_F(CheckpointDiskFullTest, AFullDiskFailsTheJobAndKeepsThePreviousCheckpoint) {
  // Before any thread exists (unshare refuses a new mount namespace to a threaded
  // process): a namespace of our own, whose mounts never propagate to the machine's.
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a private mount namespace and a tmpfs";
  if (unshare(CLONE_NEWNS) != 0) {
    GTEST_SKIP() << "cannot make a private mount namespace: " << std::strerror(errno);
  }
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    GTEST_SKIP() << "cannot make mounts private: " << std::strerror(errno);
  }
  const std::string state = dir_.File("state");
  const std::string checkpoints = state + "/checkpoints";
  fs::create_directories(checkpoints);
  if (std::string e = MountTmpfs(checkpoints, 64 << 20, false); !e.empty()) {
    GTEST_SKIP() << "cannot mount a tmpfs: " << e;
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{checkpoints};

  std::unique_ptr<LocalCluster> c;
  {
    auto started = LocalCluster::Start(state, 1);
    ASSERT_TRUE(started.ok()) << started.status();
    c = *std::move(started);
  }
  // A job with room: 4 steps, checkpoints after steps 2 and 4. Its losses are those of a
  // run that never failed, and its checkpoints tell the size of one.
  const std::string whole = SubmitAndFollow(*c, {});
  const json unbroken = Status(*c, whole);
  ASSERT_EQ(unbroken["state"], "SUCCEEDED") << unbroken.dump() << c->coordinator_log();
  const int64_t one_checkpoint = UsedBytes(checkpoints) / 2;
  ASSERT_GT(one_checkpoint, 0);
  fs::remove_all(fs::path(checkpoints) / whole);

  // Room for one checkpoint and a half: step 2's fits, step 4's does not.
  ASSERT_EQ(MountTmpfs(checkpoints, one_checkpoint * 3 / 2, true), "");
  const std::string id = SubmitAndFollow(*c, {}, /*expect_exit=*/1);
  ASSERT_FALSE(id.empty());
  const json failed = Status(*c, id);
  ASSERT_EQ(failed["state"], "FAILED") << failed.dump();
  const std::string reason = failed["reason"];
  RecordProperty("reason", reason);
  EXPECT_THAT(reason, HasSubstr("step 4: writing the checkpoint"));
  EXPECT_THAT(reason, HasSubstr("No space left on device"));
  EXPECT_THAT(reason, HasSubstr("disk full"));
  EXPECT_THAT(reason, HasSubstr(absl::StrCat(checkpoints, "/", id, "/step-4")));
  EXPECT_THAT(reason, HasSubstr(".safetensors")) << "the file that did not fit is named";

  // Step 2's checkpoint is the job's, whole and loadable; nothing of step 4's is left.
  const std::string kept = failed["checkpoint_dir"];
  EXPECT_EQ(kept, absl::StrCat(checkpoints, "/", id, "/step-2"));
  EXPECT_EQ(ListFolder(absl::StrCat(checkpoints, "/", id)), std::vector<std::string>{"step-2"});
  absl::StatusOr<model::Checkpoint> loaded = model::LoadWholeCheckpoint(kept, "checkpoint");
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  // With room again, resume continues from it to the unbroken run's losses.
  ASSERT_EQ(MountTmpfs(checkpoints, 64 << 20, true), "");
  auto resumed = c->Cli({"resume", id});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->exit_code, 0) << resumed->out << resumed->err;
  EXPECT_THAT(resumed->out, HasSubstr(absl::StrCat("resuming ", id, " from ", kept)));
  const std::string next = testing::SubmittedId(resumed->out);
  const json done = Status(*c, next);
  ASSERT_EQ(done["state"], "SUCCEEDED") << done.dump();
  const std::vector<double> all = Losses(unbroken), rest = Losses(done);
  ASSERT_EQ(all.size(), 4u);
  ASSERT_EQ(rest.size(), 2u) << done.dump();
  // The checkpoint holds the weights, the AdamW moments and the data position: the same
  // arithmetic from there, so the same bits.
  EXPECT_TRUE(testing::LossesMatch(rest, {all.begin() + 2, all.end()}, testing::kSameArithmetic));
  c.reset();  // the servers stop before the tmpfs goes
}

}  // namespace
}  // namespace pipetrain
