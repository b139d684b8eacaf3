#include "common/model/checkpoint_folder.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

model::TransformerConfig Tiny() {
  return {.vocab_size = 256, .seq_len = 8, .d_model = 16, .n_heads = 2, .n_layers = 3};
}

// A whole-model checkpoint with random weights and optimizer state.
model::Checkpoint Whole(uint32_t seed = 1) {
  model::Checkpoint c;
  c.config = Tiny();
  c.layer_begin = 0;
  c.layer_end = c.config.n_layers + 2;
  c.optimizer.emplace().step = 7;
  uint32_t x = seed;
  auto fill = [&](const model::ParamSpec& p) {
    common::Tensor t = *common::Tensor::Create(common::DType::kF32, p.shape);
    for (float& v : t.data<float>())
      v = static_cast<float>((x = x * 1664525u + 1013904223u) >> 8) * 1e-7f;
    return t;
  };
  for (const model::ParamSpec& p : model::RangeParams(c.config, c.layer_begin, c.layer_end)) {
    c.params.emplace(p.name, fill(p));
    c.optimizer->m.emplace(p.name, fill(p));
    c.optimizer->v.emplace(p.name, fill(p));
  }
  return c;
}

bool SameTensors(const model::ParamMap& a, const model::ParamMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) return false;
    auto x = t.data<float>(), y = it->second.data<float>();
    if (!std::equal(x.begin(), x.end(), y.begin(), y.end())) return false;
  }
  return true;
}

// The files of three stages holding [0, 2), [2, 4) and [4, 5), in `order` of stages.
std::vector<ChunkFile> StageFiles(const model::Checkpoint& whole,
                                  std::vector<int> order = {0, 1, 2}) {
  const std::pair<int, int> ranges[] = {{0, 2}, {2, 4}, {4, 5}};
  std::vector<ChunkFile> files;
  for (int s : order) {
    auto part = SliceCheckpoint(whole, ranges[s].first, ranges[s].second);
    EXPECT_THAT(part.status(), IsOk());
    auto bytes = model::SerializeCheckpoint(*part);
    EXPECT_THAT(bytes.status(), IsOk());
    files.push_back({s, 0, *bytes});
  }
  return files;
}

TEST(CheckpointFilesTest, FolderOfSlicesLoadsBackAsTheWholeModel) {
  testing::TempDir dir;
  const model::Checkpoint whole = Whole();
  const std::vector<ChunkFile> files = StageFiles(whole);
  ASSERT_THAT(WriteCheckpointFolder(dir.File("ckpt"), files, 1), IsOk());
  EXPECT_EQ(testing::ListFolder(dir.File("ckpt")),
            (std::vector<std::string>{"model.safetensors.index.json", "stage-0.safetensors",
                                      "stage-1.safetensors", "stage-2.safetensors"}));
  auto back = LoadWholeCheckpoint(dir.File("ckpt"), "init_from");
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->config, whole.config);
  EXPECT_EQ(back->layer_end, whole.layer_end);
  EXPECT_TRUE(SameTensors(back->params, whole.params));
  ASSERT_TRUE(back->optimizer.has_value());
  EXPECT_EQ(back->optimizer->step, 7);
  EXPECT_TRUE(SameTensors(back->optimizer->v, whole.optimizer->v));
  EXPECT_EQ(ChunkFileName(1, 1, 2), "stage-1-chunk-1.safetensors");
}

TEST(CheckpointFilesTest, ErrorsNameTheFieldAndWhatIsWrong) {
  testing::TempDir dir;
  EXPECT_THAT(LoadWholeCheckpoint(dir.File("nope"), "init_from").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("init_from")));
  EXPECT_THAT(
      LoadWholeCheckpoint(dir.path(), "init_from").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.safetensors.index.json")));
  // One stage's file is a checkpoint, but not of the whole model.
  auto part = SliceCheckpoint(Whole(), 0, 2);
  ASSERT_THAT(part.status(), IsOk());
  ASSERT_THAT(SaveCheckpoint(dir.File("stage-0.safetensors"), *part), IsOk());
  EXPECT_THAT(LoadWholeModel(dir.File("stage-0.safetensors"), "--checkpoint", "eval").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--checkpoint: " + dir.File("stage-0.safetensors") +
                                 " holds pipeline layers [0, 2) of 5; eval needs the whole model")));
  EXPECT_THAT(SliceCheckpoint(Whole(), 3, 9).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[3, 9)")));
}

// An index entry names a file of the folder itself: one that climbs out (../, an
// absolute path) would let a job read outside the folder it was allowed to name.
TEST(CheckpointFilesTest, IndexEntriesThatLeaveTheFolderAreRefused) {
  testing::TempDir dir;
  ASSERT_THAT(WriteCheckpointFolder(dir.File("ckpt"), StageFiles(Whole()), 1), IsOk());
  for (const std::string name : {"../outside.safetensors", "/etc/passwd", "sub/../../x"}) {
    testing::WriteFileOrDie(dir.File("ckpt/model.safetensors.index.json"),
                            R"({"weight_map": {"wte.weight": ")" + name + R"("}})");
    EXPECT_THAT(LoadWholeCheckpoint(dir.File("ckpt"), "init_from").status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("init_from"), HasSubstr("'" + name + "'"),
                               HasSubstr("not the name of a file in"))))
        << name;
  }
}

struct ChildResult {
  int exit_code = -1;   // 0: the write returned OK, 1: it returned an error
  std::string message;  // the error's text
};

// Runs WriteCheckpointFolder in a forked child whose files may not grow past
// `max_file_bytes` (RLIMIT_FSIZE, with SIGXFSZ ignored so that the write that crosses
// it fails with EFBIG, as on a full disk, instead of killing the child).
ChildResult WriteWithFileSizeLimit(const std::string& dir, const std::vector<ChunkFile>& files,
                                   uint64_t max_file_bytes) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{max_file_bytes, max_file_bytes};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
    const absl::Status s = WriteCheckpointFolder(dir, files, 1);
    const std::string text(s.message());
    if (write(fds[1], text.data(), text.size()) < 0) _exit(3);
    _exit(s.ok() ? 0 : 1);
  }
  close(fds[1]);
  ChildResult result;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) result.message.append(buffer, n);
  close(fds[0]);
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

// Stage 2's file (the head) first and stage 0's (the embedding) second, and a size
// limit that the first fits under and the second does not: the 2nd write fails.
struct FailingWrite {
  std::vector<ChunkFile> files;
  uint64_t limit = 0;
};
FailingWrite SecondFileTooLarge(const model::Checkpoint& whole) {
  FailingWrite w{StageFiles(whole, {2, 0, 1}), 0};
  w.limit = w.files[0].bytes.size();
  EXPECT_GT(w.files[1].bytes.size(), w.limit);
  return w;
}

TEST(CheckpointFolderWriteTest, ReplacesAnOlderFolderWholeAndLeavesNoTemporaryFolder) {
  testing::TempDir dir;
  ASSERT_THAT(WriteCheckpointFolder(dir.File("step-3"), StageFiles(Whole(1)), 1), IsOk());
  const model::Checkpoint newer = Whole(2);
  // Written through a path with a trailing slash, which names the same folder.
  ASSERT_THAT(WriteCheckpointFolder(dir.File("step-3/"), StageFiles(newer), 1), IsOk());
  EXPECT_EQ(testing::ListFolder(dir.path()), std::vector<std::string>{"step-3"});
  auto back = LoadWholeCheckpoint(dir.File("step-3"), "init_from");
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(SameTensors(back->params, newer.params));
  EXPECT_FALSE(SameTensors(back->params, Whole(1).params));
  // A parent that does not exist yet is created.
  EXPECT_THAT(WriteCheckpointFolder(dir.File("job-1/step-1"), StageFiles(newer), 1), IsOk());
  EXPECT_EQ(testing::ListFolder(dir.File("job-1")), std::vector<std::string>{"step-1"});
}

TEST(CheckpointFolderWriteTest, FailurePartWayLeavesNoFolderAndKeepsTheOlderOne) {
  testing::TempDir dir;
  const model::Checkpoint older = Whole(1);
  ASSERT_THAT(WriteCheckpointFolder(dir.File("step-1"), StageFiles(older), 1), IsOk());
  const std::vector<std::string> older_files = testing::ListFolder(dir.File("step-1"));

  const FailingWrite w = SecondFileTooLarge(Whole(2));
  const ChildResult child = WriteWithFileSizeLimit(dir.File("step-2"), w.files, w.limit);
  EXPECT_EQ(child.exit_code, 1) << child.message;
  EXPECT_THAT(child.message, HasSubstr("step-2"));
  EXPECT_THAT(child.message, HasSubstr("stage-0.safetensors"));
  EXPECT_THAT(child.message, HasSubstr("disk full"));
  // No step-2, no step-2.tmp-*: only the older, complete folder, as it was.
  EXPECT_EQ(testing::ListFolder(dir.path()), std::vector<std::string>{"step-1"});
  EXPECT_EQ(testing::ListFolder(dir.File("step-1")), older_files);
  auto back = LoadWholeCheckpoint(dir.File("step-1"), "init_from");
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(SameTensors(back->params, older.params));

  // The same limit without a second file that crosses it succeeds: the limit, not
  // something else, made the write above fail.
  const std::vector<ChunkFile> first_only(w.files.begin(), w.files.begin() + 1);
  EXPECT_EQ(WriteWithFileSizeLimit(dir.File("step-2"), first_only, w.limit).exit_code, 0);
  EXPECT_EQ(testing::ListFolder(dir.path()), (std::vector<std::string>{"step-1", "step-2"}));
}

TEST(CheckpointFolderWriteTest, FailedRewriteOfTheSameFolderKeepsTheOlderOne) {
  testing::TempDir dir;
  const model::Checkpoint older = Whole(1);
  ASSERT_THAT(WriteCheckpointFolder(dir.File("step-1"), StageFiles(older), 1), IsOk());
  const FailingWrite w = SecondFileTooLarge(Whole(2));
  const ChildResult child = WriteWithFileSizeLimit(dir.File("step-1"), w.files, w.limit);
  EXPECT_EQ(child.exit_code, 1) << child.message;
  EXPECT_THAT(child.message, HasSubstr("disk full"));
  EXPECT_EQ(testing::ListFolder(dir.path()), std::vector<std::string>{"step-1"});
  auto back = LoadWholeCheckpoint(dir.File("step-1"), "init_from");
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(SameTensors(back->params, older.params));
}

TEST(CheckpointFolderWriteTest, TemporaryFolderNamesAreRecognised) {
  EXPECT_TRUE(IsTemporaryCheckpointFolder("step-7.tmp-Ab12Cd"));
  EXPECT_FALSE(IsTemporaryCheckpointFolder("step-7"));
  EXPECT_FALSE(IsTemporaryCheckpointFolder("step-17"));
}

// The step of a folder named step-N, for resume and recovery; nothing else is one.
TEST(CheckpointFolderStepTest, ReadsTheStepOfStepNFoldersOnly) {
  EXPECT_EQ(CheckpointFolderStep("/state/checkpoints/job-000001/step-40"), 40);
  EXPECT_EQ(CheckpointFolderStep("step-0"), 0);
  EXPECT_EQ(CheckpointFolderStep("/x/step-7.tmp-ab12cd"), std::nullopt);
  EXPECT_EQ(CheckpointFolderStep("/x/step--3"), std::nullopt);
  EXPECT_EQ(CheckpointFolderStep("/x/model"), std::nullopt);
  EXPECT_EQ(CheckpointFolderStep(""), std::nullopt);
}

}  // namespace
}  // namespace pipetrain::model
