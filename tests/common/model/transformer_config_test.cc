#include "common/model/transformer_config.h"

#include <limits>
#include <optional>

#include "common/model/gpt2_family.h"
#include "common/model/llama_family.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TransformerConfig Tiny() { return {256, 16, 32, 4, 3}; }

TEST(TransformerConfigTest, ValidatesWithFieldNames) {
  EXPECT_THAT(ValidateConfig(Tiny()), IsOk());
  TransformerConfig c = Tiny();
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
// wrapped negative figure blamed on another field.
TEST(TransformerConfigTest, SizesThatOverflowNameTheirField) {
  TransformerConfig c = Tiny();
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
TEST(TransformerConfigTest, AConfigOfAnUnknownFamilyIsRefused) {
  EXPECT_EQ(Tiny().family, "gpt2");
  TransformerConfig c = Tiny();
  c.family = "mistral";
  EXPECT_THAT(ValidateConfig(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("model.architecture 'mistral' is not a model "
                                                    "family (accepted: gpt2, llama)")));
  pipetrain::v1::ModelConfig p = ConfigToProto(Tiny());
  p.set_architecture("mistral");
  EXPECT_THAT(ConfigFromProto(p), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("model.architecture 'mistral'")));
}

pipetrain::v1::ModelConfig LlamaProto() {
  pipetrain::v1::ModelConfig p = ConfigToProto(Tiny());
  p.set_architecture("llama");
  return p;
}

// A Llama config takes Llama's defaults for what it leaves out, and goes through the
// proto both ways.
TEST(TransformerConfigTest, LlamaFieldsTakeLlamasDefaults) {
  auto c = ConfigFromProto(LlamaProto());
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->family, "llama");
  EXPECT_EQ(c->n_kv_heads, 4);  // n_heads: no grouping
  EXPECT_EQ(c->ffn_dim, 256);   // 8 x 32 / 3 = 85, up to a multiple of 256
  EXPECT_EQ(c->rope_theta, 500000);
  EXPECT_EQ(c->norm_eps, 1e-5);
  EXPECT_EQ(c->rope_scaling, RopeScaling{});
  EXPECT_EQ(LlamaDefaultFfnDim(2048), 5632);  // TinyLlama's 5632
  EXPECT_EQ(LlamaDefaultFfnDim(4096), 11008);  // Llama 2 7B's 11008
  pipetrain::v1::ModelConfig p = LlamaProto();
  p.set_n_kv_heads(2);
  p.set_ffn_dim(96);
  p.set_rope_theta(10000);
  p.set_norm_eps(1e-6);
  auto* r = p.mutable_rope_scaling();
  r->set_rope_type("llama3");
  r->set_factor(8);
  r->set_low_freq_factor(1);
  r->set_high_freq_factor(4);
  r->set_original_max_position_embeddings(8192);
  auto g = ConfigFromProto(p);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->kv_heads(), 2);
  EXPECT_EQ(g->rope_scaling, (RopeScaling{8, 1, 4, 8192}));
  auto back = ConfigFromProto(ConfigToProto(*g));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, *g);
}

// A Llama field on a GPT-2 model, and Llama values the model cannot compute, are refused
// by name.
TEST(TransformerConfigTest, LlamaFieldsAreCheckedByName) {
  pipetrain::v1::ModelConfig p = ConfigToProto(Tiny());
  p.set_n_kv_heads(2);
  EXPECT_THAT(ConfigFromProto(p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.n_kv_heads is a field of model.architecture \"llama\"")));
  p = ConfigToProto(Tiny());
  p.mutable_rope_scaling();
  EXPECT_THAT(ConfigFromProto(p), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("model.rope_scaling is a field")));
  auto refused = [](auto edit, const char* what) {
    pipetrain::v1::ModelConfig q = LlamaProto();
    edit(q);
    EXPECT_THAT(ConfigFromProto(q), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(what)));
  };
  refused([](auto& q) { q.set_n_kv_heads(3); }, "model.n_kv_heads (3) must be > 0 and divide");
  refused([](auto& q) { q.set_ffn_dim(0); }, "model.ffn_dim must be > 0");
  refused([](auto& q) { q.set_rope_theta(-1); }, "model.rope_theta must be > 0");
  refused([](auto& q) { q.set_norm_eps(0); }, "model.norm_eps must be > 0");
  refused([](auto& q) { q.set_d_model(30); q.set_n_heads(6); }, "heads of an even width");
  refused([](auto& q) { q.mutable_rope_scaling()->set_rope_type("yarn"); },
          "model.rope_scaling.rope_type is \"yarn\"");
  refused(
      [](auto& q) {
        q.mutable_rope_scaling()->set_rope_type("llama3");
        q.mutable_rope_scaling()->set_factor(8);
        q.mutable_rope_scaling()->set_low_freq_factor(4);
        q.mutable_rope_scaling()->set_high_freq_factor(1);
      },
      "model.rope_scaling.high_freq_factor must be > low_freq_factor");
}

// Llama 3.2 1B's shape has its published parameter count, 1,235,814,400 (tied).
TEST(TransformerConfigTest, ParameterCountOfLlama32OneB) {
  pipetrain::v1::ModelConfig p = LlamaProto();
  p.set_vocab_size(128256);
  p.set_seq_len(2048);
  p.set_d_model(2048);
  p.set_n_layers(16);
  p.set_n_heads(32);
  p.set_n_kv_heads(8);
  p.set_ffn_dim(8192);
  p.set_tie_embeddings(true);
  auto c = ConfigFromProto(p);
  ASSERT_THAT(c, IsOk());
  int64_t total = 0, closed_form = 0;
  for (const ParamSpec& s : CheckpointParams(*c, 0, c->num_pipeline_layers())) {
    total += s.num_elements();
  }
  for (int l = 0; l < c->num_pipeline_layers(); ++l) closed_form += ParamsOfLayer(*c, l);
  // ParamsOfLayer counts the head's copy of the tied embedding; the checkpoint does not.
  EXPECT_EQ(closed_form, total + int64_t{128256} * 2048);
  EXPECT_EQ(total, 1235814400);
}

TEST(TransformerConfigTest, LayersAndNames) {
  const TransformerConfig c = Tiny();
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
TEST(TransformerConfigTest, CheckpointParamsLeaveOutATiedCopyWhoseOriginalIsThere) {
  TransformerConfig c = Tiny();
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

TEST(TransformerConfigTest, TiedParamsNameTheEmbeddingAndTheHeadsCopy) {
  TransformerConfig c = Tiny();
  EXPECT_FALSE(TiedParamsOf(c).has_value());
  c.tie_embeddings = true;
  const std::optional<TiedParams> tied = TiedParamsOf(c);
  ASSERT_TRUE(tied.has_value());
  EXPECT_EQ(tied->embedding, kTokenEmbeddingName);
  EXPECT_EQ(tied->head, kOutputHeadName);
}

TEST(TransformerConfigTest, ParameterCountsMatchGpt2Formulas) {
  const TransformerConfig c = Tiny();
  const int64_t C = 32, V = 256, T = 16;
  EXPECT_EQ(CostOfLayer(c, 0).params, V * C + T * C);
  EXPECT_EQ(CostOfLayer(c, 1).params, 12 * C * C + 13 * C);
  EXPECT_EQ(CostOfLayer(c, 4).params, 2 * C + V * C);
  // The head keeps x, ln_f out, mean, rstd, the probabilities and the int32 target.
  EXPECT_EQ(CostOfLayer(c, 4).activation_bytes, (2 * C + 2 + V + 1) * 4);
  // GPT-2 small (124M with a tied head): blocks + embeddings + an untied head.
  const TransformerConfig gpt2{50257, 1024, 768, 12, 12};
  int64_t total = 0;
  for (int l = 0; l < gpt2.num_pipeline_layers(); ++l) total += CostOfLayer(gpt2, l).params;
  EXPECT_EQ(total, 124439808 + 50257 * 768);
}

// The closed form that checks use must count exactly the tensors a chunk builds.
TEST(TransformerConfigTest, ParamsOfLayerCountsLayerParams) {
  for (const TransformerConfig& c : {Tiny(), TransformerConfig{50257, 1024, 768, 12, 12},
                                     TransformerConfig{97, 7, 24, 3, 5}}) {
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

TEST(TransformerConfigTest, ChunkMemoryFollowsTheModelChunk) {
  const TransformerConfig c = Tiny();  // C 32, H 4, T 16, V 256, 3 blocks
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
TEST(TransformerConfigTest, ActivationsKeptForProductsTakeTheProductsBytes) {
  const TransformerConfig c = Tiny();
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

// The tables a chunk's layers share, in closed form: Llama's blocks read one pair of
// rotary tables per chunk, cos and sin of T x hs/2 fp32 each (Llama 3.2 1B at T 8192, hs
// 64: 2 MiB a chunk, where 16 blocks each with their own held 32 MiB); a chunk of only
// the embedding or the head reads none, and GPT-2's learned positions are parameters.
TEST(TransformerConfigTest, ChunkTableBytesAreOnePairOfRotaryTablesPerChunkWithALlamaBlock) {
  TransformerConfig llama{.vocab_size = 128256, .seq_len = 8192, .d_model = 2048, .n_heads = 32,
                          .n_layers = 16};
  llama.family = "llama";
  llama.n_kv_heads = 8;
  llama.ffn_dim = 8192;
  llama.rope_theta = kLlamaDefaultRopeTheta;
  llama.norm_eps = kLlamaDefaultNormEps;
  ASSERT_THAT(ValidateConfig(llama), IsOk());
  const uint64_t pair = 2 * uint64_t{8192} * (64 / 2) * 4;
  EXPECT_EQ(pair, uint64_t{2} << 20);
  const int n = llama.num_pipeline_layers();  // embedding 0, blocks 1..16, head 17
  EXPECT_EQ(ChunkTableBytes(llama, 0, n), pair) << "once for the whole model's 16 blocks";
  EXPECT_EQ(ChunkTableBytes(llama, 1, 2), pair);
  EXPECT_EQ(ChunkTableBytes(llama, 0, 2), pair);
  EXPECT_EQ(ChunkTableBytes(llama, 16, n), pair);
  EXPECT_EQ(ChunkTableBytes(llama, 0, 1), 0u) << "the embedding alone";
  EXPECT_EQ(ChunkTableBytes(llama, n - 1, n), 0u) << "the head alone";
  EXPECT_EQ(ChunkTableBytes(llama, 3, 3), 0u) << "an empty range";
  llama.seq_len = 16;  // the formula, on another shape: heads of 2048 / 32 = 64
  EXPECT_EQ(ChunkTableBytes(llama, 2, 5), 2u * 16 * 32 * 4);

  const TransformerConfig gpt2 = Tiny();
  for (int b = 0; b < gpt2.num_pipeline_layers(); ++b) {
    for (int e = b + 1; e <= gpt2.num_pipeline_layers(); ++e) {
      EXPECT_EQ(ChunkTableBytes(gpt2, b, e), 0u) << b << ".." << e;
    }
  }
  // The largest sizes a request can set are counted without wrapping.
  constexpr int kBig = std::numeric_limits<int>::max();
  TransformerConfig huge = llama;
  huge.seq_len = kBig;
  huge.d_model = kBig;
  huge.n_heads = 1;
  EXPECT_EQ(ChunkTableBytes(huge, 1, 2), 8 * uint64_t{kBig} * uint64_t{kBig / 2});
}

}  // namespace
}  // namespace pipetrain::model
