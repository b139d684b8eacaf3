// Hugging Face Llama folders in and out (common/model/hf_folder.h with the Llama family's
// hf_llama.h, `pipetrain eval`, `pipetrain export-hf`, a job's init_from), against
// testdata/hf_llama/, which make_hf_llama_fixture.py wrote with an independent float64
// PyTorch Llama: the folders read as the right config and values (BF16 shards with the
// rotary buffer, F32 tied), `pipetrain eval` gives PyTorch's loss and every gradient on
// fewer positions than the folder's max_position_embeddings, an export holds exactly what
// LlamaForCausalLM expects and reads back identical, and what this model does not compute
// is refused naming the tensor.
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "common/model/checkpoint.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/hf_folder.h"
#include "common/model/llama_family.h"
#include "common/safetensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/param_maps.h"
#include "tests/testing/run_cli.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::model {
namespace {

namespace fs = std::filesystem;
using ::pipetrain::testing::Cli;
using ::pipetrain::testing::CliRun;
using ::pipetrain::testing::IdenticalParams;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::ReadFileOrDie;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kData = std::string(PIPETRAIN_TESTDATA_DIR) + "/hf_llama/";

std::string Folder(const std::string& variant) { return kData + variant; }

const nlohmann::json& Expected(const std::string& variant) {
  static const nlohmann::json all =
      nlohmann::json::parse(ReadFileOrDie(kData + "expected.json"));
  return all["folders"][variant];
}

// The model the folder describes, from expected.json (written by the fixture, not by
// hf_llama.cc), with seq_len = max_position_embeddings as a folder is read.
TransformerConfig ExpectedConfig(const std::string& variant) {
  const nlohmann::json& c = Expected(variant)["config"];
  TransformerConfig g{.vocab_size = c["vocab_size"],
                      .seq_len = Expected(variant)["max_position_embeddings"],
                      .d_model = c["d_model"],
                      .n_heads = c["n_heads"],
                      .n_layers = c["n_layers"],
                      .tie_embeddings = c["tie_embeddings"]};
  g.family = kLlamaFamily;
  g.n_kv_heads = c["n_kv_heads"];
  g.ffn_dim = c["ffn_dim"];
  g.rope_theta = c["rope_theta"];
  g.norm_eps = c["norm_eps"];
  if (c.contains("rope_scaling")) {
    const nlohmann::json& s = c["rope_scaling"];
    g.rope_scaling = {s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                      s["original_max_position_embeddings"]};
  }
  return g;
}

TEST(HfLlamaFolderTest, FoldersReadAsTheirConfigAndExactValues) {
  for (const std::string variant : {"untied", "tied"}) {
    auto c = LoadHfFolder(Folder(variant));
    ASSERT_THAT(c.status(), IsOk()) << variant;
    EXPECT_EQ(c->config, ExpectedConfig(variant)) << variant;
    EXPECT_FALSE(c->optimizer.has_value());
    const nlohmann::json& tensors = Expected(variant)["tensors"];
    // Tied, the head is the embedding: no lm_head.weight of its own.
    EXPECT_EQ(c->params.size(), tensors.size()) << variant;
    EXPECT_EQ(c->params.count("lm_head.weight"), variant == "tied" ? 0u : 1u);
    for (const auto& [name, want] : tensors.items()) {
      ASSERT_EQ(c->params.count(name), 1u) << variant << " " << name;
      const common::Tensor& t = c->params.at(name);
      EXPECT_EQ(t.shape(), want["shape"].get<std::vector<int64_t>>()) << name;
      double sum = 0;  // BF16 and F32 widen exactly; summed in double as the fixture did
      for (float v : t.data<float>()) sum += v;
      EXPECT_NEAR(sum, want["sum"].get<double>(), 1e-9 * t.num_elements()) << name;
    }
  }
}

// eval on the folder's first 16 positions (its max_position_embeddings is 64 untied):
// PyTorch's float64 loss within 1e-5 and every gradient within 1e-4 (relative L2).
TEST(HfLlamaFolderTest, EvalGivesPyTorchsLossAndEveryGradient) {
  for (const std::string variant : {"untied", "tied"}) {
    TempDir dir;
    const std::string text = dir.File("text.txt");
    WriteFileOrDie(text, Expected(variant)["text"].get<std::string>());
    const std::string grads = dir.File("grads.safetensors");
    const std::string rows = std::to_string(Expected(variant)["rows"].get<int>());
    const std::string seq = std::to_string(Expected(variant)["config"]["seq_len"].get<int>());
    CliRun r = Cli({"eval", "--checkpoint", Folder(variant), "--text", text, "--batch", rows,
                    "--seq-len", seq, "--grads-out", grads, "--json"});
    ASSERT_EQ(r.code, client::kExitOk) << variant << ": " << r.err;
    const nlohmann::json got = nlohmann::json::parse(r.out);
    EXPECT_EQ(got["seq_len"].get<int>(), std::stoi(seq));
    const double want = Expected(variant)["loss"].get<double>();
    EXPECT_LT(std::abs(got["loss"].get<double>() - want) / want, 1e-5) << variant;

    auto ours = common::ReadSafetensorsFile(grads);
    auto theirs = common::ReadSafetensorsFile(kData + "grads_" + variant + ".safetensors");
    ASSERT_THAT(ours.status(), IsOk());
    ASSERT_THAT(theirs.status(), IsOk());
    ASSERT_EQ(theirs->tensors.size(), Expected(variant)["tensors"].size());
    for (const common::NamedTensor& ref : theirs->tensors) {
      const common::Tensor* g = ours->Find(ref.name);
      ASSERT_NE(g, nullptr) << variant << " " << ref.name;
      ASSERT_EQ(g->shape(), ref.tensor.shape()) << ref.name;
      std::span<const float> a = g->data<float>(), b = ref.tensor.data<float>();
      double diff = 0, norm = 0;
      for (size_t i = 0; i < b.size(); ++i) {
        diff += std::pow(double{a[i]} - b[i], 2);
        norm += std::pow(double{b[i]}, 2);
      }
      EXPECT_LT(std::sqrt(diff), 1e-4 * std::sqrt(norm)) << variant << " " << ref.name;
    }
  }
}

TEST(HfLlamaFolderTest, EvalRefusesMorePositionsThanTheFolderHas) {
  TempDir dir;
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, std::string(4096, 'a'));
  CliRun r = Cli({"eval", "--checkpoint", Folder("untied"), "--text", text, "--batch", "1",
                  "--seq-len", "65"});
  EXPECT_EQ(r.code, client::kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--seq-len 65 is more than the checkpoint's seq_len 64"));
  r = Cli({"eval", "--checkpoint", Folder("untied"), "--text", text, "--batch", "1",
           "--seq-len", "-1"});
  EXPECT_EQ(r.code, client::kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--seq-len must be >= 0"));
}

// A job's init_from: a Llama job of 16 positions starts from the 64-position folder
// (no parameter depends on the position count), and nothing else may differ.
TEST(HfLlamaFolderTest, AJobOfFewerPositionsStartsFromTheFolder) {
  auto whole = LoadWholeCheckpoint(Folder("untied"), "init_from");
  ASSERT_THAT(whole.status(), IsOk());
  const ParamMap before = [&] {
    ParamMap copy;
    for (const auto& [name, t] : whole->params) copy.emplace(name, t.Clone());
    return copy;
  }();
  TransformerConfig job = ExpectedConfig("untied");
  job.seq_len = 16;
  auto fit = FitCheckpointToModel(*std::move(whole), job, "init_from: 'x'");
  ASSERT_THAT(fit.status(), IsOk());
  EXPECT_EQ(fit->config, job);
  EXPECT_TRUE(IdenticalParams(fit->params, before));

  auto refused = [&](auto change, const std::string& message) {
    auto again = LoadWholeCheckpoint(Folder("untied"), "init_from");
    ASSERT_THAT(again.status(), IsOk());
    TransformerConfig want = job;
    change(want);
    EXPECT_THAT(FitCheckpointToModel(*std::move(again), want, "init_from: 'x'").status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("init_from: 'x'"), HasSubstr(message))));
  };
  refused([](TransformerConfig& c) { c.seq_len = 65; }, "model.seq_len is 64 in the checkpoint");
  refused([](TransformerConfig& c) { c.n_kv_heads = 4; }, "model.n_kv_heads is 2");
  refused([](TransformerConfig& c) { c.ffn_dim = 64; }, "model.ffn_dim is 48");
  refused([](TransformerConfig& c) { c.rope_theta = 500000; }, "model.rope_theta is 10000");
  refused([](TransformerConfig& c) { c.rope_scaling = {}; }, "model.rope_scaling differs");
  refused([](TransformerConfig& c) { c.family = "gpt2"; }, "model.architecture is llama");
}

// The tensors LlamaForCausalLM has for a config, as its state dict names and shapes them
// (written from the architecture, not from llama_family.cc): nn.Linear weights [out, in].
std::map<std::string, std::vector<int64_t>> LlamaForCausalLmTensors(const TransformerConfig& c) {
  const int64_t V = c.vocab_size, C = c.d_model, F = c.ffn_dim;
  const int64_t KV = C / c.n_heads * c.n_kv_heads;
  std::map<std::string, std::vector<int64_t>> t = {{"model.embed_tokens.weight", {V, C}},
                                                   {"model.norm.weight", {C}}};
  if (!c.tie_embeddings) t["lm_head.weight"] = {V, C};
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    t[l + "input_layernorm.weight"] = {C};
    t[l + "post_attention_layernorm.weight"] = {C};
    t[l + "self_attn.q_proj.weight"] = {C, C};
    t[l + "self_attn.k_proj.weight"] = {KV, C};
    t[l + "self_attn.v_proj.weight"] = {KV, C};
    t[l + "self_attn.o_proj.weight"] = {C, C};
    t[l + "mlp.gate_proj.weight"] = {F, C};
    t[l + "mlp.up_proj.weight"] = {F, C};
    t[l + "mlp.down_proj.weight"] = {C, F};
  }
  return t;
}

TEST(HfLlamaFolderTest, ExportsWhatLlamaForCausalLmLoadsAndReadsBackIdentical) {
  for (const std::string variant : {"untied", "tied"}) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      TempDir dir;
      const std::string out = dir.File("export");
      CliRun r = Cli({"export-hf", Folder(variant), "--out", out, "--dtype", dtype});
      ASSERT_EQ(r.code, client::kExitOk) << variant << ": " << r.err;
      const TransformerConfig config = ExpectedConfig(variant);
      EXPECT_THAT(r.out, HasSubstr(absl::StrCat("llama: n_kv_heads ", config.n_kv_heads,
                                                ", ffn_dim ", config.ffn_dim)));
      auto header = common::ReadSafetensorsHeader(out + "/model.safetensors");
      ASSERT_THAT(header.status(), IsOk());
      std::map<std::string, std::vector<int64_t>> got;
      for (const common::SafetensorsEntry& e : header->entries) got[e.name] = e.shape;
      EXPECT_EQ(got, LlamaForCausalLmTensors(config)) << variant;

      const nlohmann::json j = nlohmann::json::parse(ReadFileOrDie(out + "/config.json"));
      EXPECT_EQ(j["model_type"], "llama");
      EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
      EXPECT_EQ(j["hidden_size"], config.d_model);
      EXPECT_EQ(j["intermediate_size"], config.ffn_dim);
      EXPECT_EQ(j["num_attention_heads"], config.n_heads);
      EXPECT_EQ(j["num_key_value_heads"], config.n_kv_heads);
      EXPECT_EQ(j["num_hidden_layers"], config.n_layers);
      EXPECT_EQ(j["max_position_embeddings"], config.seq_len);
      EXPECT_EQ(j["rms_norm_eps"], config.norm_eps);
      EXPECT_EQ(j["rope_theta"], config.rope_theta);
      EXPECT_EQ(j["tie_word_embeddings"], config.tie_embeddings);
      EXPECT_EQ(j["hidden_act"], "silu");
      EXPECT_EQ(j["torch_dtype"], dtype == "bf16" ? "bfloat16" : "float32");
      EXPECT_EQ(j["rope_scaling"].is_null(), variant == "tied");

      // The fixture's values are BF16 (untied) or F32 (tied): an fp32 export of either,
      // and a bf16 export of the BF16 one, hold exactly the values read.
      auto back = LoadWholeCheckpoint(out, "CHECKPOINT");
      ASSERT_THAT(back.status(), IsOk());
      EXPECT_EQ(back->config, config);
      auto original = LoadHfFolder(Folder(variant));
      ASSERT_THAT(original.status(), IsOk());
      if (dtype == "fp32" || variant == "untied") {
        EXPECT_TRUE(IdenticalParams(back->params, original->params)) << variant << " " << dtype;
      }
    }
  }
}

// generate runs the folder through the KV-cache decoder; greedy is the same text twice.
TEST(HfLlamaFolderTest, GenerateContinuesAPromptWithTheFolder) {
  auto run = [] {
    return Cli({"generate", "--checkpoint", Folder("untied"), "--prompt", "It was the best",
                "--tokens", "12", "--temperature", "0", "--json"});
  };
  CliRun first = run(), second = run();
  ASSERT_EQ(first.code, client::kExitOk) << first.err;
  EXPECT_THAT(first.err, HasSubstr("seq_len 64, d_model 32, n_heads 4, n_layers 2, llama: "
                                   "n_kv_heads 2, ffn_dim 48"));
  const nlohmann::json a = nlohmann::json::parse(first.out);
  EXPECT_EQ(a["tokens"].size(), 12u);
  EXPECT_EQ(a["tokens"], nlohmann::json::parse(second.out)["tokens"]);
}

// A Llama folder whose tensors say it computes something else: Qwen2-style q/k/v biases
// under model_type llama are named as unexpected; a missing projection is named.
TEST(HfLlamaFolderTest, TensorsOfAnotherArchitectureAreRefusedByName) {
  auto hf = LoadHfFolder(Folder("tied"));
  ASSERT_THAT(hf.status(), IsOk());
  TempDir dir;
  const std::string good = dir.File("good");
  ASSERT_THAT(ExportHfFolder(*hf, good), IsOk());
  auto contents = common::ReadSafetensorsFile(good + "/model.safetensors");
  ASSERT_THAT(contents.status(), IsOk());

  auto write_folder = [&](const std::string& name, const std::vector<common::SafetensorsView>& v) {
    const std::string folder = dir.File(name);
    fs::create_directories(folder);
    fs::copy_file(good + "/config.json", folder + "/config.json");
    EXPECT_THAT(common::WriteSafetensorsFile(folder + "/model.safetensors", v, {{"format", "pt"}}),
                IsOk());
    return folder;
  };
  std::vector<common::SafetensorsView> views;
  for (const common::NamedTensor& t : contents->tensors) views.push_back(common::ViewOf(t.name, t.tensor));

  auto bias = common::Tensor::Create(common::DType::kF32, {32});
  ASSERT_THAT(bias.status(), IsOk());
  std::vector<common::SafetensorsView> with_bias = views;
  with_bias.push_back(common::ViewOf("model.layers.0.self_attn.q_proj.bias", *bias));
  EXPECT_THAT(LoadHfFolder(write_folder("biased", with_bias)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("biased/model.safetensors"),
                             HasSubstr("model.layers.0.self_attn.q_proj.bias"))));

  std::vector<common::SafetensorsView> without;
  for (const common::SafetensorsView& v : views) {
    if (v.name != "model.layers.1.self_attn.k_proj.weight") without.push_back(v);
  }
  EXPECT_THAT(LoadHfFolder(write_folder("missing", without)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("missing/model.safetensors"),
                             HasSubstr("model.layers.1.self_attn.k_proj.weight"))));
}

}  // namespace
}  // namespace pipetrain::model
