// The model families (common/model/model_family.h) and GPT-2, the one there is: the
// registry finds it by name, its parameter indices (what the compute library addresses)
// name the tensors they index, every parameter says how it starts and the position table
// says it is one, and Hugging Face tensor names map onto its parameters.
#include "common/model/model_family.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/model/gpt2_family.h"
#include "common/model/transformer_config.h"
#include "common/model/init.h"
#include "common/model/llama_family.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;

TransformerConfig Tiny() { return {64, 8, 16, 2, 3}; }

TEST(ModelFamilyTest, TheRegistryFindsEachFamilyByName) {
  ASSERT_NE(FindFamily("gpt2"), nullptr);
  EXPECT_EQ(FindFamily("gpt2"), &Gpt2Family());
  EXPECT_EQ(FindFamily("gpt2")->name(), "gpt2");
  EXPECT_EQ(FindFamily("llama"), &LlamaFamily());
  EXPECT_EQ(FindFamily("mistral"), nullptr);
  EXPECT_EQ(FindFamily(""), nullptr);
  EXPECT_EQ(&FamilyOf(Tiny()), &Gpt2Family());
  EXPECT_EQ(FamilyNames(), "gpt2, llama");
  EXPECT_EQ(FindFamily(kDefaultFamily), &Gpt2Family());
}

TEST(ModelFamilyTest, Gpt2sMlpIsFourTimesTheWidth) {
  EXPECT_EQ(Gpt2Family().MlpDim(Tiny()), 64);
  EXPECT_EQ(Tiny().mlp_dim(), 64);
}

// The indices the compute library uses name the parameters LayerParams gives there.
TEST(ModelFamilyTest, Gpt2ParameterIndicesNameTheirTensors) {
  const TransformerConfig c = Tiny();
  const std::vector<ParamSpec> embedding = LayerParams(c, 0);
  ASSERT_EQ(embedding.size(), size_t{Gpt2Embedding::kNumParams});
  EXPECT_EQ(embedding[Gpt2Embedding::kWte].name, kTokenEmbeddingName);
  EXPECT_EQ(embedding[Gpt2Embedding::kWpe].name, kPositionEmbeddingName);
  const std::vector<ParamSpec> block = LayerParams(c, 3);  // block 2
  ASSERT_EQ(block.size(), size_t{Gpt2Block::kNumParams});
  const std::pair<Gpt2Block::Param, const char*> names[] = {
      {Gpt2Block::kLn1Weight, "ln_1.weight"},
      {Gpt2Block::kLn1Bias, "ln_1.bias"},
      {Gpt2Block::kAttnWeight, "attn.c_attn.weight"},
      {Gpt2Block::kAttnBias, "attn.c_attn.bias"},
      {Gpt2Block::kAttnProjWeight, "attn.c_proj.weight"},
      {Gpt2Block::kAttnProjBias, "attn.c_proj.bias"},
      {Gpt2Block::kLn2Weight, "ln_2.weight"},
      {Gpt2Block::kLn2Bias, "ln_2.bias"},
      {Gpt2Block::kFcWeight, "mlp.c_fc.weight"},
      {Gpt2Block::kFcBias, "mlp.c_fc.bias"},
      {Gpt2Block::kMlpProjWeight, "mlp.c_proj.weight"},
      {Gpt2Block::kMlpProjBias, "mlp.c_proj.bias"}};
  for (const auto& [index, name] : names) {
    EXPECT_EQ(block[index].name, std::string("transformer.h.2.") + name);
  }
  const std::vector<ParamSpec> head = LayerParams(c, 4);
  ASSERT_EQ(head.size(), size_t{Gpt2Head::kNumParams});
  EXPECT_EQ(head[Gpt2Head::kLnFWeight].name, "transformer.ln_f.weight");
  EXPECT_EQ(head[Gpt2Head::kLnFBias].name, "transformer.ln_f.bias");
  EXPECT_EQ(head[Gpt2Head::kLmHead].name, kOutputHeadName);
}

// GPT-2's scheme: norm weights 1, biases 0, matrices N(0, 0.02), the projections into the
// residual stream scaled down; and the values InitLayerParams draws follow it.
TEST(ModelFamilyTest, Gpt2ParametersSayHowTheyStart) {
  const TransformerConfig c = Tiny();
  const std::vector<ParamSpec> block = LayerParams(c, 1);
  EXPECT_EQ(block[Gpt2Block::kLn1Weight].init, ParamInit::kOnes);
  EXPECT_EQ(block[Gpt2Block::kLn2Bias].init, ParamInit::kZeros);
  EXPECT_EQ(block[Gpt2Block::kAttnWeight].init, ParamInit::kNormal);
  EXPECT_EQ(block[Gpt2Block::kAttnProjWeight].init, ParamInit::kResidualNormal);
  EXPECT_EQ(block[Gpt2Block::kMlpProjWeight].init, ParamInit::kResidualNormal);
  EXPECT_EQ(block[Gpt2Block::kFcBias].init, ParamInit::kZeros);
  for (int layer = 0; layer < c.num_pipeline_layers(); ++layer) {
    const std::vector<ParamSpec> specs = LayerParams(c, layer);
    const std::vector<std::vector<float>> values = InitLayerParams(c, layer, 3);
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::vector<float>& v = values[i];
      if (specs[i].init == ParamInit::kOnes) {
        EXPECT_EQ(v, std::vector<float>(v.size(), 1.0f));
      }
      if (specs[i].init == ParamInit::kZeros) {
        EXPECT_EQ(v, std::vector<float>(v.size(), 0.0f));
      }
      if (specs[i].init == ParamInit::kNormal || specs[i].init == ParamInit::kResidualNormal) {
        double sq = 0;
        for (float x : v) sq += double{x} * x;
        const double want = specs[i].init == ParamInit::kNormal ? 0.02 : 0.02 / std::sqrt(6.0);
        EXPECT_NEAR(std::sqrt(sq / v.size()), want, want * 0.2) << specs[i].name;
      }
    }
  }
}

TEST(ModelFamilyTest, OnlyThePositionTableIsPerPosition) {
  std::vector<std::string> per_position;
  for (const ParamSpec& p : RangeParams(Tiny(), 0, Tiny().num_pipeline_layers())) {
    if (p.per_position) per_position.push_back(p.name);
  }
  EXPECT_EQ(per_position, std::vector<std::string>{kPositionEmbeddingName});
}

// Hugging Face GPT-2 files spell names with or without "transformer." and may carry the
// attention-mask buffers, which are no parameters.
TEST(ModelFamilyTest, Gpt2HuggingFaceNamesMapOntoItsParameters) {
  const ModelFamily& f = Gpt2Family();
  const std::set<std::string> expected = {"transformer.wte.weight", "lm_head.weight"};
  EXPECT_EQ(f.ParamOfHfTensor("wte.weight", expected), "transformer.wte.weight");
  EXPECT_EQ(f.ParamOfHfTensor("transformer.wte.weight", expected), "transformer.wte.weight");
  EXPECT_EQ(f.ParamOfHfTensor("lm_head.weight", expected), "lm_head.weight");
  EXPECT_EQ(f.ParamOfHfTensor("h.0.attn.rotary", expected), "h.0.attn.rotary");  // as spelt
  EXPECT_EQ(f.ParamOfHfTensor("h.3.attn.bias", expected), std::nullopt);
  EXPECT_EQ(f.ParamOfHfTensor("transformer.h.3.attn.masked_bias", expected), std::nullopt);
  auto back = f.ParseHfConfig(f.HfConfigJson(Tiny()), "config.json");
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, Tiny());
}

}  // namespace
}  // namespace pipetrain::model
