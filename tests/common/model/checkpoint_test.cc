#include "common/model/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint_folder.h"
#include "common/safetensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/param_maps.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::common::DType;
using ::pipetrain::common::SafetensorsView;
using ::pipetrain::common::Tensor;
using ::pipetrain::testing::IdenticalParams;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::ListFolder;
using ::pipetrain::testing::ReadFileOrDie;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TransformerConfig Tiny() { return {256, 16, 32, 4, 2}; }  // pipeline layers 0..3

Tensor RandomF32(const std::vector<int64_t>& shape, std::mt19937& rng) {
  auto t = Tensor::Create(DType::kF32, shape);
  EXPECT_THAT(t, IsOk());
  std::normal_distribution<float> normal;
  for (float& v : t->data<float>()) v = normal(rng);
  return *std::move(t);
}

ParamMap RandomParams(const TransformerConfig& c, int begin, int end, std::mt19937& rng) {
  ParamMap params;
  for (const ParamSpec& p : CheckpointParams(c, begin, end)) params.emplace(p.name, RandomF32(p.shape, rng));
  return params;
}

Checkpoint RandomCheckpoint(const TransformerConfig& c, int begin, int end, bool with_optimizer,
                            uint32_t seed = 1) {
  std::mt19937 rng(seed);
  Checkpoint ckpt{c, begin, end, RandomParams(c, begin, end, rng), std::nullopt};
  if (with_optimizer) {
    ckpt.optimizer = AdamWState{RandomParams(c, begin, end, rng),
                                RandomParams(c, begin, end, rng), 42};
  }
  return ckpt;
}

void ExpectSameCheckpoint(const Checkpoint& got, const Checkpoint& want) {
  EXPECT_EQ(got.config, want.config);
  EXPECT_EQ(got.layer_begin, want.layer_begin);
  EXPECT_EQ(got.layer_end, want.layer_end);
  EXPECT_EQ(got.precision, want.precision);
  EXPECT_TRUE(IdenticalParams(got.params, want.params));
  ASSERT_EQ(got.optimizer.has_value(), want.optimizer.has_value());
  if (want.optimizer) {
    EXPECT_EQ(got.optimizer->step, want.optimizer->step);
    EXPECT_TRUE(IdenticalParams(got.optimizer->m, want.optimizer->m));
    EXPECT_TRUE(IdenticalParams(got.optimizer->v, want.optimizer->v));
  }
}

// Writes a safetensors file holding the checkpoint's tensors after `edit` has had its
// way with them, under the checkpoint's own metadata, bypassing SaveCheckpoint's checks.
template <typename Edit>
std::string WriteEdited(const TempDir& dir, const Checkpoint& ckpt, Edit edit) {
  std::vector<common::NamedTensor> tensors;
  for (const auto& [name, t] : ckpt.params) tensors.push_back({name, t.Clone()});
  edit(tensors);
  std::vector<SafetensorsView> views;
  for (const common::NamedTensor& t : tensors) views.push_back(common::ViewOf(t.name, t.tensor));
  const std::string path = dir.File("edited.safetensors");
  EXPECT_THAT(common::WriteSafetensorsFile(path, views, CheckpointMetadata(ckpt)), IsOk());
  return path;
}

TEST(CheckpointTest, SaveLoadRoundTripForEveryLayerRange) {
  TempDir dir;
  const TransformerConfig c = Tiny();
  for (int begin = 0; begin < c.num_pipeline_layers(); ++begin) {
    for (int end = begin + 1; end <= c.num_pipeline_layers(); ++end) {
      SCOPED_TRACE(absl::StrCat("layers [", begin, ", ", end, ")"));
      const Checkpoint ckpt = RandomCheckpoint(c, begin, end, false, 10 * begin + end);
      const std::string path = dir.File(absl::StrCat("stage_", begin, "_", end, ".safetensors"));
      ASSERT_THAT(SaveCheckpoint(path, ckpt), IsOk());
      auto back = LoadCheckpoint(path);
      ASSERT_THAT(back, IsOk());
      ExpectSameCheckpoint(*back, ckpt);
      EXPECT_EQ(back->params.size(), RangeParams(c, begin, end).size());

      auto info = ReadCheckpointInfo(path);
      ASSERT_THAT(info, IsOk());
      EXPECT_EQ(info->config, c);
      EXPECT_EQ(info->layer_begin, begin);
      EXPECT_EQ(info->layer_end, end);
      EXPECT_FALSE(info->has_optimizer);
      int64_t bytes = 0;
      for (const ParamSpec& p : RangeParams(c, begin, end)) bytes += 4 * p.num_elements();
      EXPECT_EQ(info->tensor_bytes, static_cast<uint64_t>(bytes));
    }
  }
}

TEST(CheckpointTest, FileCarriesConfigAndNamesInHuggingFaceForm) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  ASSERT_THAT(SaveCheckpoint(path, RandomCheckpoint(Tiny(), 0, 4, false)), IsOk());
  auto raw = common::ReadSafetensorsFile(path);
  ASSERT_THAT(raw, IsOk());
  EXPECT_EQ(raw->metadata, (common::SafetensorsMetadata{
                               {"format", "pt"}, {"pipetrain_format", "1"},
                               {"vocab_size", "256"}, {"seq_len", "16"}, {"d_model", "32"},
                               {"n_heads", "4"}, {"n_layers", "2"}, {"pipetrain_layers", "0:4"},
                               {"pipetrain_precision", "fp32"}}));
  // File order is RangeParams order: embedding, blocks, head.
  const std::vector<ParamSpec> specs = RangeParams(Tiny(), 0, 4);
  ASSERT_EQ(raw->tensors.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(raw->tensors[i].name, specs[i].name);
    EXPECT_EQ(raw->tensors[i].tensor.shape(), specs[i].shape);
  }
  EXPECT_EQ(raw->tensors.front().name, "transformer.wte.weight");
  EXPECT_EQ(raw->tensors[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(raw->tensors[4].tensor.shape(), (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(raw->tensors.back().name, "lm_head.weight");
  auto info = ReadCheckpointInfo(path);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->config, Tiny());
}

TEST(CheckpointTest, OptimizerStateRoundTripsUnderItsPrefixes) {
  const Checkpoint ckpt = RandomCheckpoint(Tiny(), 1, 3, true, 7);
  auto bytes = SerializeCheckpoint(ckpt);
  ASSERT_THAT(bytes, IsOk());
  auto back = ParseCheckpoint(*bytes, "stage1");
  ASSERT_THAT(back, IsOk());
  ExpectSameCheckpoint(*back, ckpt);

  auto raw = common::ParseSafetensors(*bytes);
  ASSERT_THAT(raw, IsOk());
  EXPECT_EQ(raw->metadata.at("pipetrain_optimizer_step"), "42");
  const size_t n = RangeParams(Tiny(), 1, 3).size();
  ASSERT_EQ(raw->tensors.size(), 3 * n);
  EXPECT_EQ(raw->tensors[0].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(raw->tensors[n].name, "optimizer.m.transformer.h.0.ln_1.weight");
  EXPECT_EQ(raw->tensors[2 * n].name, "optimizer.v.transformer.h.0.ln_1.weight");

  TempDir dir;
  const std::string path = dir.File("with_optimizer.safetensors");
  ASSERT_THAT(SaveCheckpoint(path, ckpt), IsOk());
  auto info = ReadCheckpointInfo(path);
  ASSERT_THAT(info, IsOk());
  EXPECT_TRUE(info->has_optimizer);
  EXPECT_EQ(info->optimizer_step, 42);

  // Incomplete optimizer state is refused at save time.
  Checkpoint partial = RandomCheckpoint(Tiny(), 1, 3, true, 7);
  partial.optimizer->v.erase("transformer.h.1.mlp.c_fc.bias");
  EXPECT_THAT(SaveCheckpoint(path, partial),
              StatusIs(kInvalid, HasSubstr("missing 1 tensor(s): "
                                           "optimizer.v.transformer.h.1.mlp.c_fc.bias")));
}

TEST(CheckpointTest, MergedStageFilesEqualTheWholeModelFile) {
  TempDir dir;
  const TransformerConfig c = Tiny();
  const Checkpoint whole = RandomCheckpoint(c, 0, 4, true, 99);
  ASSERT_THAT(SaveCheckpoint(dir.File("whole.safetensors"), whole), IsOk());
  // Cut the whole model into stages [0,1) [1,3) [3,4), save each, merge given out of order.
  std::vector<std::string> stage_files;
  for (auto [begin, end] : {std::pair{3, 4}, std::pair{0, 1}, std::pair{1, 3}}) {
    Checkpoint part{c, begin, end, {}, AdamWState{{}, {}, whole.optimizer->step}};
    for (const ParamSpec& p : RangeParams(c, begin, end)) {
      part.params.emplace(p.name, whole.params.at(p.name).Clone());
      part.optimizer->m.emplace(p.name, whole.optimizer->m.at(p.name).Clone());
      part.optimizer->v.emplace(p.name, whole.optimizer->v.at(p.name).Clone());
    }
    stage_files.push_back(dir.File(absl::StrCat("stage_", begin, ".safetensors")));
    ASSERT_THAT(SaveCheckpoint(stage_files.back(), part), IsOk());
  }
  // The stages' files, read back and merged, saved as one file.
  std::vector<Checkpoint> parts;
  for (const std::string& file : stage_files) {
    auto part = LoadCheckpoint(file);
    ASSERT_THAT(part, IsOk());
    parts.push_back(*std::move(part));
  }
  auto joined = MergeCheckpoints(std::move(parts));
  ASSERT_THAT(joined, IsOk());
  ASSERT_THAT(SaveCheckpoint(dir.File("merged.safetensors"), *joined), IsOk());
  // Byte for byte: same tensors, same order, same metadata.
  EXPECT_EQ(ReadFileOrDie(dir.File("merged.safetensors")),
            ReadFileOrDie(dir.File("whole.safetensors")));
  auto merged = LoadCheckpoint(dir.File("merged.safetensors"));
  ASSERT_THAT(merged, IsOk());
  ExpectSameCheckpoint(*merged, whole);
}

// Tied embeddings: a whole-model file holds wte once (as Hugging Face's do); a
// head-only stage file keeps its lm_head copy, which merging checks against wte and
// drops; slicing gives the head its copy back from wte.
TEST(CheckpointTest, TiedCopiesAreStoredOnceAndCheckedWhenMerged) {
  TransformerConfig c = Tiny();
  c.tie_embeddings = true;
  auto names = [](const std::vector<ParamSpec>& specs) {
    std::vector<std::string> out;
    for (const ParamSpec& p : specs) out.push_back(p.name);
    return out;
  };
  EXPECT_THAT(names(CheckpointParams(c, 0, 4)), Not(::testing::Contains("lm_head.weight")));
  EXPECT_THAT(names(CheckpointParams(c, 3, 4)), ::testing::Contains("lm_head.weight"));
  EXPECT_THAT(names(CheckpointParams(Tiny(), 0, 4)), ::testing::Contains("lm_head.weight"));

  Checkpoint whole = RandomCheckpoint(c, 0, 4, /*with_optimizer=*/true);
  EXPECT_FALSE(whole.params.count("lm_head.weight"));
  auto head = SliceCheckpoint(whole, 3, 4);
  ASSERT_THAT(head, IsOk());
  ASSERT_TRUE(head->params.count("lm_head.weight"));
  EXPECT_EQ(0, std::memcmp(head->params.at("lm_head.weight").bytes().data(),
                           whole.params.at("transformer.wte.weight").bytes().data(),
                           whole.params.at("transformer.wte.weight").num_bytes()));
  auto body = SliceCheckpoint(whole, 0, 3);
  ASSERT_THAT(body, IsOk());
  TempDir dir;
  ASSERT_THAT(SaveCheckpoint(dir.File("head.safetensors"), *head), IsOk());
  auto reloaded = LoadCheckpoint(dir.File("head.safetensors"));
  ASSERT_THAT(reloaded, IsOk());
  EXPECT_TRUE(reloaded->config.tie_embeddings);
  std::vector<Checkpoint> parts;
  parts.push_back(*std::move(body));
  parts.push_back(*std::move(reloaded));
  auto merged = MergeCheckpoints(std::move(parts));
  ASSERT_THAT(merged, IsOk());
  ExpectSameCheckpoint(*merged, whole);

  // A copy that drifted from wte is refused, naming both.
  auto drifted = SliceCheckpoint(whole, 3, 4);
  drifted->params.at("lm_head.weight").data<float>()[5] += 1.0f;
  std::vector<Checkpoint> bad;
  bad.push_back(*SliceCheckpoint(whole, 0, 3));
  bad.push_back(*std::move(drifted));
  EXPECT_THAT(MergeCheckpoints(std::move(bad)),
              StatusIs(kInvalid, AllOf(HasSubstr("lm_head.weight"),
                                       HasSubstr("transformer.wte.weight"))));
  // Tied and untied files of one shape do not mix.
  std::vector<Checkpoint> mixed;
  mixed.push_back(*SliceCheckpoint(whole, 0, 3));
  mixed.push_back(RandomCheckpoint(Tiny(), 3, 4, true));
  EXPECT_THAT(MergeCheckpoints(std::move(mixed)),
              StatusIs(kInvalid, HasSubstr("model.tie_embeddings")));
}

TEST(CheckpointTest, MergeRejectsGapsOverlapsAndDisagreement) {
  const TransformerConfig c = Tiny();
  auto parts = [&](std::vector<Checkpoint> v) { return MergeCheckpoints(std::move(v)); };
  EXPECT_THAT(parts({}), StatusIs(kInvalid, HasSubstr("no checkpoints")));
  {
    std::vector<Checkpoint> v;
    v.push_back(RandomCheckpoint(c, 0, 1, false));
    v.push_back(RandomCheckpoint(c, 2, 4, false));
    EXPECT_THAT(parts(std::move(v)),
                StatusIs(kInvalid, HasSubstr("part with layers [2, 4) leaves a gap after layers [0, 1)")));
  }
  {
    std::vector<Checkpoint> v;
    v.push_back(RandomCheckpoint(c, 0, 2, false));
    v.push_back(RandomCheckpoint(c, 1, 4, false));
    EXPECT_THAT(parts(std::move(v)),
                StatusIs(kInvalid, HasSubstr("part with layers [1, 4) overlaps layers [0, 2)")));
  }
  {
    TransformerConfig other = c;
    other.seq_len = 32;
    std::vector<Checkpoint> v;
    v.push_back(RandomCheckpoint(c, 0, 2, false));
    v.push_back(RandomCheckpoint(other, 2, 4, false));
    EXPECT_THAT(parts(std::move(v)),
                StatusIs(kInvalid, HasSubstr("model.seq_len is 32 in the checkpoint but 16")));
  }
  {
    std::vector<Checkpoint> v;
    v.push_back(RandomCheckpoint(c, 0, 2, true));
    v.push_back(RandomCheckpoint(c, 2, 4, false));
    EXPECT_THAT(parts(std::move(v)), StatusIs(kInvalid, HasSubstr("optimizer state")));
  }
  {
    std::vector<Checkpoint> v;
    v.push_back(RandomCheckpoint(c, 0, 2, false));
    v.push_back(RandomCheckpoint(c, 2, 4, false));
    v[1].precision = "bf16";
    EXPECT_THAT(parts(std::move(v)),
                StatusIs(kInvalid, HasSubstr("part with layers [2, 4) was trained in bf16, the "
                                             "part with layers [0, 2) in fp32")));
  }
  {
    // A partial merge is fine when contiguous: [1, 3) from [1, 2) and [2, 3).
    std::vector<Checkpoint> v;
    v.push_back(RandomCheckpoint(c, 2, 3, false));
    v.push_back(RandomCheckpoint(c, 1, 2, false));
    auto merged = parts(std::move(v));
    ASSERT_THAT(merged, IsOk());
    EXPECT_EQ(merged->layer_begin, 1);
    EXPECT_EQ(merged->layer_end, 3);
    EXPECT_EQ(merged->params.size(), 24u);
  }
}

TEST(CheckpointTest, LoaderNamesMissingExtraAndMisShapedTensors) {
  TempDir dir;
  const Checkpoint ckpt = RandomCheckpoint(Tiny(), 1, 2, false);
  std::mt19937 rng(3);

  std::string path = WriteEdited(dir, ckpt, [](auto& tensors) {
    std::erase_if(tensors, [](const auto& t) { return t.name == "transformer.h.0.attn.c_proj.bias"; });
  });
  EXPECT_THAT(LoadCheckpoint(path),
              StatusIs(kInvalid, AllOf(HasSubstr(path + ": checkpoint of pipeline layers [1, 2)"),
                                       HasSubstr("missing 1 tensor(s): transformer.h.0.attn.c_proj.bias"))));

  path = WriteEdited(dir, ckpt, [&](auto& tensors) {
    tensors.push_back({"transformer.h.5.ln_1.weight", RandomF32({32}, rng)});
  });
  EXPECT_THAT(LoadCheckpoint(path),
              StatusIs(kInvalid, HasSubstr("1 unexpected tensor(s): transformer.h.5.ln_1.weight")));

  path = WriteEdited(dir, ckpt, [&](auto& tensors) {
    for (auto& t : tensors) {
      if (t.name == "transformer.h.0.mlp.c_fc.weight") t.tensor = RandomF32({128, 32}, rng);
    }
  });
  EXPECT_THAT(LoadCheckpoint(path),
              StatusIs(kInvalid, HasSubstr("transformer.h.0.mlp.c_fc.weight has shape (128, 32), "
                                           "want (32, 128)")));

  path = WriteEdited(dir, ckpt, [&](auto& tensors) {
    for (auto& t : tensors) {
      if (t.name == "transformer.h.0.ln_2.bias") t.tensor = *Tensor::Create(DType::kF16, {32});
    }
  });
  EXPECT_THAT(LoadCheckpoint(path),
              StatusIs(kInvalid, HasSubstr("transformer.h.0.ln_2.bias has dtype F16, want F32")));

  // Every problem at once, and long lists are summarised.
  path = WriteEdited(dir, ckpt, [&](auto& tensors) {
    tensors.erase(tensors.begin(), tensors.begin() + 10);
    tensors.push_back({"stray", RandomF32({1}, rng)});
  });
  EXPECT_THAT(LoadCheckpoint(path),
              StatusIs(kInvalid, AllOf(HasSubstr("missing 10 tensor(s): "), HasSubstr(" and 2 more"),
                                       HasSubstr("; 1 unexpected tensor(s): stray"))));

  // Optimizer tensors in a file that declares no optimizer state are extras.
  path = WriteEdited(dir, ckpt, [&](auto& tensors) {
    tensors.push_back({"optimizer.m.transformer.h.0.ln_1.bias", RandomF32({32}, rng)});
  });
  EXPECT_THAT(LoadCheckpoint(path),
              StatusIs(kInvalid, HasSubstr("unexpected tensor(s): optimizer.m.transformer.h.0.ln_1.bias")));
}

TEST(CheckpointTest, SaveRefusesAnInvalidCheckpointAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.File("bad.safetensors");
  Checkpoint ckpt = RandomCheckpoint(Tiny(), 0, 1, false);
  ckpt.params.erase("transformer.wpe.weight");
  EXPECT_THAT(SaveCheckpoint(path, ckpt),
              StatusIs(kInvalid, AllOf(HasSubstr(path), HasSubstr("transformer.wpe.weight"))));
  ckpt = RandomCheckpoint(Tiny(), 0, 1, false);
  ckpt.layer_end = 9;
  EXPECT_THAT(SaveCheckpoint(path, ckpt),
              StatusIs(kInvalid, HasSubstr("pipeline layers [0, 9) are not a range within [0, 4)")));
  ckpt.layer_end = 1;
  ckpt.config.n_heads = 5;
  EXPECT_THAT(SaveCheckpoint(path, ckpt), StatusIs(kInvalid, HasSubstr("model.n_heads")));
  ckpt.config.n_heads = 4;
  for (const std::string bad : {"", "fp16"}) {
    ckpt.precision = bad;
    EXPECT_THAT(SaveCheckpoint(path, ckpt),
                StatusIs(kInvalid, HasSubstr(absl::StrCat(
                                       path, ": precision is \"", bad,
                                       "\", not a precision (accepted: fp32, bf16)"))));
  }
  EXPECT_TRUE(ListFolder(dir.path()).empty());
  EXPECT_THAT(ValidateParams(Tiny(), 3, 4, RandomCheckpoint(Tiny(), 3, 4, false).params, "head"),
              IsOk());
}

TEST(CheckpointTest, LoaderValidatesTheMetadata) {
  TempDir dir;
  const Checkpoint ckpt = RandomCheckpoint(Tiny(), 3, 4, false);
  auto write_with = [&](common::SafetensorsMetadata metadata) {
    std::vector<SafetensorsView> views;
    for (const auto& [name, t] : ckpt.params) views.push_back(common::ViewOf(name, t));
    const std::string path = dir.File("meta.safetensors");
    EXPECT_THAT(common::WriteSafetensorsFile(path, views, metadata), IsOk());
    return path;
  };
  common::SafetensorsMetadata good = CheckpointMetadata(ckpt);
  ASSERT_THAT(LoadCheckpoint(write_with(good)), IsOk());

  auto edited = [&](const std::string& key, std::optional<std::string> value) {
    common::SafetensorsMetadata m = good;
    if (value) {
      m[key] = *value;
    } else {
      m.erase(key);
    }
    return write_with(m);
  };
  EXPECT_THAT(LoadCheckpoint(edited("n_layers", std::nullopt)),
              StatusIs(kInvalid, HasSubstr("__metadata__ has no 'n_layers'")));
  EXPECT_THAT(LoadCheckpoint(edited("d_model", "thirty-two")),
              StatusIs(kInvalid, HasSubstr("'d_model' is \"thirty-two\", not an integer")));
  EXPECT_THAT(LoadCheckpoint(edited("n_heads", "3")),
              StatusIs(kInvalid, HasSubstr("model.n_heads (3) must divide model.d_model (32)")));
  EXPECT_THAT(LoadCheckpoint(edited("pipetrain_layers", "3-4")),
              StatusIs(kInvalid, HasSubstr("'pipetrain_layers' is \"3-4\", not \"begin:end\"")));
  EXPECT_THAT(LoadCheckpoint(edited("pipetrain_layers", "3:7")),
              StatusIs(kInvalid, HasSubstr("[3, 7) are not a range")));
  EXPECT_THAT(LoadCheckpoint(edited("pipetrain_format", "2")),
              StatusIs(kInvalid, HasSubstr("format version 2 is not supported")));
  // A file without pipetrain_precision (every one written before it) was trained in
  // fp32; one that names no precision of the table is refused, naming file and key.
  auto unmarked = LoadCheckpoint(edited("pipetrain_precision", std::nullopt));
  ASSERT_THAT(unmarked, IsOk());
  EXPECT_EQ(unmarked->precision, "fp32");
  const std::string fp16 = edited("pipetrain_precision", "fp16");
  const std::string message = absl::StrCat(
      fp16, ": __metadata__ 'pipetrain_precision' is \"fp16\", not a precision (accepted: "
      "fp32, bf16)");
  EXPECT_THAT(LoadCheckpoint(fp16), StatusIs(kInvalid, HasSubstr(message)));
  EXPECT_THAT(ReadCheckpointInfo(fp16), StatusIs(kInvalid, HasSubstr(message)));
  // Without pipetrain_layers the file must hold the whole model.
  EXPECT_THAT(LoadCheckpoint(edited("pipetrain_layers", std::nullopt)),
              StatusIs(kInvalid, HasSubstr("checkpoint of pipeline layers [0, 4): missing 26")));
}

// The precision a checkpoint was trained in goes to the file and comes back, from the
// file, its header and a slice of it.
TEST(CheckpointTest, ThePrecisionRoundTrips) {
  TempDir dir;
  for (const std::string precision : {"fp32", "bf16"}) {
    Checkpoint ckpt = RandomCheckpoint(Tiny(), 0, 4, true);
    ckpt.precision = precision;
    const std::string path = dir.File(precision + ".safetensors");
    ASSERT_THAT(SaveCheckpoint(path, ckpt), IsOk());
    auto back = LoadCheckpoint(path);
    ASSERT_THAT(back, IsOk());
    ExpectSameCheckpoint(*back, ckpt);
    auto info = ReadCheckpointInfo(path);
    ASSERT_THAT(info, IsOk());
    EXPECT_EQ(info->precision, precision);
    auto share = SliceCheckpoint(*back, 1, 3);
    ASSERT_THAT(share, IsOk());
    EXPECT_EQ(share->precision, precision);
  }
}

// What the coordinator does to a stage's export: the precision is replaced in the
// header, every tensor and every other metadata key stay as they were.
TEST(CheckpointTest, WithPrecisionRewritesOnlyThePrecision) {
  const Checkpoint fp32 = RandomCheckpoint(Tiny(), 1, 3, true, 9);
  auto bytes = SerializeCheckpoint(fp32);
  ASSERT_THAT(bytes, IsOk());
  auto same = WithPrecision(*bytes, "fp32", "chunk 0");
  ASSERT_THAT(same, IsOk());
  EXPECT_EQ(*same, *bytes);

  auto stamped = WithPrecision(*bytes, "bf16", "chunk 0");
  ASSERT_THAT(stamped, IsOk());
  Checkpoint bf16 = RandomCheckpoint(Tiny(), 1, 3, true, 9);
  bf16.precision = "bf16";
  auto back = ParseCheckpoint(*stamped, "stamped");
  ASSERT_THAT(back, IsOk());
  ExpectSameCheckpoint(*back, bf16);
  auto want = SerializeCheckpoint(bf16);
  ASSERT_THAT(want, IsOk());
  EXPECT_EQ(*stamped, *want);  // as if the stage had written it so

  EXPECT_THAT(WithPrecision(*bytes, "fp8", "chunk 0"),
              StatusIs(kInvalid, HasSubstr("chunk 0: precision is \"fp8\", not a precision")));
  EXPECT_THAT(WithPrecision("garbage", "bf16", "chunk 1"),
              StatusIs(kInvalid, HasSubstr("chunk 1: truncated")));
  auto raw = common::ParseSafetensors(*bytes);
  ASSERT_THAT(raw, IsOk());
  raw->metadata["pipetrain_precision"] = "fp64";
  std::vector<SafetensorsView> views;
  for (const common::NamedTensor& t : raw->tensors) views.push_back(common::ViewOf(t.name, t.tensor));
  auto unknown = common::SerializeSafetensors(views, raw->metadata);
  ASSERT_THAT(unknown, IsOk());
  EXPECT_THAT(WithPrecision(*unknown, "bf16", "chunk 2"),
              StatusIs(kInvalid, HasSubstr("chunk 2: __metadata__ 'pipetrain_precision' is "
                                           "\"fp64\"")));
}

// A stage's share of a whole-model file: what init_from hands each stage.
TEST(CheckpointTest, ASliceOfAWholeModelFileIsAStageShare) {
  TempDir dir;
  const TransformerConfig c = Tiny();
  const Checkpoint whole = RandomCheckpoint(c, 0, 4, true, 5);
  const std::string path = dir.File("whole.safetensors");
  ASSERT_THAT(SaveCheckpoint(path, whole), IsOk());
  auto loaded = LoadCheckpoint(path);
  ASSERT_THAT(loaded, IsOk());
  auto share = SliceCheckpoint(*loaded, 2, 4);
  ASSERT_THAT(share, IsOk());
  EXPECT_EQ(share->layer_begin, 2);
  EXPECT_EQ(share->layer_end, 4);
  ASSERT_EQ(share->params.size(), RangeParams(c, 2, 4).size());
  ASSERT_TRUE(share->optimizer.has_value());
  EXPECT_EQ(share->optimizer->step, 42);
  for (const ParamSpec& p : RangeParams(c, 2, 4)) {
    const Tensor& got = share->params.at(p.name);
    EXPECT_EQ(std::memcmp(got.bytes().data(), whole.params.at(p.name).bytes().data(),
                          got.num_bytes()), 0) << p.name;
    EXPECT_EQ(share->optimizer->v.at(p.name).shape(), p.shape);
  }

  auto part = LoadCheckpoint([&] {
    const std::string f = dir.File("part.safetensors");
    EXPECT_THAT(SaveCheckpoint(f, RandomCheckpoint(c, 1, 3, false)), IsOk());
    return f;
  }());
  ASSERT_THAT(part, IsOk());
  EXPECT_THAT(
      SliceCheckpoint(*part, 2, 4),
      StatusIs(kInvalid, HasSubstr("layers [2, 4) are not inside the checkpoint's [1, 3)")));
  EXPECT_THAT(SliceCheckpoint(*part, 2, 2), StatusIs(kInvalid, HasSubstr("not inside")));
}

TEST(CheckpointTest, CorruptFilesAreRejectedWithTheFileName) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  ASSERT_THAT(SaveCheckpoint(path, RandomCheckpoint(Tiny(), 0, 4, false)), IsOk());
  const std::string bytes = ReadFileOrDie(path);
  ::pipetrain::testing::WriteFileOrDie(path, bytes.substr(0, bytes.size() / 2));
  EXPECT_THAT(LoadCheckpoint(path), StatusIs(kInvalid, AllOf(HasSubstr(path), HasSubstr("outside"))));
  EXPECT_THAT(ReadCheckpointInfo(path), StatusIs(kInvalid, HasSubstr(path)));
  EXPECT_THAT(ParseCheckpoint(bytes.substr(0, 7), "stage 2"),
              StatusIs(kInvalid, HasSubstr("stage 2: truncated")));
}

TEST(CheckpointTest, IndexMapsEveryTensorToItsShard) {
  TempDir dir;
  const TransformerConfig c = Tiny();
  std::vector<std::string> shards;
  uint64_t total = 0;
  for (auto [begin, end] : {std::pair{0, 2}, std::pair{2, 4}}) {
    shards.push_back(dir.File(absl::StrCat("model-0000", begin / 2 + 1, "-of-00002.safetensors")));
    ASSERT_THAT(SaveCheckpoint(shards.back(), RandomCheckpoint(c, begin, end, false)), IsOk());
  }
  for (const ParamSpec& p : RangeParams(c, 0, 4)) total += 4 * p.num_elements();
  const std::string index_path = dir.File(kCheckpointIndexFileName);
  ASSERT_THAT(WriteCheckpointIndex(index_path, shards), IsOk());
  const nlohmann::json index = nlohmann::json::parse(ReadFileOrDie(index_path));
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  const nlohmann::json& map = index.at("weight_map");
  ASSERT_EQ(map.size(), RangeParams(c, 0, 4).size());
  EXPECT_EQ(map.at("transformer.wte.weight"), "model-00001-of-00002.safetensors");
  EXPECT_EQ(map.at("transformer.h.0.mlp.c_proj.bias"), "model-00001-of-00002.safetensors");
  EXPECT_EQ(map.at("transformer.h.1.ln_1.weight"), "model-00002-of-00002.safetensors");
  EXPECT_EQ(map.at("lm_head.weight"), "model-00002-of-00002.safetensors");
  EXPECT_THAT(ListFolder(dir.path()),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "model.safetensors.index.json"));

  EXPECT_THAT(WriteCheckpointIndex(index_path, {shards[0], shards[0]}),
              StatusIs(kInvalid, HasSubstr("tensor 'transformer.wte.weight' is in both")));
  EXPECT_THAT(WriteCheckpointIndex(index_path, {}), StatusIs(kInvalid, HasSubstr("no shard")));
}

// One rule for every index (ours and Hugging Face's): each file it names is a file of
// its folder, read back once each, in name order; an entry that climbs out of the folder,
// names a subfolder or is no file name is refused naming the index and the entry.
TEST(CheckpointTest, IndexShardFilesAreFilesOfTheIndexsFolder) {
  TempDir dir;
  const std::string index = dir.File(kCheckpointIndexFileName);
  testing::WriteFileOrDie(index, R"({"weight_map": {"a": "y.safetensors", "b": "x.safetensors",
                                                    "c": "y.safetensors"}})");
  EXPECT_THAT(IndexShardFiles(dir.path()),
              testing::IsOkAndHolds(
                  ElementsAre(dir.File("x.safetensors"), dir.File("y.safetensors"))));
  for (const std::string entry : {R"("../outside.safetensors")", R"("/etc/passwd")",
                                  R"("sub/../../x")", R"("sub/x.safetensors")", R"(".")",
                                  R"("..")", R"("")", "3", "null"}) {
    testing::WriteFileOrDie(index, R"({"weight_map": {"wte": )" + entry + "}}");
    EXPECT_THAT(IndexShardFiles(dir.path()),
                StatusIs(kInvalid, AllOf(HasSubstr(index + ": weight_map['wte'] is "),
                                         HasSubstr("not the name of a file in " + dir.path()))))
        << entry;
  }
  testing::WriteFileOrDie(index, R"({"weight_map": {}})");
  EXPECT_THAT(IndexShardFiles(dir.path()), StatusIs(kInvalid, HasSubstr("names no files")));
  testing::WriteFileOrDie(index, R"({"metadata": {}})");
  EXPECT_THAT(IndexShardFiles(dir.path()), StatusIs(kInvalid, HasSubstr("no weight_map")));
}

// The PyTorch fixture's weights are a valid checkpoint of its config, tensor for tensor.
TEST(CheckpointTest, LoadsThePyTorchFixture) {
  const std::string dir = PIPETRAIN_TESTDATA_DIR "/gpt_tiny/";
  const nlohmann::json expected = nlohmann::json::parse(ReadFileOrDie(dir + "expected.json"));
  const nlohmann::json& cj = expected.at("config");
  const TransformerConfig want{cj.at("vocab_size"), cj.at("seq_len"), cj.at("d_model"),
                               cj.at("n_heads"), cj.at("n_layers")};
  auto info = ReadCheckpointInfo(dir + "weights.safetensors");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->config, want);
  for (const char* file : {"weights.safetensors", "grads.safetensors"}) {
    auto ckpt = LoadCheckpoint(dir + file);
    ASSERT_THAT(ckpt, IsOk());
    EXPECT_EQ(ckpt->layer_begin, 0);
    EXPECT_EQ(ckpt->layer_end, want.num_pipeline_layers());
    EXPECT_FALSE(ckpt->optimizer.has_value());
    const std::vector<ParamSpec> specs = RangeParams(want, 0, want.num_pipeline_layers());
    ASSERT_EQ(ckpt->params.size(), specs.size());
    for (const ParamSpec& p : specs) EXPECT_EQ(ckpt->params.at(p.name).shape(), p.shape) << p.name;
  }
  // Weights are random everywhere, biases and LayerNorm parameters included.
  auto weights = LoadCheckpoint(dir + "weights.safetensors");
  ASSERT_THAT(weights, IsOk());
  for (const auto& [name, t] : weights->params) {
    std::span<const float> v = t.data<float>();
    EXPECT_FALSE(std::all_of(v.begin(), v.end(), [&](float x) { return x == v[0]; })) << name;
  }
  EXPECT_GT(expected.at("loss").get<double>(), 0.0);
  EXPECT_EQ(expected.at("inputs").size(), expected.at("batch").get<size_t>());
}

}  // namespace
}  // namespace pipetrain::model
