// Llama's config.json both ways (hf_llama.h): Llama 3.2 1B's own config reads as the
// model it describes, an exported config reads back equal, and what this model does not
// compute is refused naming the field.
#include "common/model/hf_llama.h"

#include <string>

#include "common/model/llama_family.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

// Llama 3.2 1B's config.json as the Hub serves it (fields that change no computation,
// such as bos_token_id, included).
constexpr char kLlama32OneB[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(HfLlamaTest, ReadsLlama32OneB) {
  auto c = ParseHfLlamaConfig(kLlama32OneB, "config.json");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->family, "llama");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->seq_len, 131072);
  EXPECT_EQ(c->d_model, 2048);
  EXPECT_EQ(c->ffn_dim, 8192);
  EXPECT_EQ(c->n_layers, 16);
  EXPECT_EQ(c->n_heads, 32);
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_EQ(c->norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 500000);
  EXPECT_EQ(c->rope_scaling, (RopeScaling{32, 1, 4, 8192}));
  EXPECT_TRUE(c->tie_embeddings);
  auto back = ParseHfLlamaConfig(HfLlamaConfigJson(*c), "exported");
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, *c);
  // Llama 3's vocabulary: generate() must stop at <|end_of_text|>, not LlamaConfig's 2.
  const nlohmann::json j = nlohmann::json::parse(HfLlamaConfigJson(*c));
  EXPECT_EQ(j["bos_token_id"], 128000);
  EXPECT_EQ(j["eos_token_id"], 128001);
  TransformerConfig bytes = *c;
  bytes.vocab_size = 256;
  EXPECT_FALSE(nlohmann::json::parse(HfLlamaConfigJson(bytes)).contains("eos_token_id"));
}

TEST(HfLlamaTest, RefusesWhatItDoesNotComputeByField) {
  auto refused = [](const std::string& from, const std::string& to, const char* what) {
    std::string text = kLlama32OneB;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    EXPECT_THAT(ParseHfLlamaConfig(text, "dir/config.json"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("dir/config.json"), HasSubstr(what))));
  };
  refused(R"("model_type": "llama")", R"("model_type": "mistral")", "model_type is \"mistral\"");
  refused(R"("attention_bias": false)", R"("attention_bias": true)", "attention_bias is true");
  refused(R"("mlp_bias": false)", R"("mlp_bias": true)", "mlp_bias is true");
  refused(R"("hidden_act": "silu")", R"("hidden_act": "gelu")", "hidden_act is \"gelu\"");
  refused(R"("head_dim": 64)", R"("head_dim": 128)", "head_dim is 128");
  refused(R"("pretraining_tp": 1)", R"("pretraining_tp": 2)", "pretraining_tp is 2");
  refused(R"("use_cache": true)", R"("use_cache": true, "sliding_window": 4096)",
          "sliding_window is 4096");
  refused(R"("use_cache": true)", R"("use_cache": true, "num_local_experts": 8)",
          "num_local_experts is 8");
  refused(R"("rope_type": "llama3")", R"("rope_type": "yarn")", "rope_scaling.rope_type is \"yarn\"");
  refused(R"("num_key_value_heads": 8)", R"("num_key_value_heads": 5)", "model.n_kv_heads (5)");
  refused(R"("hidden_size": 2048,)", "", "hidden_size is missing");
}

TEST(HfLlamaTest, TensorNamesAreTheParametersAndTheRotaryBufferIsSkipped) {
  EXPECT_EQ(LlamaParamOfHfTensor("model.layers.3.mlp.up_proj.weight", {}),
            "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(LlamaParamOfHfTensor("model.layers.0.self_attn.rotary_emb.inv_freq", {}),
            std::nullopt);
}

}  // namespace
}  // namespace pipetrain::model
