#include "common/model/gpt_config.h"

#include <limits>
#include <optional>

#include "common/model/gpt2_family.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

GptConfig Tiny() { return {256, 16, 32, 4, 3}; }

TEST(GptConfigTest, ValidatesWithFieldNames) {
  EXPECT_THAT(ValidateConfig(Tiny()), IsOk());
  GptConfig c = Tiny();
  c.n_heads = 5;
  EXPECT_THAT(ValidateConfig(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("model.n_heads (5) must divide model.d_model (32)")));
  c = Tiny();
  c.seq_len = 0;
  EXPECT_THAT(ValidateConfig(c), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.seq_len")));
  auto back = ConfigFromProto(ConfigToProto(Tiny()));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, Tiny());
}

// Shapes whose sizes overflow are refused by the field that made them overflow, not by a
// wrapped negative figure blamed on another field (issue 18).
TEST(GptConfigTest, SizesThatOverflowNameTheirField) {
  GptConfig c = Tiny();
  c.n_layers = std::numeric_limits<int>::max();  // n_layers + 2 would wrap negative
  EXPECT_THAT(ValidateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.n_layers must be <=")));
  c = Tiny();
  c.d_model = 1 << 30;  // 4 x d_model wraps int
  c.n_heads = 1;
  EXPECT_THAT(ValidateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.d_model must be <=")));
  c = Tiny();
  c.d_model = 1 << 28;  // 12 d_model^2 x n_layers is past 2^63 with 1000 blocks
  c.n_heads = 1;
  c.n_layers = 1000;
  EXPECT_THAT(ValidateConfig(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("model.n_layers x block parameters")));
  c = Tiny();
  c.d_model = 1 << 24;  // the count fits, 16 bytes per parameter does not
  c.n_heads = 1;
  c.n_layers = 300;
  EXPECT_THAT(ValidateConfig(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("training state bytes")));
}

// A config names its family; one that names none there is is refused by name.
TEST(GptConfigTest, AConfigOfAnUnknownFamilyIsRefused) {
  EXPECT_EQ(Tiny().family, "gpt2");
  GptConfig c = Tiny();
  c.family = "llama";
  EXPECT_THAT(ValidateConfig(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.family 'llama' is not a model family (accepted: gpt2)")));
}

TEST(GptConfigTest, LayersAndNames) {
  const GptConfig c = Tiny();
  EXPECT_EQ(c.num_pipeline_layers(), 5);
  EXPECT_EQ(KindOfLayer(c, 0), LayerKind::kEmbedding);
  EXPECT_EQ(KindOfLayer(c, 3), LayerKind::kBlock);
  EXPECT_EQ(KindOfLayer(c, 4), LayerKind::kHead);
  EXPECT_EQ(LayerName(c, 1), "block 0");
  auto block = LayerParams(c, 2);
  ASSERT_EQ(block.size(), 12u);
  EXPECT_EQ(block[2].name, "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(block[2].shape, (std::vector<int64_t>{32, 96}));
  EXPECT_TRUE(block[2].is_matrix);
  EXPECT_FALSE(block[3].is_matrix);
  EXPECT_EQ(LayerParams(c, 4)[2].name, "lm_head.weight");
  EXPECT_EQ(LayerParams(c, 4)[2].shape, (std::vector<int64_t>{256, 32}));
  EXPECT_EQ(RangeParams(c, 0, 5).size(), 2u + 3 * 12 + 3);
}

// A tied lm_head copy is left out of a checkpoint exactly when wte is in the range too.
TEST(GptConfigTest, CheckpointParamsLeaveOutATiedCopyWhoseOriginalIsThere) {
  GptConfig c = Tiny();
  c.tie_embeddings = true;
  auto has_head = [](const std::vector<ParamSpec>& specs) {
    for (const ParamSpec& p : specs) {
      if (p.name == kOutputHeadName) return true;
    }
    return false;
  };
  EXPECT_FALSE(has_head(CheckpointParams(c, 0, 5)));
  EXPECT_EQ(CheckpointParams(c, 0, 5).size(), RangeParams(c, 0, 5).size() - 1);
  EXPECT_TRUE(has_head(CheckpointParams(c, 4, 5)));  // a head-only stage keeps its copy
  EXPECT_TRUE(has_head(CheckpointParams(c, 1, 5)));
  c.tie_embeddings = false;
  EXPECT_TRUE(has_head(CheckpointParams(c, 0, 5)));
}

TEST(GptConfigTest, TiedParamsNameTheEmbeddingAndTheHeadsCopy) {
  GptConfig c = Tiny();
  EXPECT_FALSE(TiedParamsOf(c).has_value());
  c.tie_embeddings = true;
  const std::optional<TiedParams> tied = TiedParamsOf(c);
  ASSERT_TRUE(tied.has_value());
  EXPECT_EQ(tied->embedding, kTokenEmbeddingName);
  EXPECT_EQ(tied->head, kOutputHeadName);
}

TEST(GptConfigTest, ParameterCountsMatchGpt2Formulas) {
  const GptConfig c = Tiny();
  const int64_t C = 32, V = 256, T = 16;
  EXPECT_EQ(CostOfLayer(c, 0).params, V * C + T * C);
  EXPECT_EQ(CostOfLayer(c, 1).params, 12 * C * C + 13 * C);
  EXPECT_EQ(CostOfLayer(c, 4).params, 2 * C + V * C);
  // The head keeps x, ln_f out, mean, rstd, the probabilities and the int32 target.
  EXPECT_EQ(CostOfLayer(c, 4).activation_bytes, (2 * C + 2 + V + 1) * 4);
  // GPT-2 small (124M with a tied head): blocks + embeddings + an untied head.
  const GptConfig gpt2{50257, 1024, 768, 12, 12};
  int64_t total = 0;
  for (int l = 0; l < gpt2.num_pipeline_layers(); ++l) total += CostOfLayer(gpt2, l).params;
  EXPECT_EQ(total, 124439808 + 50257 * 768);
}

// The closed form that checks use must count exactly the tensors a chunk builds.
TEST(GptConfigTest, ParamsOfLayerCountsLayerParams) {
  for (const GptConfig& c : {Tiny(), GptConfig{50257, 1024, 768, 12, 12},
                             GptConfig{97, 7, 24, 3, 5}}) {
    for (int l = 0; l < c.num_pipeline_layers(); ++l) {
      int64_t elements = 0;
      for (const ParamSpec& p : LayerParams(c, l)) elements += p.num_elements();
      EXPECT_EQ(ParamsOfLayer(c, l), elements) << "layer " << l << " of d_model " << c.d_model;
      EXPECT_EQ(CostOfLayer(c, l).params, elements);
    }
  }
}

}  // namespace
}  // namespace pipetrain::model

namespace pipetrain::model {
namespace {

TEST(GptConfigTest, ChunkMemoryFollowsTheModelChunk) {
  const GptConfig c = Tiny();  // C 32, H 4, T 16, V 256, 3 blocks
  const double C = 32, H = 4, T = 16;
  // Without recomputation every layer's stash and input are kept.
  ChunkMemory all = ChunkActivationBytes(c, 0, 5, false);
  double full = 0;
  for (int l = 0; l < 5; ++l) full += CostOfLayer(c, l).activation_bytes;
  EXPECT_DOUBLE_EQ(all.stored, full);
  EXPECT_DOUBLE_EQ(all.backward_extra, 0);
  EXPECT_DOUBLE_EQ(all.weight_grad, (C + 3 * (4 * C - H * T) + C) * 4);
  // Recomputing, a chunk keeps its input (and the head's targets) and rebuilds the rest.
  ChunkMemory blocks = ChunkActivationBytes(c, 1, 3, true);
  EXPECT_DOUBLE_EQ(blocks.stored, C * 4);
  EXPECT_DOUBLE_EQ(blocks.stored + blocks.backward_extra,
                   CostOfLayer(c, 1).activation_bytes + CostOfLayer(c, 2).activation_bytes);
  ChunkMemory tail = ChunkActivationBytes(c, 3, 5, true);
  EXPECT_DOUBLE_EQ(tail.stored, C * 4 + 4);
}

// The activations kept only as operands of the backward's products (each block's ln_1
// and ln_2 outputs, attention output and post-GELU values: 3C + F a token; the head's
// ln_f output: C) are kept as product copies, in the bytes of the products' dtype; every
// other figure stays fp32's, and token ids (the embedding's input, the head's targets)
// 4-byte I32.
TEST(GptConfigTest, ActivationsKeptForProductsTakeTheProductsBytes) {
  const GptConfig c = Tiny();
  const double C = 32, V = 256, F = 4 * C;
  for (int l = 1; l <= c.n_layers; ++l) {
    const LayerCost f32 = CostOfLayer(c, l), bf16 = CostOfLayer(c, l, common::DType::kBF16);
    EXPECT_DOUBLE_EQ(f32.activation_bytes - bf16.activation_bytes, (3 * C + F) * 2);
    EXPECT_DOUBLE_EQ(bf16.output_bytes, f32.output_bytes);
    EXPECT_DOUBLE_EQ(bf16.weight_grad_bytes, f32.weight_grad_bytes);
    EXPECT_DOUBLE_EQ(bf16.activation_bytes_recompute, f32.activation_bytes_recompute);
    EXPECT_EQ(bf16.forward_flops, f32.forward_flops);
  }
  EXPECT_DOUBLE_EQ(CostOfLayer(c, 0, common::DType::kBF16).activation_bytes, 4);
  EXPECT_DOUBLE_EQ(CostOfLayer(c, 4).activation_bytes, (2 * C + 2 + V) * 4 + 4);
  EXPECT_DOUBLE_EQ(CostOfLayer(c, 4, common::DType::kBF16).activation_bytes,
                   (C + 2 + V) * 4 + C * 2 + 4);
  // Recomputing, a chunk keeps its fp32 input and the targets in either precision.
  EXPECT_DOUBLE_EQ(ChunkActivationBytes(c, 3, 5, true, common::DType::kBF16).stored, C * 4 + 4);
}

}  // namespace
}  // namespace pipetrain::model
