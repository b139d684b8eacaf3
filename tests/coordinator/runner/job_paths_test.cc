// Tests of the coordinator's checks of the paths a job names, without a cluster: an
// init_from whose safetensors header does not parse is refused at submit (naming the
// field and the file) while a real checkpoint passes, and the folders jobs may read
// when the coordinator is given no --data-root (its working folder and its state dir).
#include "coordinator/runner/job_paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "common/model/checkpoint.h"
#include "common/model/transformer_config.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::coordinator {
namespace {

namespace fs = std::filesystem;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A whole tiny model, zeros, as the coordinator writes one stage's file.
absl::Status WriteCheckpoint(const std::string& path) {
  model::Checkpoint c;
  c.config = {.vocab_size = 256, .seq_len = 8, .d_model = 16, .n_heads = 2, .n_layers = 1};
  c.layer_begin = 0;
  c.layer_end = c.config.num_pipeline_layers();
  for (const model::ParamSpec& p : model::RangeParams(c.config, c.layer_begin, c.layer_end)) {
    c.params.emplace(p.name, *common::Tensor::Create(common::DType::kF32, p.shape));
  }
  return model::SaveCheckpoint(path, c);
}

pipetrain::v1::JobSpec InitFrom(const std::string& path) {
  pipetrain::v1::JobSpec spec;
  spec.set_init_from(path);
  return spec;
}

TEST(JobPathsTest, AGarbageInitFromFileIsRefusedNamingTheFieldAndTheFile) {
  TempDir dir;
  const std::string garbage = dir.File("garbage.safetensors");
  WriteFileOrDie(garbage, "this is not a safetensors file at all");
  EXPECT_THAT(CheckJobPaths(InitFrom(garbage), common::DataRoots()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("init_from: "), HasSubstr(garbage))));
  // A header that parses but is not a pipetrain checkpoint (no metadata, no tensors).
  const std::string empty_header = dir.File("empty.safetensors");
  WriteFileOrDie(empty_header, std::string("\x02\0\0\0\0\0\0\0{}", 10));
  EXPECT_THAT(CheckJobPaths(InitFrom(empty_header), common::DataRoots()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("init_from: "), HasSubstr(empty_header))));
  const std::string good = dir.File("model.safetensors");
  ASSERT_THAT(WriteCheckpoint(good), IsOk());
  EXPECT_THAT(CheckJobPaths(InitFrom(good), common::DataRoots()), IsOk());
}

TEST(JobPathsTest, AnInitFromFolderHasEachSafetensorsHeaderChecked) {
  TempDir dir;
  const std::string folder = dir.File("ckpt");
  fs::create_directory(folder);
  EXPECT_THAT(CheckJobPaths(InitFrom(folder), common::DataRoots()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(folder), HasSubstr("holds no .safetensors file"))));
  ASSERT_THAT(WriteCheckpoint(folder + "/stage-0.safetensors"), IsOk());
  EXPECT_THAT(CheckJobPaths(InitFrom(folder), common::DataRoots()), IsOk());
  WriteFileOrDie(folder + "/stage-1.safetensors", std::string(100, '\xff'));
  EXPECT_THAT(CheckJobPaths(InitFrom(folder), common::DataRoots()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("init_from: "), HasSubstr("stage-1.safetensors"))));
  // A Hugging Face folder's files are read as plain safetensors: its header must parse.
  const std::string hf = dir.File("hf");
  fs::create_directory(hf);
  WriteFileOrDie(hf + "/config.json", "{}");
  WriteFileOrDie(hf + "/model.safetensors", "garbage");
  EXPECT_THAT(CheckJobPaths(InitFrom(hf), common::DataRoots()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("init_from: "), HasSubstr(hf + "/model.safetensors"))));
}

TEST(JobPathsTest, AnInitFromThatIsNeitherFileNorFolderIsRefusedUnopened) {
  TempDir dir;
  const std::string fifo = dir.File("fifo.safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(CheckJobPaths(InitFrom(fifo), common::DataRoots()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("init_from " + fifo + " is a FIFO"),
                             HasSubstr("a checkpoint folder or one .safetensors file"))));
  EXPECT_THAT(CheckJobPaths(InitFrom(dir.File("missing")), common::DataRoots()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(dir.File("missing"))));
}

// Without --data-root, jobs read the coordinator's working folder and its state dir,
// nothing else; a refusal names the field and how to allow the file.
TEST(JobPathsTest, WithoutDataRootJobsReadTheWorkingFolderAndTheStateDir) {
  TempDir work, state_parent, elsewhere;
  const fs::path before = fs::current_path();
  fs::current_path(work.path());
  const std::string state = state_parent.File("state");  // created by JobDataRoots
  absl::StatusOr<common::DataRoots> roots = JobDataRoots({}, state);
  fs::current_path(before);
  ASSERT_THAT(roots, IsOk());
  EXPECT_TRUE(fs::is_directory(state));
  EXPECT_FALSE(roots->allows_everything());

  pipetrain::v1::JobSpec spec;
  WriteFileOrDie(work.File("corpus.txt"), "text");
  spec.mutable_data()->set_corpus(work.File("corpus.txt"));
  EXPECT_THAT(CheckJobPaths(spec, *roots), IsOk());
  WriteFileOrDie(state + "/corpus.txt", "text");
  spec.mutable_data()->set_corpus(state + "/corpus.txt");
  EXPECT_THAT(CheckJobPaths(spec, *roots), IsOk());
  WriteFileOrDie(elsewhere.File("corpus.txt"), "text");
  spec.mutable_data()->set_corpus(elsewhere.File("corpus.txt"));
  EXPECT_THAT(CheckJobPaths(spec, *roots),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("data.corpus " + elsewhere.File("corpus.txt")),
                             HasSubstr("started without --data-root"),
                             HasSubstr("--data-root / allows any file"))));
  spec.mutable_data()->set_corpus("/etc/passwd");
  EXPECT_THAT(CheckJobPaths(spec, *roots),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data.corpus /etc/passwd")));
}

TEST(JobPathsTest, DataRootFlagsReplaceTheWorkingFolderAndSlashAllowsEverything) {
  TempDir root, state_parent;
  const std::string state = state_parent.File("state");
  absl::StatusOr<common::DataRoots> roots = JobDataRoots({root.path()}, state);
  ASSERT_THAT(roots, IsOk());
  pipetrain::v1::JobSpec spec;
  WriteFileOrDie(state_parent.File("corpus.txt"), "text");
  spec.mutable_data()->set_corpus(state_parent.File("corpus.txt"));
  EXPECT_THAT(CheckJobPaths(spec, *roots),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("outside the coordinator's --data-root folders")));
  // The state dir's checkpoints, which `pipetrain resume` names, stay readable.
  EXPECT_THAT(roots->Check(state + "/checkpoints/job-1/step-2", "init_from"), IsOk());

  absl::StatusOr<common::DataRoots> everything = JobDataRoots({"/"}, state);
  ASSERT_THAT(everything, IsOk());
  EXPECT_TRUE(everything->allows_everything());
  EXPECT_THAT(CheckJobPaths(spec, *everything), IsOk());
  EXPECT_THAT(JobDataRoots({root.File("missing")}, state),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--data-root")));
}

}  // namespace
}  // namespace pipetrain::coordinator
