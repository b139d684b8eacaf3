#include "common/model/checkpoint_folder.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

model::GptConfig Tiny() {
  return {.vocab_size = 256, .seq_len = 8, .d_model = 16, .n_heads = 2, .n_layers = 3};
}

// A whole-model checkpoint with random weights and optimizer state.
model::Checkpoint Whole() {
  model::Checkpoint c;
  c.config = Tiny();
  c.layer_begin = 0;
  c.layer_end = c.config.n_layers + 2;
  c.optimizer.emplace().step = 7;
  uint32_t x = 1;
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

TEST(CheckpointFilesTest, FolderOfSlicesLoadsBackAsTheWholeModel) {
  testing::TempDir dir;
  const model::Checkpoint whole = Whole();
  // Three stages: [0, 2), [2, 4), [4, 5).
  std::vector<ChunkFile> files;
  const std::pair<int, int> ranges[] = {{0, 2}, {2, 4}, {4, 5}};
  for (int s = 0; s < 3; ++s) {
    auto part = SliceCheckpoint(whole, ranges[s].first, ranges[s].second);
    ASSERT_THAT(part.status(), IsOk());
    auto bytes = model::SerializeCheckpoint(*part);
    ASSERT_THAT(bytes.status(), IsOk());
    files.push_back({s, 0, *bytes});
  }
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

}  // namespace
}  // namespace pipetrain::model
