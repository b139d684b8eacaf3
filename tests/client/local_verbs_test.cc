// The in-process verbs through RunCli: `pipetrain init` writes the weights
// ModelChunk::Initialize makes, `pipetrain eval` reproduces the PyTorch fixture's loss and
// gradients, `pipetrain train-local` trains (falling loss, one JSON object a step) and
// saves what eval then scores, and every bad input exits 2 (or 1) naming what is wrong.
#include <cmath>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "client/cli.h"
#include "common/model/checkpoint.h"
#include "common/safetensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/trainer.h"
#include "tests/testing/run_cli.h"
#include "tests/testing/temp_files.h"
#include "tests/testing/token_files.h"

namespace pipetrain::client {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::HasSubstr;

constexpr char kTinyModel[] = R"({"seq_len":16,"d_model":32,"n_heads":4,"n_layers":1})";

std::string Fixture(const std::string& name) {
  return std::string(PIPETRAIN_TESTDATA_DIR) + "/gpt_tiny/" + name;
}

using ::pipetrain::testing::Cli;
using ::pipetrain::testing::CliRun;

// A bad invocation of a verb and what its error message must say.
struct UsageCase {
  std::vector<std::string> args;  // after the verb
  std::string message;
};

// Every case exits kExitUsage with its message on stderr.
void ExpectUsageErrors(const std::string& verb, const std::vector<UsageCase>& cases) {
  for (const UsageCase& c : cases) {
    std::vector<std::string> args = {verb};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << verb << ": " << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << verb;
  }
}

// Relative L2 error of `got` against `want`.
double RelError(std::span<const float> got, std::span<const float> want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += std::pow(double{got[i]} - want[i], 2);
    norm += std::pow(double{want[i]}, 2);
  }
  return std::sqrt(diff) / (std::sqrt(norm) + 1e-30);
}

// A text every window of which looks alike, so any batch scores about the same.
std::string RepetitiveText() {
  std::string s;
  while (s.size() < 4000) s += "the quick brown fox jumps over the lazy dog. ";
  return s;
}

TEST(InitVerbTest, WritesTheWeightsOfInitializeForTheSeed) {
  TempDir dir;
  const std::string path = dir.File("init.safetensors");
  CliRun r = Cli({"init", "--model", kTinyModel, "--seed", "7", "--out", path});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr(path));
  auto ckpt = model::LoadCheckpoint(path);
  ASSERT_THAT(ckpt.status(), IsOk());
  const model::TransformerConfig want_config{256, 16, 32, 4, 1};  // vocab_size defaults to 256
  EXPECT_EQ(ckpt->config, want_config);
  EXPECT_EQ(ckpt->layer_begin, 0);
  EXPECT_EQ(ckpt->layer_end, want_config.num_pipeline_layers());
  EXPECT_FALSE(ckpt->optimizer.has_value());

  auto backend = compute::CpuBackend::Create(1);
  ASSERT_THAT(backend.status(), IsOk());
  auto chunk = compute::ModelChunk::Create(want_config, 0, want_config.num_pipeline_layers(),
                                           backend->get());
  ASSERT_THAT(chunk.status(), IsOk());
  ASSERT_THAT((*chunk)->Initialize(7), IsOk());
  ASSERT_EQ(ckpt->params.size(), (*chunk)->Params().size());
  for (const model::ParamSpec& p : (*chunk)->Params()) {
    auto want = (*chunk)->GetParam(p.name);
    ASSERT_THAT(want.status(), IsOk());
    auto got = ckpt->params.at(p.name).data<float>();
    EXPECT_EQ(std::vector<float>(got.begin(), got.end()), *want) << p.name;
  }

  // Another seed gives other weights; the same model given as a file, the same ones.
  const std::string other = dir.File("other.safetensors");
  ASSERT_EQ(Cli({"init", "--model", kTinyModel, "--seed", "8", "--out", other}).code, kExitOk);
  auto other_ckpt = model::LoadCheckpoint(other);
  ASSERT_THAT(other_ckpt.status(), IsOk());
  const std::string name = "transformer.h.0.attn.c_attn.weight";
  auto a = ckpt->params.at(name).data<float>();
  auto b = other_ckpt->params.at(name).data<float>();
  EXPECT_NE(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()));

  const std::string model_file = dir.File("model.json");
  WriteFileOrDie(model_file, kTinyModel);
  const std::string again = dir.File("again.safetensors");
  ASSERT_EQ(Cli({"init", "--model", model_file, "--seed", "7", "--out", again}).code, kExitOk);
  EXPECT_EQ(::pipetrain::testing::ReadFileOrDie(again), ::pipetrain::testing::ReadFileOrDie(path));
}

TEST(InitVerbTest, BadModelsAndFlagsExitTwoNamingTheFieldOrFlag) {
  TempDir dir;
  const std::string out = dir.File("x.safetensors");
  const std::vector<UsageCase> cases = {
      {{"--model", R"({"seq_len":16,"d_modle":32,"n_heads":4,"n_layers":1})", "--out", out},
       "unknown field 'd_modle'"},
      {{"--model", R"({"seq_len":16,"n_heads":4,"n_layers":1})", "--out", out},
       "model.d_model is missing"},
      {{"--model", R"({"seq_len":16,"d_model":"32","n_heads":4,"n_layers":1})", "--out", out},
       "model.d_model must be a positive integer (got \"32\")"},
      {{"--model", R"({"seq_len":16,"d_model":30,"n_heads":4,"n_layers":1})", "--out", out},
       "model.n_heads (4) must divide model.d_model (30)"},
      {{"--model", R"({"seq_len":0,"d_model":32,"n_heads":4,"n_layers":1})", "--out", out},
       "model.seq_len must be a positive integer"},
      {{"--model", R"({"seq_len":16,)", "--out", out}, "not valid JSON"},
      {{"--model", "[1, 2]", "--out", out}, "must be a JSON object"},
      {{"--model", dir.File("missing.json"), "--out", out},
       "cannot read " + dir.File("missing.json")},
      {{"--out", out}, "--model is required"},
      {{"--model", kTinyModel}, "--out FILE is required"},
      {{"--model", kTinyModel, "--out", out, "--seed", "-1"}, "--seed must be >= 0"},
      {{"--model", kTinyModel, "--out", out, "--seed", "x"}, "--seed"},
      {{"--model", kTinyModel, "--out", out, "extra"}, "no positional arguments (got 'extra')"},
      {{"--model", kTinyModel, "--out", out, "--frob"}, "--frob"},
  };
  ExpectUsageErrors("init", cases);
  EXPECT_TRUE(::pipetrain::testing::ListFolder(dir.path()).empty());
  // A file that cannot be written is a failed run, named by its path.
  const std::string unwritable = dir.File("no/such/folder/x.safetensors");
  CliRun r = Cli({"init", "--model", kTinyModel, "--out", unwritable});
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.err, HasSubstr(unwritable));
}

TEST(EvalVerbTest, MatchesThePyTorchFixtureLossAndGradients) {
  std::ifstream in(Fixture("expected.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json expected = nlohmann::json::parse(in);
  TempDir dir;
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, expected["text"].get<std::string>());
  const std::string grads = dir.File("grads.safetensors");
  const std::string batch = std::to_string(expected["batch"].get<int>());
  CliRun r = Cli({"eval", "--checkpoint", Fixture("weights.safetensors"), "--text", text, "--batch",
                  batch, "--grads-out", grads, "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const double want = expected["loss"].get<double>();
  EXPECT_LT(std::abs(j["loss"].get<double>() - want) / want, 1e-5) << r.out;
  EXPECT_EQ(j["tokens"].get<int>(), expected["batch"].get<int>() * 16);
  EXPECT_EQ(j["checkpoint"], Fixture("weights.safetensors"));
  EXPECT_EQ(j["grads_out"], grads);

  auto ours = model::LoadCheckpoint(grads);  // the gradient file is checkpoint-shaped
  ASSERT_THAT(ours.status(), IsOk());
  auto ref = common::ReadSafetensorsFile(Fixture("grads.safetensors"));
  ASSERT_THAT(ref.status(), IsOk());
  ASSERT_EQ(ours->params.size(), ref->tensors.size());
  for (const common::NamedTensor& t : ref->tensors) {
    ASSERT_TRUE(ours->params.count(t.name)) << t.name;
    const common::Tensor& got = ours->params.at(t.name);
    ASSERT_EQ(got.shape(), t.tensor.shape()) << t.name;
    EXPECT_LT(RelError(got.data<float>(), t.tensor.data<float>()), 1e-4) << t.name;
  }

  // Without --json: one readable line with the loss.
  r = Cli(
      {"eval", "--checkpoint", Fixture("weights.safetensors"), "--text", text, "--batch", batch});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(r.out.rfind("loss ", 0), 0u) << r.out;
  EXPECT_LT(std::abs(std::stod(r.out.substr(5)) - want) / want, 1e-5) << r.out;
  EXPECT_THAT(r.out, HasSubstr("48 tokens (3 rows of 16)"));
}

// The fixture's text as token files (a byte is a token id): both formats score the
// loss of the text itself.
TEST(EvalVerbTest, TokenFilesScoreAsTheirText) {
  std::ifstream in(Fixture("expected.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json expected = nlohmann::json::parse(in);
  const std::string text = expected["text"].get<std::string>();
  const std::vector<uint16_t> ids(text.begin(), text.end());
  TempDir dir;
  WriteFileOrDie(dir.File("text.bin"), testing::LlmcBytes(ids));
  WriteFileOrDie(dir.File("train.bin"), testing::NanoGptBytes(ids));
  const std::string batch = std::to_string(expected["batch"].get<int>());
  const double want = expected["loss"].get<double>();
  for (const std::vector<std::string>& source :
       {std::vector<std::string>{"--tokens", dir.File("text.bin")},
        std::vector<std::string>{"--tokens", dir.File("train.bin"), "--format", "nanogpt"}}) {
    std::vector<std::string> args = {"eval",    "--checkpoint", Fixture("weights.safetensors"),
                                     "--batch", batch,          "--json"};
    args.insert(args.end(), source.begin(), source.end());
    CliRun r = Cli(args);
    ASSERT_EQ(r.code, kExitOk) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_LT(std::abs(j["loss"].get<double>() - want) / want, 1e-5) << r.out;
    EXPECT_EQ(j["token_file"], source[1]);
    EXPECT_FALSE(j.contains("text"));
  }
}

TEST(EvalVerbTest, BadTokenFilesExitTwoNamingTheFlagAndFile) {
  TempDir dir;
  const std::string weights = Fixture("weights.safetensors");
  const std::string raw = dir.File("train.bin"), short_file = dir.File("short.bin");
  const std::string big_id = dir.File("big_id.bin"), text = dir.File("text.txt");
  WriteFileOrDie(raw, testing::NanoGptBytes(std::vector<uint16_t>(1000, 65)));
  WriteFileOrDie(short_file, testing::LlmcBytes(std::vector<uint16_t>(50, 65)));
  std::vector<uint16_t> ids(60, 65);
  ids[20] = 300;
  WriteFileOrDie(big_id, testing::LlmcBytes(ids));
  WriteFileOrDie(text, std::string(100, 'a'));
  ExpectUsageErrors(
      "eval",
      {{{"--checkpoint", weights, "--tokens", raw, "--batch", "1"},
        "--tokens: '" + raw + "': wrong magic"},
       {{"--checkpoint", weights, "--tokens", short_file, "--batch", "3"},
        "--tokens: '" + short_file + "' has 50 tokens; --batch 3 rows of seq_len 16 + 1 tokens"},
       {{"--checkpoint", weights, "--tokens", big_id, "--batch", "2"},
        "--tokens: '" + big_id + "': stream token 20 = 300 is outside the vocabulary (256)"},
       {{"--checkpoint", weights, "--tokens", dir.File("nope.bin"), "--batch", "1"},
        "--tokens: token file cannot read " + dir.File("nope.bin") + ": No such file"},
       {{"--checkpoint", weights, "--tokens", raw, "--format", "gpt2", "--batch", "1"},
        "--format: unknown format 'gpt2'"},
       {{"--checkpoint", weights, "--text", text, "--tokens", raw, "--batch", "1"},
        "--text and --tokens: give one of them"},
       {{"--checkpoint", weights, "--text", text, "--format", "nanogpt", "--batch", "1"},
        "--format is the format of a --tokens file"}});
}

TEST(EvalVerbTest, BadInputsExitTwoNamingThePathOrFlag) {
  TempDir dir;
  const std::string weights = Fixture("weights.safetensors");
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, std::string(50, 'a'));  // 3 rows of 17 need 51
  const std::string not_ckpt = dir.File("not_a_checkpoint.safetensors");
  WriteFileOrDie(not_ckpt, "hello");
  const std::vector<UsageCase> cases = {
      {{"--checkpoint", weights, "--text", text, "--batch", "3"},
       "has 50 bytes; --batch 3 rows of seq_len 16 + 1 bytes need 51"},
      {{"--checkpoint", dir.File("nope"), "--text", text, "--batch", "1"}, dir.File("nope")},
      {{"--checkpoint", not_ckpt, "--text", text, "--batch", "1"}, not_ckpt},
      {{"--checkpoint", weights, "--text", dir.File("nope.txt"), "--batch", "1"},
       "cannot read " + dir.File("nope.txt")},
      {{"--checkpoint", weights, "--text", text}, "--batch B is required"},
      {{"--checkpoint", weights, "--text", text, "--batch", "0"}, "--batch B is required"},
      {{"--text", text, "--batch", "1"}, "--checkpoint FILE is required"},
      {{"--checkpoint", weights, "--batch", "1"}, "--text FILE or --tokens FILE is required"},
      {{"--checkpoint", weights, "--text", text, "--batch", "1", "--threads", "0"},
       "--threads must be >= 1"},
  };
  ExpectUsageErrors("eval", cases);
  // A stage's share of a model is not enough.
  const std::string whole = dir.File("whole.safetensors");
  ASSERT_EQ(Cli({"init", "--model", kTinyModel, "--out", whole}).code, kExitOk);
  auto ckpt = model::LoadCheckpoint(whole);
  ASSERT_THAT(ckpt.status(), IsOk());
  model::Checkpoint share;
  share.config = ckpt->config;
  share.layer_begin = 0;
  share.layer_end = 2;
  for (const model::ParamSpec& p : model::RangeParams(share.config, 0, 2)) {
    share.params.emplace(p.name, ckpt->params.at(p.name).Clone());
  }
  const std::string part = dir.File("part.safetensors");
  ASSERT_THAT(model::SaveCheckpoint(part, share), IsOk());
  ExpectUsageErrors("eval", {{{"--checkpoint", part, "--text", text, "--batch", "1"},
                              "holds pipeline layers [0, 2) of 3; eval needs the whole model"},
                             {{"--checkpoint", whole, "--text", text, "--batch", "2000000"},
                              "--batch 2000000 is more than 1048576 rows"}});

  const std::string unwritable = dir.File("no/such/folder/g.safetensors");
  CliRun r = Cli(
      {"eval", "--checkpoint", weights, "--text", text, "--batch", "2", "--grads-out", unwritable});
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.err, HasSubstr(unwritable));
}

TEST(TrainLocalVerbTest, JsonStepsFallAndTheSavedModelScoresTheLastLoss) {
  TempDir dir;
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, RepetitiveText());
  const std::string saved = dir.File("trained.safetensors");
  constexpr int kSteps = 12;
  CliRun r =
      Cli({"train-local", "--model", kTinyModel, "--text", text, "--steps", std::to_string(kSteps),
           "--batch", "4", "--lr", "3e-3", "--seed", "5", "--save", saved, "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::istringstream lines(r.out);
  std::vector<double> losses;
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    ASSERT_EQ(j.size(), 4u) << line;
    EXPECT_EQ(line.rfind("{\"step\":", 0), 0u) << line;  // the fields in the documented order
    EXPECT_EQ(j["step"].get<int>(), static_cast<int>(losses.size()) + 1);
    EXPECT_GT(j["step_time_s"].get<double>(), 0);
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
    EXPECT_NEAR(j["tokens_per_s"].get<double>() * j["step_time_s"].get<double>(), 4 * 16, 1e-6);
    losses.push_back(j["loss"].get<double>());
  }
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);  // a fresh model guesses uniformly
  EXPECT_LT(losses.back(), losses.front() - 0.5);

  r = Cli({"eval", "--checkpoint", saved, "--text", text, "--batch", "8", "--json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const double scored = nlohmann::json::parse(r.out)["loss"].get<double>();
  EXPECT_NEAR(scored, losses.back(), 0.15 * losses.back());
  EXPECT_LT(scored, losses.front() - 0.5);
}

// The saved file records the precision it was trained in; its weights are fp32 in both
// (ReadCheckpointInfo refuses any other dtype).
TEST(TrainLocalVerbTest, TheSavedModelRecordsItsPrecision) {
  TempDir dir;
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, RepetitiveText());
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::string saved = dir.File(precision + ".safetensors");
    CliRun r = Cli({"train-local", "--model", kTinyModel, "--text", text, "--steps", "1",
                    "--batch", "1", "--precision", precision, "--save", saved});
    ASSERT_EQ(r.code, kExitOk) << r.err;
    absl::StatusOr<model::CheckpointInfo> info = model::ReadCheckpointInfo(saved);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->precision, precision);
  }
}

// The verb is compute::TrainLocal with the flags passed through: the same losses, bit
// for bit, and another seed or learning rate changes them.
TEST(TrainLocalVerbTest, LossesAreThoseOfTheReferenceTrainerWithTheGivenFlags) {
  TempDir dir;
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, RepetitiveText());
  auto losses_of = [&](const std::string& seed, const std::string& lr) {
    CliRun r = Cli({"train-local", "--model", kTinyModel, "--text", text, "--steps", "3", "--batch",
                    "2", "--seed", seed, "--lr", lr, "--json"});
    EXPECT_EQ(r.code, kExitOk) << r.err;
    std::vector<double> losses;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    }
    return losses;
  };
  compute::TrainOptions options;
  options.model = model::TransformerConfig{256, 16, 32, 4, 1};
  options.steps = 3;
  options.batch = 2;
  options.seed = 9;
  options.optimizer.lr = 2e-3f;
  auto reference = compute::TrainLocal(options, RepetitiveText());
  ASSERT_THAT(reference.status(), IsOk());
  std::vector<double> want;
  for (const compute::StepStats& s : *reference) want.push_back(s.loss);
  EXPECT_EQ(losses_of("9", "2e-3"), want);
  EXPECT_NE(losses_of("10", "2e-3"), want);
  const std::vector<double> other_lr = losses_of("9", "1e-2");
  ASSERT_EQ(other_lr.size(), 3u);
  EXPECT_EQ(other_lr[0], want[0]);  // the same weights and batch before the first update
  EXPECT_NE(other_lr[2], want[2]);
}

TEST(TrainLocalVerbTest, ReadableOutputHasAStepLineEachAndASummary) {
  TempDir dir;
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, RepetitiveText());
  CliRun r = Cli({"train-local", "--model", kTinyModel, "--text", text, "--steps", "3", "--batch",
                  "2", "--threads", "2"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("training 3 steps of 2 rows x 16 tokens"));
  EXPECT_THAT(r.out, HasSubstr("step 1/3  loss 5."));
  EXPECT_THAT(r.out, HasSubstr("step 3/3  loss "));
  EXPECT_THAT(r.out, HasSubstr("tokens/s"));
  EXPECT_THAT(r.out, HasSubstr("done: 3 steps in "));
}

TEST(TrainLocalVerbTest, BadInputsExitTwoNamingTheFieldFlagOrPath) {
  TempDir dir;
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, RepetitiveText());
  const std::string short_text = dir.File("short.txt");
  WriteFileOrDie(short_text, "0123456789");
  const std::vector<std::string> ok = {"--model", kTinyModel, "--text", text};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = ok;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::vector<UsageCase> cases = {
      {with({"--batch", "2"}), "--steps N is required"},
      {with({"--steps", "2"}), "--batch B is required"},
      {with({"--steps", "2", "--batch", "2", "--lr", "0"}), "--lr must be a finite number > 0"},
      {with({"--steps", "2", "--batch", "2", "--lr", "fast"}), "--lr"},
      {with({"--steps", "2", "--batch", "2", "--threads", "0"}), "--threads must be >= 1"},
      {with({"--steps", "2", "--batch", "2", "--seed", "-3"}), "--seed must be >= 0"},
      {with({"--steps", "2", "--batch", "2", "--precision", "fp16"}),
       "--precision: unknown precision 'fp16'; accepted: fp32, bf16"},
      {with({"--steps", "2", "--batch", "2", "--threads", "5000"}),
       "--threads 5000 is more than 1024"},
      {{"--model", kTinyModel, "--text", short_text, "--steps", "1", "--batch", "1"},
       short_text + " has 10 bytes; a row of seq_len 16 + 1 bytes needs at least 17"},
      {{"--model", kTinyModel, "--text", dir.File("nope.txt"), "--steps", "1", "--batch", "1"},
       "cannot read " + dir.File("nope.txt")},
      {{"--model", kTinyModel, "--steps", "1", "--batch", "1"}, "--text FILE is required"},
      {{"--text", text, "--steps", "1", "--batch", "1"}, "--model is required"},
      {{"--model", R"({"seq_len":16,"d_model":32,"n_heads":4,"layers":1})", "--text", text,
        "--steps", "1", "--batch", "1"},
       "unknown field 'layers'"},
      {{"--model", R"({"vocab_size":64,"seq_len":16,"d_model":32,"n_heads":4,"n_layers":1})",
        "--text", text, "--steps", "1", "--batch", "1"},
       "is outside the vocabulary (model.vocab_size 64)"},
  };
  ExpectUsageErrors("train-local", cases);
  // A --save into a missing folder is refused before training, not after.
  const std::string missing_folder = dir.File("no/such/folder/t.safetensors");
  ExpectUsageErrors("train-local",
                    {{with({"--steps", "1", "--batch", "1", "--save", missing_folder}),
                      "--save " + missing_folder + ": the folder"}});
  // A path that cannot be written for another reason (here, a folder) fails the run.
  std::vector<std::string> args = with({"--steps", "1", "--batch", "1", "--save", dir.path()});
  args.insert(args.begin(), "train-local");
  CliRun r = Cli(args);
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.err, HasSubstr("--save: cannot write " + dir.path()));
}

TEST(LocalVerbsTest, HelpTellsEachVerbsFlagsAndTheTopLevelListsThem) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> verbs = {
      {"init", {"--model JSON", "--seed S", "--out FILE", "vocab_size defaults to 256"}},
      {"eval",
       {"--checkpoint FILE", "--text FILE", "--batch B", "--grads-out FILE", "--json",
        "row[1:T+1]"}},
      {"train-local",
       {"--model JSON", "--text FILE", "--steps N", "--batch B", "--seed S", "--lr X",
        "--threads N", "--save FILE", "--json", "tokens_per_s"}},
  };
  for (const auto& [verb, needles] : verbs) {
    CliRun r = Cli({verb, "--help"});
    EXPECT_EQ(r.code, kExitOk) << verb;
    for (const std::string& n : needles) EXPECT_THAT(r.out, HasSubstr(n)) << verb;
  }
  CliRun r = Cli({"--help"});
  EXPECT_THAT(r.out, HasSubstr("train-local"));
  EXPECT_THAT(r.out, HasSubstr("init "));
  EXPECT_THAT(r.out, HasSubstr("eval "));
}

}  // namespace
}  // namespace pipetrain::client
