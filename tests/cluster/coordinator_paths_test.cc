// End to end, the coordinator judging the paths a job names: a FIFO, a device or a
// folder as data is refused without being opened, an init_from whose safetensors header
// does not parse is refused at submit, and with --data-root a path that resolves (after
// symlinks) outside the roots is refused, each INVALID_ARGUMENT (CLI exit 2) naming the
// field; a job inside the roots trains, and one started from the coordinator's own
// checkpoint (what `pipetrain resume` names) is allowed. A coordinator given no
// --data-root confines jobs to its working folder and its state dir.
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::pipetrain::testing::ProcessCluster;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

namespace fs = std::filesystem;

// One coordinator (1 stage) for the whole binary, confined to ROOT and to /dev (the
// second root lets a device be judged as a device rather than as outside the roots).
ProcessCluster& TheConfined() {
  static ProcessCluster confined(1, [](const TempDir& dir) {
    const std::string root = dir.File("root");
    fs::create_directory(root);
    WriteFileOrDie(root + "/corpus.txt", testing::EnglishLikeCorpus());
    LocalClusterOptions options;
    options.data_roots = {root, "/dev"};
    return options;
  });
  return confined;
}

class CoordinatorPathsTest : public testing::ClusterJobTest {
 protected:
  void SetUp() override {
    c_ = TheConfined().Get();
    ASSERT_NE(c_, nullptr) << "the cluster did not start: " << TheConfined().failure();
    root_ = TheConfined().dir().File("root");
    spec_["data"]["corpus"] = root_ + "/corpus.txt";
    spec_["training"]["steps"] = 2;
  }

  // Submits spec_ and expects the coordinator to refuse it (exit 2) with every one of
  // `says` in the message; the CLI's deadline is the test's: a blocked coordinator
  // thread shows as a failure, not a hang.
  void ExpectRefused(const std::vector<std::string>& says) {
    auto r = c_->Cli({"submit", WriteSpec(spec_), "--no-wait"}, 30s);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 2) << r->out << r->err;
    for (const std::string& s : says) EXPECT_THAT(r->err, HasSubstr(s)) << r->err;
    // And the coordinator still serves.
    auto cluster = c_->Cli({"cluster", "--json"}, 30s);
    ASSERT_TRUE(cluster.ok());
    EXPECT_EQ(cluster->exit_code, 0) << cluster->err << "\n" << c_->coordinator_log();
  }

  LocalCluster* c_ = nullptr;
  std::string root_;
};

TEST_F(CoordinatorPathsTest, AFifoAsCorpusIsRefusedWithoutBlocking) {
  const std::string fifo = root_ + "/fifo.txt";
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  spec_["data"]["corpus"] = fifo;
  ExpectRefused({"data.corpus", fifo + " is a FIFO, not a regular file"});
}

TEST_F(CoordinatorPathsTest, ADeviceAsCorpusIsRefused) {
  spec_["data"]["corpus"] = "/dev/zero";
  ExpectRefused({"data.corpus /dev/zero is a character device, not a regular file"});
}

TEST_F(CoordinatorPathsTest, AFolderAsTokenFileIsRefused) {
  fs::create_directories(root_ + "/shards.bin");
  spec_["data"].erase("corpus");
  spec_["data"]["tokens"] = {root_ + "/shards.bin"};
  ExpectRefused({"data.tokens[0]", "shards.bin is a folder, not a regular file"});
}

TEST_F(CoordinatorPathsTest, ACorpusOutsideTheRootsIsRefusedNamingTheRoots) {
  // dir_ is the test's own folder, outside the root.
  spec_["data"]["corpus"] = dir_.File("corpus.txt");
  ExpectRefused({"data.corpus " + dir_.File("corpus.txt"),
                 "outside the coordinator's --data-root folders (" +
                     fs::canonical(root_).string() + ", /dev, "});
}

TEST_F(CoordinatorPathsTest, ASymlinkOutOfTheRootIsRefused) {
  const std::string link = root_ + "/escape.txt";
  fs::remove(link);
  fs::create_symlink(dir_.File("corpus.txt"), link);
  spec_["data"]["corpus"] = link;
  ExpectRefused({"data.corpus " + link + " resolves to", "outside the coordinator's --data-root"});
}

TEST_F(CoordinatorPathsTest, ATokenGlobOutsideTheRootsIsRefused) {
  spec_["data"].erase("corpus");
  spec_["data"]["tokens"] = {"/etc/*"};
  ExpectRefused({"data.tokens[0] /etc/*", "outside the coordinator's --data-root"});
}

TEST_F(CoordinatorPathsTest, InitFromOutsideTheRootsIsRefused) {
  fs::create_directory(dir_.File("ckpt"));
  spec_["init_from"] = dir_.File("ckpt");
  ExpectRefused({"init_from " + dir_.File("ckpt"), "outside the coordinator's --data-root"});
}

// A garbage init_from was once accepted at submit and failed only when the job
// started; its header is read at submit now, as token files are scanned.
TEST_F(CoordinatorPathsTest, AGarbageInitFromIsRefusedAtSubmit) {
  const std::string garbage = root_ + "/garbage.safetensors";
  WriteFileOrDie(garbage, "not a safetensors file");
  spec_["init_from"] = garbage;
  ExpectRefused({"init_from: " + garbage});
  const std::string folder = root_ + "/garbage-ckpt";
  fs::create_directories(folder);
  WriteFileOrDie(folder + "/stage-0.safetensors", std::string(64, '\xff'));
  spec_["init_from"] = folder;
  ExpectRefused({"init_from: " + folder + "/stage-0.safetensors"});
}

TEST_F(CoordinatorPathsTest, InitFromFolderWithASymlinkOutOfTheRootIsRefused) {
  const std::string ckpt = root_ + "/ckpt-with-link";
  fs::create_directories(ckpt);
  WriteFileOrDie(dir_.File("model.safetensors"), "x");
  fs::remove(ckpt + "/model.safetensors");
  fs::create_symlink(dir_.File("model.safetensors"), ckpt + "/model.safetensors");
  spec_["init_from"] = ckpt;
  ExpectRefused({"init_from " + ckpt + "/model.safetensors resolves to",
                 "outside the coordinator's --data-root"});
}

// Inside the root a job trains; its checkpoint, under the state dir, may start another.
TEST_F(CoordinatorPathsTest, AJobInsideTheRootTrainsAndItsCheckpointMayStartAnother) {
  const std::string id = SubmitAndFollow(*c_, {});
  ASSERT_FALSE(id.empty());
  const json first = Status(*c_, id);
  ASSERT_EQ(first["state"], "SUCCEEDED") << first.dump() << c_->coordinator_log();
  const std::string checkpoint = first["checkpoint_dir"];
  ASSERT_FALSE(checkpoint.empty());
  spec_["init_from"] = checkpoint;
  const std::string next = SubmitAndFollow(*c_, {});
  ASSERT_FALSE(next.empty());
  EXPECT_EQ(Status(*c_, next)["state"], "SUCCEEDED") << c_->coordinator_log();
}

// Without --data-root (a job once could read any file the coordinator could, e.g.
// /etc/shadow as a corpus) the coordinator lets jobs read its working folder and its
// state dir only; elsewhere is refused, naming the field and how to allow it.
class CoordinatorDefaultRootsTest : public testing::ClusterJobTest {};

TEST_F(CoordinatorDefaultRootsTest, ACorpusOutsideTheWorkingFolderAndStateDirIsRefused) {
  LocalClusterOptions options;
  options.data_roots = {};  // no --data-root at all
  const std::string state = dir_.File("state");
  auto cluster = LocalCluster::Start(state, 1, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  spec_["training"]["steps"] = 1;
  // dir_ holds the state dir but is neither it nor the coordinator's working folder.
  for (const std::string& corpus : {dir_.File("corpus.txt"), std::string("/etc/passwd")}) {
    spec_["data"]["corpus"] = corpus;
    auto r = (*cluster)->Cli({"submit", WriteSpec(spec_), "--no-wait"}, 30s);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 2) << r->out << r->err;
    EXPECT_THAT(r->err, HasSubstr("data.corpus " + corpus)) << r->err;
    EXPECT_THAT(r->err, HasSubstr("started without --data-root")) << r->err;
    EXPECT_THAT(r->err, HasSubstr("--data-root / allows any file")) << r->err;
  }
  // The same corpus in its state dir is the coordinator's to read.
  WriteFileOrDie(state + "/corpus.txt", testing::EnglishLikeCorpus());
  spec_["data"]["corpus"] = state + "/corpus.txt";
  const std::string id = SubmitAndFollow(**cluster, {});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Status(**cluster, id)["state"], "SUCCEEDED") << (*cluster)->coordinator_log();
}

}  // namespace
}  // namespace pipetrain
