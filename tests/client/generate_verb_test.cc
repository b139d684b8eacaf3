// `pipetrain generate` through RunCli, on checkpoints that `pipetrain init` writes: greedy
// output is deterministic and is the library's greedy generation (from a file and from a
// job's checkpoint folder alike), a seed reproduces sampled text, --json prints one JSON
// object and nothing else, and every bad flag or input exits 2 naming the flag or file.
#include <string>
#include <tuple>
#include <vector>

#include "client/cli.h"
#include "common/data/tokenizer.h"
#include "common/cuda_probe.h"
#include "common/model/checkpoint.h"
#include "common/model/checkpoint_folder.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/kv_cache_decoder.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/token_generator.h"
#include "tests/testing/run_cli.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::client {
namespace {

using ::pipetrain::testing::Cli;
using ::pipetrain::testing::CliRun;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kTinyModel[] = R"({"seq_len":16,"d_model":32,"n_heads":4,"n_layers":2})";
constexpr char kPrompt[] = "In the beginning";  // 16 bytes: a full context at once

// A checkpoint of `model` written by `pipetrain init`.
std::string InitCheckpoint(const TempDir& dir, const std::string& name,
                           const std::string& model = kTinyModel) {
  const std::string path = dir.File(name);
  const CliRun r = Cli({"init", "--model", model, "--seed", "3", "--out", path});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  return path;
}

// What the library generates greedily from the checkpoint at `path`, as bytes.
std::string LibraryGreedy(const std::string& path, const std::string& prompt, int tokens) {
  auto checkpoint = model::LoadCheckpoint(path);
  EXPECT_THAT(checkpoint, IsOk());
  if (!checkpoint.ok()) return "";
  const model::TransformerConfig& c = checkpoint->config;
  auto cpu = compute::CpuBackend::Create(1);
  EXPECT_THAT(cpu, IsOk());
  auto chunk = compute::ModelChunk::Create(c, 0, c.num_pipeline_layers(), cpu->get());
  EXPECT_THAT(chunk, IsOk());
  EXPECT_THAT(compute::RestoreChunk(*checkpoint, **chunk), IsOk());
  auto decoder = compute::KvCacheDecoder::Create(chunk->get());
  EXPECT_THAT(decoder, IsOk());
  const std::vector<int32_t> ids(prompt.begin(), prompt.end());
  auto generated = compute::GenerateTokens(**decoder, ids, tokens, {.temperature = 0},
                                           [](int32_t) { return absl::OkStatus(); });
  EXPECT_THAT(generated, IsOk());
  if (!generated.ok()) return "";
  return std::string(generated->begin(), generated->end());
}

// A GPT-2-shaped model (50,257 tokens, tied) with GPT-2's BPE: the prompt is encoded as
// the tokenizer encodes it and the completion is the decoding of the ids drawn.
TEST(GenerateVerbTest, Gpt2TokenizerEncodesThePromptAndDecodesTheCompletion) {
  auto tokenizer = data::MakeTokenizer("gpt2", "");
  if (!tokenizer.ok()) {
    GTEST_SKIP() << "the GPT-2 vocabulary is not installed (run deploy/install-deps.sh): "
                 << tokenizer.status();
  }
  TempDir dir;
  const std::string path = InitCheckpoint(
      dir, "gpt2.safetensors",
      R"({"vocab_size":50257,"seq_len":16,"d_model":16,"n_heads":2,"n_layers":1,)"
      R"("tie_embeddings":true})");
  const CliRun r = Cli({"generate", "--checkpoint", path, "--tokenizer", "gpt2", "--prompt",
                        "Hello world", "--tokens", "6", "--seed", "2", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], nlohmann::json::array({15496, 995}));
  const std::vector<int32_t> ids = j["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 6u);
  auto text = (*tokenizer)->Decode(ids);
  ASSERT_THAT(text, IsOk());
  // (This seed draws whole-character tokens, so no U+FFFD stands in for a byte.)
  EXPECT_EQ(j["completion"].get<std::string>(), *text);
}

// The same with Llama 3's BPE on a model of its 128,256 tokens: the prompt's ids are
// the tokenizer's and the text printed is the prompt and the decoding of the ids drawn.
TEST(GenerateVerbTest, Llama3TokenizerEncodesThePromptAndDecodesTheCompletion) {
  auto tokenizer = data::MakeTokenizer("llama3", "");
  if (!tokenizer.ok()) {
    GTEST_SKIP() << "the Llama 3 vocabulary is not installed (run deploy/install-deps.sh): "
                 << tokenizer.status();
  }
  TempDir dir;
  const std::string path = InitCheckpoint(
      dir, "llama3.safetensors",
      R"({"vocab_size":128256,"seq_len":16,"d_model":8,"n_heads":2,"n_layers":1,)"
      R"("tie_embeddings":true})");
  std::vector<std::string> args = {"generate", "--checkpoint", path, "--tokenizer", "llama3",
                                   "--prompt", "Hello world", "--tokens", "6", "--seed", "2"};
  const CliRun text = Cli(args);
  args.push_back("--json");
  const CliRun r = Cli(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(text.code, kExitOk) << text.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], nlohmann::json::array({9906, 1917}));
  EXPECT_EQ(j["tokenizer"], "llama3");
  const std::vector<int32_t> ids = j["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 6u);
  auto completion = (*tokenizer)->Decode(ids);
  ASSERT_THAT(completion, IsOk());
  EXPECT_EQ(text.out, "Hello world" + *completion + "\n");
}

TEST(GenerateVerbTest, GreedyOutputIsDeterministicAndIsTheLibrarysGreedyText) {
  TempDir dir;
  const std::string path = InitCheckpoint(dir, "init.safetensors");
  const std::vector<std::string> args = {"generate", "--checkpoint",  path,
                                         "--prompt", kPrompt,         "--tokens",
                                         "40",       "--temperature", "0"};
  const CliRun a = Cli(args);
  ASSERT_EQ(a.code, kExitOk) << a.err;
  EXPECT_EQ(a.out, std::string(kPrompt) + LibraryGreedy(path, kPrompt, 40) + "\n");
  const CliRun b = Cli(args);
  EXPECT_EQ(b.out, a.out);
  // The log line goes to stderr.
  EXPECT_THAT(a.err, HasSubstr("40 tokens in"));
}

// A job's checkpoint folder (one file a stage and the index) gives the same text.
TEST(GenerateVerbTest, ReadsAJobCheckpointFolder) {
  TempDir dir;
  const std::string path = InitCheckpoint(dir, "init.safetensors");
  auto whole = model::LoadCheckpoint(path);
  ASSERT_THAT(whole, IsOk());
  std::vector<model::ChunkFile> files;
  const int cut = 2, layers = whole->config.num_pipeline_layers();
  for (auto [stage, begin, end] : {std::tuple{0, 0, cut}, {1, cut, layers}}) {
    auto part = model::SliceCheckpoint(*whole, begin, end);
    ASSERT_THAT(part, IsOk());
    auto bytes = model::SerializeCheckpoint(*part);
    ASSERT_THAT(bytes, IsOk());
    files.push_back({.stage = stage, .chunk = 0, .bytes = *bytes});
  }
  const std::string folder = dir.File("step-5");
  ASSERT_THAT(model::WriteCheckpointFolder(folder, files, 1), IsOk());
  const CliRun r = Cli({"generate", "--checkpoint", folder, "--prompt", kPrompt, "--tokens", "10",
                        "--temperature", "0"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, std::string(kPrompt) + LibraryGreedy(path, kPrompt, 10) + "\n");
  // One stage's file alone is not the whole model.
  const std::string stage0 = dir.File("stage-0.safetensors");
  auto part = model::SliceCheckpoint(*whole, 0, cut);
  ASSERT_THAT(part, IsOk());
  ASSERT_THAT(model::SaveCheckpoint(stage0, *part), IsOk());
  const CliRun bad = Cli({"generate", "--checkpoint", stage0, "--prompt", "x"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr("needs the whole model"));
}

TEST(GenerateVerbTest, ASeedReproducesSampledTextAndSeedsDiffer) {
  TempDir dir;
  const std::string path = InitCheckpoint(dir, "init.safetensors");
  auto run = [&](const std::string& seed) {
    const CliRun r = Cli({"generate", "--checkpoint", path, "--prompt", "abc", "--tokens", "30",
                          "--temperature", "1.0", "--top-k", "50", "--seed", seed});
    EXPECT_EQ(r.code, kExitOk) << r.err;
    return r.out;
  };
  const std::string a = run("1");
  EXPECT_EQ(a.size(), 3u + 30u + 1u);
  EXPECT_EQ(run("1"), a);
  EXPECT_NE(run("2"), a);
}

TEST(GenerateVerbTest, JsonIsOneObjectAndNothingElse) {
  TempDir dir;
  const std::string path = InitCheckpoint(dir, "init.safetensors");
  const CliRun r = Cli({"generate", "--checkpoint", path, "--prompt", "abc", "--tokens", "12",
                        "--temperature", "0", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["prompt"], "abc");
  EXPECT_EQ(j["prompt_tokens"], (std::vector<int>{'a', 'b', 'c'}));
  ASSERT_TRUE(j["tokens"].is_array());
  EXPECT_EQ(j["tokens"].size(), 12u);
  const std::string greedy = LibraryGreedy(path, "abc", 12);
  std::vector<int> ids(greedy.begin(), greedy.end());
  for (int& id : ids) id &= 0xff;
  EXPECT_EQ(j["tokens"], ids);
  EXPECT_TRUE(j["completion"].is_string());
  EXPECT_TRUE(j["tokens_per_s"].is_number());
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_THAT(r.err, HasSubstr("pipetrain generate: "));
}

TEST(GenerateVerbTest, HelpTellsTheFlags) {
  const CliRun r = Cli({"generate", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  for (const char* flag : {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k",
                           "--seed", "--tokenizer", "--tokenizer-dir", "--device", "--json"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  EXPECT_THAT(Cli({"--help"}).out, HasSubstr("generate"));
}

// A bad invocation and what stderr must say; each exits kExitUsage.
struct UsageCase {
  std::vector<std::string> args;
  std::string message;
};

TEST(GenerateVerbTest, BadFlagsAndInputsExit2NamingTheFlag) {
  TempDir dir;
  const std::string path = InitCheckpoint(dir, "init.safetensors");
  const std::string small_vocab =
      InitCheckpoint(dir, "small.safetensors",
                     R"({"vocab_size":100,"seq_len":8,"d_model":16,"n_heads":2,"n_layers":1})");
  const std::string big_vocab =
      InitCheckpoint(dir, "big.safetensors",
                     R"({"vocab_size":300,"seq_len":8,"d_model":16,"n_heads":2,"n_layers":1})");
  const std::string missing = dir.File("missing.safetensors");
  const std::vector<std::string> ok = {"--checkpoint", path, "--prompt", "hi"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = ok;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::vector<UsageCase> cases = {
      {{"--prompt", "hi"}, "--checkpoint"},
      {{"--checkpoint", path}, "--prompt"},
      {{"--checkpoint", path, "--prompt", ""}, "--prompt TEXT is required and must not be empty"},
      {with({"--tokens", "-1"}), "--tokens must be in [0, "},
      {with({"--tokens", "many"}), "--tokens"},
      {with({"--temperature", "-0.5"}), "--temperature must be a finite number >= 0"},
      {with({"--temperature", "nan"}), "--temperature"},
      {with({"--top-k", "-3"}), "--top-k must be in [0, "},
      {with({"--seed", "-1"}), "--seed must be in [0, "},
      {with({"--threads", "0"}), "--threads must be in [1, "},
      {with({"--tokenizer", "gpt2", "--tokenizer-dir", dir.File("no-vocabulary")}),
       dir.File("no-vocabulary")},
      // A byte-level model's ids are not GPT-2's: the prompt's first token is refused.
      {with({"--tokenizer", "gpt2"}), "outside the vocabulary [0, 256)"},
      {with({"--tokenizer", "words"}), "--tokenizer 'words' is not one of bytes, gpt2"},
      {with({"--tokenizer-dir", dir.path()}),
       "--tokenizer-dir is read by --tokenizer gpt2 and llama3 only"},
      {with({"--device", "tpu"}), "--device 'tpu' is not one of cpu or cuda:N"},
      {with({"--device", "cuda:x"}), "--device 'cuda:x'"},
      {with({"--frobnicate"}), "frobnicate"},
      {{"--checkpoint", missing, "--prompt", "hi"},
       "--checkpoint: '" + missing + "' does not exist"},
      {{"--checkpoint", dir.path(), "--prompt", "hi"}, "--checkpoint"},
      {{"--checkpoint", small_vocab, "--prompt", "ab\xc3\xa9"},
       "--prompt: token 195 at position 2 of the prompt (tokenizer bytes) is outside the "
       "vocabulary [0, 100)"},
      {{"--checkpoint", big_vocab, "--prompt", "hi"},
       "--tokenizer bytes decodes ids below 256, but " + big_vocab + " has vocab_size 300"},
  };
  for (const UsageCase& c : cases) {
    std::vector<std::string> args = {"generate"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_TRUE(r.out.empty()) << c.message << ": nothing on stdout, got " << r.out;
  }
}

TEST(GenerateVerbTest, ACudaDeviceWithoutAGpuIsAUsageError) {
  if (common::HasCudaDevice()) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  const std::string path = InitCheckpoint(dir, "init.safetensors");
  const CliRun r = Cli({"generate", "--checkpoint", path, "--prompt", "hi", "--device", "cuda:0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--device cuda:0: no usable GPU"));
}

}  // namespace
}  // namespace pipetrain::client
