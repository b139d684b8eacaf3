// Hugging Face GPT-2 folders in and out (common/model/hf_folder.h with the GPT-2 family's
// hf_gpt2.h, `pipetrain export-hf`),
// against testdata/hf_gpt2/, which make_hf_fixture.py wrote with an independent float64
// PyTorch GPT-2: the folders read as the right config and tensors, `pipetrain eval` gives
// PyTorch's loss and the model its logits, every bad folder is refused naming the file and
// the tensor or field, and an export holds exactly what GPT2LMHeadModel expects and reads
// back identical (fp32) or rounded to nearest even (--dtype bf16).
#include "common/model/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "client/cli.h"
#include "common/bf16.h"
#include "common/model/checkpoint.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/gpt2_family.h"
#include "common/model/hf_folder.h"
#include "common/safetensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/reference_ops.h"
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
using ::testing::Not;

// config.json is checked against the figures the compute library computes with.
static_assert(kLayerNormEpsilon == compute::reference::kLayerNormEps);

std::string Folder(const std::string& variant) {
  return std::string(PIPETRAIN_TESTDATA_DIR) + "/hf_gpt2/" + variant;
}

const nlohmann::json& Expected(const std::string& variant) {
  static const nlohmann::json all = nlohmann::json::parse(
      ReadFileOrDie(std::string(PIPETRAIN_TESTDATA_DIR) + "/hf_gpt2/expected.json"));
  return all["folders"][variant];
}

TransformerConfig ExpectedConfig(const std::string& variant) {
  const nlohmann::json& c = Expected(variant)["config"];
  return {.vocab_size = c["vocab_size"],
          .seq_len = c["n_positions"],
          .d_model = c["n_embd"],
          .n_heads = c["n_head"],
          .n_layers = c["n_layer"],
          .tie_embeddings = c["tied"]};
}

// The tensors GPT2LMHeadModel has for a config, as its state dict names and shapes them,
// written from the GPT-2 architecture (not from transformer_config.cc): token and position
// embeddings, per block two LayerNorms, the fused qkv and output Conv1D of attention and
// the two Conv1D of the MLP (weights [in, out]), the final LayerNorm, and the output
// projection [vocab, n_embd] unless it is wte itself.
std::map<std::string, std::vector<int64_t>> Gpt2LmHeadModelTensors(const TransformerConfig& c) {
  const int64_t V = c.vocab_size, P = c.seq_len, E = c.d_model;
  std::map<std::string, std::vector<int64_t>> t = {{"transformer.wte.weight", {V, E}},
                                                   {"transformer.wpe.weight", {P, E}},
                                                   {"transformer.ln_f.weight", {E}},
                                                   {"transformer.ln_f.bias", {E}}};
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    t[h + "ln_1.weight"] = {E};
    t[h + "ln_1.bias"] = {E};
    t[h + "attn.c_attn.weight"] = {E, 3 * E};
    t[h + "attn.c_attn.bias"] = {3 * E};
    t[h + "attn.c_proj.weight"] = {E, E};
    t[h + "attn.c_proj.bias"] = {E};
    t[h + "ln_2.weight"] = {E};
    t[h + "ln_2.bias"] = {E};
    t[h + "mlp.c_fc.weight"] = {E, 4 * E};
    t[h + "mlp.c_fc.bias"] = {4 * E};
    t[h + "mlp.c_proj.weight"] = {4 * E, E};
    t[h + "mlp.c_proj.bias"] = {E};
  }
  if (!c.tie_embeddings) t["lm_head.weight"] = {V, E};
  return t;
}

double Sum(const common::Tensor& t) {
  double s = 0;
  for (float v : t.data<float>()) s += v;
  return s;
}

// The folder's tensors equal what PyTorch stored: names, shapes and exact sums.
void ExpectTheFixtureTensors(const Checkpoint& c, const std::string& variant) {
  const nlohmann::json& tensors = Expected(variant)["tensors"];
  std::set<std::string> want, got;
  for (const auto& [name, t] : tensors.items()) want.insert(name);
  for (const auto& [name, t] : c.params) got.insert(name);
  EXPECT_EQ(got, want);
  for (const auto& [name, t] : tensors.items()) {
    auto it = c.params.find(name);
    if (it == c.params.end()) continue;
    EXPECT_EQ(it->second.dtype(), common::DType::kF32) << name;
    EXPECT_EQ(it->second.shape(), t["shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_NEAR(Sum(it->second), t["sum"].get<double>(), 1e-9) << name;
  }
}

TEST(HfGpt2ReadTest, TiedFolderWithoutPrefixAndWithBuffersReadsAsGpt2) {
  auto c = LoadHfFolder(Folder("tied"));
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->config, ExpectedConfig("tied"));
  EXPECT_TRUE(c->config.tie_embeddings);  // config.json has no tie_word_embeddings
  EXPECT_EQ(c->layer_begin, 0);
  EXPECT_EQ(c->layer_end, c->config.n_layers + 2);
  EXPECT_FALSE(c->optimizer.has_value());
  EXPECT_EQ(c->params.count(kOutputHeadName), 0u);
  ExpectTheFixtureTensors(*c, "tied");
}

TEST(HfGpt2ReadTest, ShardedUntiedHalfPrecisionFolderWidensExactly) {
  auto c = LoadHfFolder(Folder("untied"));
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->config, ExpectedConfig("untied"));
  EXPECT_FALSE(c->config.tie_embeddings);
  EXPECT_EQ(c->params.count(kOutputHeadName), 1u);
  ExpectTheFixtureTensors(*c,
                          "untied");  // F16 and BF16 sums, exact after widening
}

TEST(HfGpt2ReadTest, LoadWholeCheckpointRecognisesHfFolders) {
  for (const std::string variant : {"tied", "untied"}) {
    EXPECT_TRUE(IsHfFolder(Folder(variant))) << variant;
    auto whole = LoadWholeCheckpoint(Folder(variant), "init_from");
    ASSERT_THAT(whole.status(), IsOk()) << variant;
    auto direct = LoadHfFolder(Folder(variant));
    ASSERT_THAT(direct.status(), IsOk());
    EXPECT_EQ(whole->config, direct->config);
    EXPECT_TRUE(IdenticalParams(whole->params, direct->params)) << variant;
  }
}

// A pipetrain checkpoint folder with a config.json dropped in stays a pipetrain folder: its
// index names pipetrain checkpoints, which keep the optimizer state.
TEST(HfGpt2ReadTest, PipetrainFolderWithAConfigJsonStaysPipetrain) {
  TempDir dir;
  auto hf = LoadHfFolder(Folder("tied"));
  ASSERT_THAT(hf.status(), IsOk());
  Checkpoint whole = std::move(*hf);
  whole.optimizer.emplace().step = 3;
  for (const auto& [name, t] : whole.params) {
    whole.optimizer->m.emplace(name, t.Clone());
    whole.optimizer->v.emplace(name, t.Clone());
  }
  auto bytes = SerializeCheckpoint(whole);
  ASSERT_THAT(bytes.status(), IsOk());
  const std::string ckpt = dir.File("ckpt");
  ASSERT_THAT(WriteCheckpointFolder(ckpt, {{0, 0, *bytes}}, 1), IsOk());
  fs::copy_file(Folder("tied") + "/config.json", ckpt + "/config.json");
  EXPECT_FALSE(IsHfFolder(ckpt));
  auto back = LoadWholeCheckpoint(ckpt, "init_from");
  ASSERT_THAT(back.status(), IsOk());
  ASSERT_TRUE(back->optimizer.has_value());
  EXPECT_EQ(back->optimizer->step, 3);
}

TEST(HfGpt2ReadTest, NCtxStandsInForAMissingNPositions) {
  nlohmann::json j = nlohmann::json::parse(ReadFileOrDie(Folder("tied") + "/config.json"));
  j.erase("n_positions");
  j["n_ctx"] = 12;
  auto c = ParseHfGpt2Config(j.dump(), "config.json");
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->seq_len, 12);
}

// ---- the numbers, against PyTorch -----------------------------------------------------

TEST(HfGpt2EvalTest, EvalOfTheFolderGivesPyTorchsLoss) {
  for (const std::string variant : {"tied", "untied"}) {
    TempDir dir;
    const std::string text = dir.File("text.txt");
    WriteFileOrDie(text, Expected(variant)["text"].get<std::string>());
    const std::string rows = std::to_string(Expected(variant)["rows"].get<int>());
    CliRun r =
        Cli({"eval", "--checkpoint", Folder(variant), "--text", text, "--batch", rows, "--json"});
    ASSERT_EQ(r.code, client::kExitOk) << variant << ": " << r.err;
    const double got = nlohmann::json::parse(r.out)["loss"].get<double>();
    const double want = Expected(variant)["loss"].get<double>();
    EXPECT_LT(std::abs(got - want) / want, 1e-5) << variant << ": " << got << " vs " << want;
  }
}

// The compute library gives no logits, only the mean cross-entropy of a row. Changing the
// target of position t alone from y to v changes a row's loss by (logit[t][y] -
// logit[t][v]) / T, so the losses give every logit at t up to one constant (softmax sees no
// more): compare logit[t][v] - logit[t][y] with PyTorch's.
TEST(HfGpt2EvalTest, LogitsMatchPyTorchsUpToEachPositionsConstant) {
  for (const std::string variant : {"tied", "untied"}) {
    auto ckpt = LoadHfFolder(Folder(variant));
    ASSERT_THAT(ckpt.status(), IsOk());
    const TransformerConfig& config = ckpt->config;
    const int T = config.seq_len, V = config.vocab_size;
    auto backend = compute::CpuBackend::Create(1);
    ASSERT_THAT(backend.status(), IsOk());
    auto chunk =
        compute::ModelChunk::Create(config, 0, config.num_pipeline_layers(), backend->get());
    ASSERT_THAT(chunk.status(), IsOk());
    ASSERT_THAT(compute::RestoreChunk(*ckpt, **chunk), IsOk());
    const std::string text = Expected(variant)["text"];
    std::vector<int32_t> inputs(text.begin(), text.begin() + T);
    const std::vector<int32_t> targets(text.begin() + 1, text.begin() + T + 1);
    compute::BackendT<float>* be = backend->get();
    const size_t bytes = T * sizeof(int32_t);
    auto in = compute::BackendBuffer<float>::Allocate(be, bytes);
    auto tg = compute::BackendBuffer<float>::Allocate(be, bytes);
    auto loss = compute::BackendBuffer<float>::Allocate(be, sizeof(float));
    ASSERT_TRUE(in.ok() && tg.ok() && loss.ok());
    ASSERT_THAT(be->CopyFromHost(in->raw(), inputs.data(), bytes), IsOk());
    auto row_loss = [&](const std::vector<int32_t>& t) {
      EXPECT_THAT(be->CopyFromHost(tg->raw(), t.data(), bytes), IsOk());
      EXPECT_THAT((*chunk)->Evaluate(1, in->raw(), tg->ints(), loss->data()), IsOk());
      float value = 0;
      EXPECT_THAT(be->CopyToHost(&value, loss->data(), sizeof(float)), IsOk());
      return double{value};
    };
    const double base = row_loss(targets);
    int compared = 0;
    for (const auto& [position, logits] : Expected(variant)["logits_row0"].items()) {
      const int t = std::stoi(position);
      ASSERT_EQ(logits.size(), static_cast<size_t>(V));
      const double at_target = logits[targets[t]].get<double>();
      double worst = 0;
      for (int v = 0; v < V; ++v) {
        std::vector<int32_t> changed = targets;
        changed[t] = v;
        const double got = -T * (row_loss(changed) - base);
        worst = std::max(worst, std::abs(got - (logits[v].get<double>() - at_target)));
      }
      // The float32 loss (about 6, rounding near 5e-7) times T = 16: errors of about 1e-5.
      EXPECT_LT(worst, 5e-5) << variant << " position " << t;
      ++compared;
    }
    EXPECT_EQ(compared, 3) << variant;
  }
}

// ---- bad folders ----------------------------------------------------------------------

// A copy of a fixture folder to spoil.
std::string CopyOf(const std::string& variant, const TempDir& dir) {
  const std::string to = dir.File(variant);
  fs::copy(Folder(variant), to, fs::copy_options::recursive);
  return to;
}

void EditConfig(const std::string& folder, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(ReadFileOrDie(folder + "/config.json"));
  edit(j);
  WriteFileOrDie(folder + "/config.json", j.dump(2));
}

// Rewrites one safetensors file of a folder with its tensors edited.
void EditTensors(const std::string& file,
                 const std::function<void(std::vector<common::NamedTensor>&)>& edit) {
  auto contents = common::ReadSafetensorsFile(file);
  ASSERT_THAT(contents.status(), IsOk());
  edit(contents->tensors);
  std::vector<common::SafetensorsView> views;
  for (const common::NamedTensor& t : contents->tensors) {
    views.push_back(common::ViewOf(t.name, t.tensor));
  }
  ASSERT_THAT(common::WriteSafetensorsFile(file, views, contents->metadata), IsOk());
}

common::Tensor& Named(std::vector<common::NamedTensor>& tensors, const std::string& name) {
  for (common::NamedTensor& t : tensors) {
    if (t.name == name) return t.tensor;
  }
  ADD_FAILURE() << "no tensor " << name;
  return tensors.front().tensor;
}

common::Tensor Filled(common::DType dtype, std::vector<int64_t> shape) {
  common::Tensor t = *common::Tensor::Create(dtype, std::move(shape));
  std::memset(t.bytes().data(), 0, t.num_bytes());
  return t;
}

struct BadCase {
  std::string what;
  std::function<void(const std::string& folder)> spoil;
  std::vector<std::string> message;        // every piece must be in the error (after the path)
  std::string file = "model.safetensors";  // the file the error must name ("": the folder)
};

TEST(HfGpt2ReadTest, EveryBadFolderIsRefusedNamingTheFileAndTheTensorOrField) {
  const std::string weights = "model.safetensors";
  const std::vector<BadCase> cases = {
      {"missing config field",
       [](const std::string& f) { EditConfig(f, [](nlohmann::json& j) { j.erase("n_embd"); }); },
       {"n_embd is missing"},
       "config.json"},
      {"config field of the wrong type",
       [](const std::string& f) { EditConfig(f, [](nlohmann::json& j) { j["n_head"] = "2"; }); },
       {"n_head must be a positive integer"},
       "config.json"},
      {"other GELU",
       [](const std::string& f) {
         EditConfig(f, [](nlohmann::json& j) { j["activation_function"] = "gelu"; });
       },
       {"activation_function is \"gelu\""},
       "config.json"},
      {"other LayerNorm epsilon",
       [](const std::string& f) {
         EditConfig(f, [](nlohmann::json& j) { j["layer_norm_epsilon"] = 1e-6; });
       },
       {"layer_norm_epsilon"},
       "config.json"},
      {"not GPT-2",
       [](const std::string& f) {
         EditConfig(f, [](nlohmann::json& j) { j["model_type"] = "mistral"; });
       },
       {"model_type is \"mistral\""},
       "config.json"},
      {"unscaled attention",
       [](const std::string& f) {
         EditConfig(f, [](nlohmann::json& j) { j["scale_attn_weights"] = false; });
       },
       {"scale_attn_weights is false"},
       "config.json"},
      {"wider MLP",
       [](const std::string& f) { EditConfig(f, [](nlohmann::json& j) { j["n_inner"] = 32; }); },
       {"n_inner is 32"},
       "config.json"},
      {"wrong shape",
       [&](const std::string& f) {
         EditTensors(f + "/" + weights, [](std::vector<common::NamedTensor>& t) {
           Named(t, "h.0.mlp.c_fc.weight") = Filled(common::DType::kF32, {64, 16});
         });
       },
       {"transformer.h.0.mlp.c_fc.weight has shape (64, 16), want (16, 64)",
        "names shown with the transformer. prefix"}},
      {"missing tensor",
       [&](const std::string& f) {
         EditTensors(f + "/" + weights, [](std::vector<common::NamedTensor>& t) {
           std::erase_if(t, [](const common::NamedTensor& n) { return n.name == "h.1.ln_2.bias"; });
         });
       },
       {"missing 1 tensor(s): transformer.h.1.ln_2.bias"}},
      {"unexpected tensor",
       [&](const std::string& f) {
         EditTensors(f + "/" + weights, [](std::vector<common::NamedTensor>& t) {
           t.push_back({"h.0.attn.rotary", Filled(common::DType::kF32, {4})});
         });
       },
       {"1 unexpected tensor(s): h.0.attn.rotary"}},
      {"bad dtype",
       [&](const std::string& f) {
         EditTensors(f + "/" + weights, [](std::vector<common::NamedTensor>& t) {
           Named(t, "ln_f.bias") = Filled(common::DType::kI32, {16});
         });
       },
       {"transformer.ln_f.bias has dtype I32, want F32, F16 or BF16"}},
      {"tied head that differs",
       [&](const std::string& f) {
         EditTensors(f + "/" + weights, [](std::vector<common::NamedTensor>& t) {
           common::Tensor head = Named(t, "wte.weight").Clone();
           head.data<float>()[5] += 1;
           t.push_back({"lm_head.weight", std::move(head)});
         });
       },
       {"lm_head.weight ('lm_head.weight') differs from transformer.wte.weight "
        "('wte.weight')",
        "tie_word_embeddings true"}},
      {"untied without a head",
       [](const std::string& f) {
         EditConfig(f, [](nlohmann::json& j) { j["tie_word_embeddings"] = false; });
       },
       {"missing 1 tensor(s): lm_head.weight"}},
      {"both spellings of one tensor",
       [&](const std::string& f) {
         EditTensors(f + "/" + weights, [](std::vector<common::NamedTensor>& t) {
           t.push_back({"transformer.wpe.weight", Named(t, "wpe.weight").Clone()});
         });
       },
       {"tensor transformer.wpe.weight is given twice"}},
      {"no weights",
       [&](const std::string& f) { fs::remove(f + "/" + weights); },
       {"neither model.safetensors nor model.safetensors.index.json"},
       ""},
  };
  for (const BadCase& c : cases) {
    TempDir dir;
    const std::string folder = CopyOf("tied", dir);
    c.spoil(folder);
    auto loaded = LoadWholeCheckpoint(folder, "init_from");
    std::vector<::testing::Matcher<const std::string&>> pieces = {
        HasSubstr("init_from: "), HasSubstr(c.file.empty() ? folder : folder + "/" + c.file)};
    for (const std::string& m : c.message) pieces.push_back(HasSubstr(m));
    EXPECT_THAT(loaded.status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::AllOfArray(pieces)))
        << c.what;
  }
}

TEST(HfGpt2ReadTest, ShardedFolderErrorsNameTheIndexOrTheShard) {
  TempDir dir;
  const std::string folder = CopyOf("untied", dir);
  const std::string shard = folder + "/model-00002-of-00002.safetensors";
  EditTensors(shard, [](std::vector<common::NamedTensor>& t) {
    std::erase_if(t, [](const common::NamedTensor& n) { return n.name == "lm_head.weight"; });
  });
  EXPECT_THAT(LoadHfFolder(folder).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(folder + "/model.safetensors.index.json"),
                             HasSubstr("missing 1 tensor(s): lm_head.weight"))));
  fs::remove(shard);
  EXPECT_THAT(LoadHfFolder(folder).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(shard)));
}

TEST(HfGpt2ReadTest, AnIndexEntryOutsideTheFolderIsRefused) {
  TempDir dir;
  const std::string folder = CopyOf("untied", dir);
  const std::string index = folder + "/model.safetensors.index.json";
  WriteFileOrDie(index, R"({"weight_map": {"lm_head.weight": "../untied/x.safetensors"}})");
  EXPECT_THAT(LoadHfFolder(folder).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(index), HasSubstr("not the name of a file in " + folder))));
}

TEST(HfGpt2ReadTest, ATiedHeadEqualToWteIsDropped) {
  TempDir dir;
  const std::string folder = CopyOf("tied", dir);
  EditTensors(folder + "/model.safetensors", [](std::vector<common::NamedTensor>& t) {
    t.push_back({"lm_head.weight", Named(t, "wte.weight").Clone()});
  });
  auto c = LoadHfFolder(folder);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_TRUE(c->config.tie_embeddings);
  EXPECT_EQ(c->params.count(kOutputHeadName), 0u);
}

TEST(HfGpt2EvalTest, EvalOfABadFolderExitsTwoNamingIt) {
  TempDir dir;
  const std::string folder = CopyOf("tied", dir);
  EditConfig(folder, [](nlohmann::json& j) { j.erase("vocab_size"); });
  const std::string text = dir.File("text.txt");
  WriteFileOrDie(text, Expected("tied")["text"].get<std::string>());
  CliRun r = Cli({"eval", "--checkpoint", folder, "--text", text, "--batch", "1"});
  EXPECT_EQ(r.code, client::kExitUsage);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--checkpoint: "), HasSubstr(folder + "/config.json"),
                           HasSubstr("vocab_size is missing")));
}

// ---- the seq_len rule -------------------------------------------------------------------

TEST(FitCheckpointToModelTest, AShorterJobTakesTheFirstRowsOfWpeAndNothingElseMayDiffer) {
  auto hf = LoadHfFolder(Folder("tied"));
  ASSERT_THAT(hf.status(), IsOk());
  TransformerConfig job = hf->config;
  job.seq_len = 8;
  const common::Tensor wpe = hf->params.at(kPositionEmbeddingName).Clone();
  auto fit = FitCheckpointToModel(std::move(*hf), job, "init_from: 'x'");
  ASSERT_THAT(fit.status(), IsOk());
  EXPECT_EQ(fit->config, job);
  const common::Tensor& rows = fit->params.at(kPositionEmbeddingName);
  ASSERT_EQ(rows.shape(), (std::vector<int64_t>{8, job.d_model}));
  EXPECT_EQ(std::memcmp(rows.bytes().data(), wpe.bytes().data(), rows.num_bytes()), 0);
  EXPECT_THAT(ValidateParams(job, 0, job.num_pipeline_layers(), fit->params, "fit"), IsOk());

  const TransformerConfig file = ExpectedConfig("tied");
  auto refused = [&](auto change, const std::string& message) {
    auto again = LoadHfFolder(Folder("tied"));
    ASSERT_THAT(again.status(), IsOk());
    TransformerConfig want = file;
    change(want);
    EXPECT_THAT(FitCheckpointToModel(std::move(*again), want, "init_from: 'x'").status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("init_from: 'x'"), HasSubstr(message))));
  };
  refused([](TransformerConfig& c) { c.seq_len = 32; },
          "model.seq_len is 16 in the checkpoint but 32 is expected");
  refused([](TransformerConfig& c) { c.d_model = 32; }, "model.d_model is 16");
  refused([](TransformerConfig& c) { c.vocab_size = 256; }, "model.vocab_size is 128");
  refused([](TransformerConfig& c) { c.tie_embeddings = false; }, "model.tie_embeddings is true");
}

// ---- out ------------------------------------------------------------------------------

// What a folder export-hf wrote holds: the tensors GPT2LMHeadModel has, all of `dtype`
// (which config.json's torch_dtype names), format pt.
void ExpectAGpt2LmHeadModelFolder(const std::string& dir, const TransformerConfig& config,
                                  common::DType dtype = common::DType::kF32) {
  auto header = common::ReadSafetensorsHeader(dir + "/model.safetensors");
  ASSERT_THAT(header.status(), IsOk());
  std::map<std::string, std::vector<int64_t>> got;
  for (const common::SafetensorsEntry& e : header->entries) {
    got[e.name] = e.shape;
    EXPECT_EQ(e.dtype, dtype) << e.name;
  }
  EXPECT_EQ(got, Gpt2LmHeadModelTensors(config));
  EXPECT_EQ(header->metadata, (common::SafetensorsMetadata{{"format", "pt"}}));

  const nlohmann::json j = nlohmann::json::parse(ReadFileOrDie(dir + "/config.json"));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["vocab_size"], config.vocab_size);
  EXPECT_EQ(j["n_positions"], config.seq_len);
  EXPECT_EQ(j["n_ctx"], config.seq_len);
  EXPECT_EQ(j["n_embd"], config.d_model);
  EXPECT_EQ(j["n_layer"], config.n_layers);
  EXPECT_EQ(j["n_head"], config.n_heads);
  EXPECT_TRUE(j["n_inner"].is_null());
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(j["tie_word_embeddings"], config.tie_embeddings);
  EXPECT_EQ(j["initializer_range"], 0.02);
  for (const char* dropout : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
    EXPECT_EQ(j[dropout], 0.0) << dropout;
  }
  EXPECT_EQ(j["torch_dtype"], dtype == common::DType::kBF16 ? "bfloat16" : "float32");
}

// `params` with every value rounded to the nearest bf16 (common/bf16.h), held in F32.
ParamMap RoundedToBf16(const ParamMap& params) {
  ParamMap out;
  for (const auto& [name, t] : params) {
    common::Tensor rounded = t.Clone();
    for (float& v : rounded.data<float>()) v = common::RoundToBf16(v);
    out.emplace(name, std::move(rounded));
  }
  return out;
}

TEST(ExportHfTest, HfFoldersRoundTripIdentically) {
  for (const std::string variant : {"tied", "untied"}) {
    TempDir dir;
    const std::string out = dir.File("export");
    CliRun r = Cli({"export-hf", Folder(variant), "--out", out});
    ASSERT_EQ(r.code, client::kExitOk) << variant << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("wrote " + out + ": config.json and model.safetensors in fp32"));
    ExpectAGpt2LmHeadModelFolder(out, ExpectedConfig(variant));
    auto original = LoadHfFolder(Folder(variant));
    auto back = LoadWholeCheckpoint(out, "CHECKPOINT");
    ASSERT_THAT(original.status(), IsOk());
    ASSERT_THAT(back.status(), IsOk());
    EXPECT_EQ(back->config, original->config);
    EXPECT_TRUE(IdenticalParams(back->params, original->params)) << variant;
    EXPECT_EQ(testing::ListFolder(out),
              (std::vector<std::string>{"config.json", "model.safetensors"}));
  }
}

// A job's checkpoint folder with optimizer state (three stages' files) and one whole-model
// file both export without the optimizer.
TEST(ExportHfTest, PipetrainCheckpointsExportWithoutOptimizerState) {
  TempDir dir;
  for (bool tied : {true, false}) {
    auto hf = LoadHfFolder(Folder(tied ? "tied" : "untied"));
    ASSERT_THAT(hf.status(), IsOk());
    Checkpoint whole = std::move(*hf);
    whole.optimizer.emplace().step = 5;
    for (const auto& [name, t] : whole.params) {
      whole.optimizer->m.emplace(name, t.Clone());
      whole.optimizer->v.emplace(name, t.Clone());
    }
    const std::string tag = tied ? "tied" : "untied";
    const int L = whole.config.num_pipeline_layers();
    std::vector<ChunkFile> files;
    const std::vector<std::pair<int, int>> ranges = {{0, 1}, {1, L - 1}, {L - 1, L}};
    for (size_t s = 0; s < ranges.size(); ++s) {
      auto part = SliceCheckpoint(whole, ranges[s].first, ranges[s].second);
      ASSERT_THAT(part.status(), IsOk());
      auto bytes = SerializeCheckpoint(*part);
      ASSERT_THAT(bytes.status(), IsOk());
      files.push_back({static_cast<int>(s), 0, *bytes});
    }
    const std::string folder = dir.File("ckpt-" + tag);
    ASSERT_THAT(WriteCheckpointFolder(folder, files, 1), IsOk());
    const std::string file = dir.File(tag + ".safetensors");
    ASSERT_THAT(SaveCheckpoint(file, whole), IsOk());
    for (const std::string& input : {folder, file}) {
      const std::string out = dir.File("hf-" + tag + "-" + fs::path(input).filename().string());
      CliRun r = Cli({"export-hf", input, "--out", out});
      ASSERT_EQ(r.code, client::kExitOk) << input << ": " << r.err;
      EXPECT_THAT(r.out, HasSubstr("the optimizer state is left out"));
      ExpectAGpt2LmHeadModelFolder(out, whole.config);
      auto back = LoadHfFolder(out);
      ASSERT_THAT(back.status(), IsOk());
      EXPECT_FALSE(back->optimizer.has_value());
      EXPECT_TRUE(IdenticalParams(back->params, whole.params)) << input;
    }
  }
}

// --dtype bf16: every tensor BF16, torch_dtype bfloat16, and reading the folder back
// (which widens BF16 exactly) gives each weight rounded to the nearest bf16; from a
// pipetrain checkpoint trained in bf16 (fp32 master weights) as from any other.
TEST(ExportHfTest, Bf16ExportsRoundEveryWeightToNearestEven) {
  TempDir dir;
  for (const std::string variant : {"tied", "untied"}) {
    auto original = LoadHfFolder(Folder(variant));
    ASSERT_THAT(original.status(), IsOk());
    Checkpoint trained = std::move(*original);
    trained.precision = "bf16";
    const std::string file = dir.File(variant + ".safetensors");
    ASSERT_THAT(SaveCheckpoint(file, trained), IsOk());
    const std::string out = dir.File("bf16-" + variant);
    CliRun r = Cli({"export-hf", file, "--out", out, "--dtype", "bf16"});
    ASSERT_EQ(r.code, client::kExitOk) << variant << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("wrote " + out + ": config.json and model.safetensors in bf16"));
    ExpectAGpt2LmHeadModelFolder(out, trained.config, common::DType::kBF16);
    auto back = LoadWholeCheckpoint(out, "CHECKPOINT");
    ASSERT_THAT(back.status(), IsOk());
    EXPECT_EQ(back->config, trained.config);
    EXPECT_TRUE(IdenticalParams(back->params, RoundedToBf16(trained.params))) << variant;
    EXPECT_FALSE(IdenticalParams(back->params, trained.params)) << "nothing was rounded";
  }
}

// The rounding is to nearest with ties to even, not truncation: values half-way between
// two bf16s (1 + 2^-8 lies between 1 and 1 + 2^-7) go to the even one.
TEST(ExportHfTest, Bf16ExportRoundsTiesToEven) {
  auto hf = LoadHfFolder(Folder("tied"));
  ASSERT_THAT(hf.status(), IsOk());
  std::span<float> wte = hf->params.at("transformer.wte.weight").data<float>();
  const std::vector<float> given = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f),
                                    1.0f + 0x1p-9f, 1.0f + 0x1p-8f + 0x1p-20f};
  const std::vector<float> want = {1.0f, 1.0f + 0x1p-6f, -1.0f, 1.0f, 1.0f + 0x1p-7f};
  std::copy(given.begin(), given.end(), wte.begin());
  TempDir dir;
  ASSERT_THAT(ExportHfFolder(*hf, dir.File("out"), *HfWeightsDTypeNamed("bf16")), IsOk());
  auto back = LoadHfFolder(dir.File("out"));
  ASSERT_THAT(back.status(), IsOk());
  std::span<const float> got = back->params.at("transformer.wte.weight").data<float>();
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + want.size()), want);
  EXPECT_THAT(HfWeightsDTypeNamed("fp16").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown dtype 'fp16'; accepted: fp32, bf16")));
}

TEST(ExportHfTest, UsageAndBadInputExitTwoAndWriteFailuresOne) {
  TempDir dir;
  CliRun help = Cli({"export-hf", "--help"});
  EXPECT_EQ(help.code, client::kExitOk);
  EXPECT_THAT(help.out, AllOf(HasSubstr("CHECKPOINT --out DIR"), HasSubstr("from_pretrained"),
                              HasSubstr("--dtype"), HasSubstr("BF16\nwith --dtype bf16"),
                              HasSubstr("LlamaForCausalLM.from_pretrained(DIR)")));
  EXPECT_THAT(Cli({"--help"}).out, HasSubstr("export-hf"));

  const std::string nope = dir.File("nope");
  const std::string garbage = dir.File("garbage.safetensors");
  WriteFileOrDie(garbage, "hello");
  auto hf = LoadHfFolder(Folder("tied"));
  ASSERT_THAT(hf.status(), IsOk());
  auto stage = SliceCheckpoint(*hf, 0, 2);
  ASSERT_THAT(stage.status(), IsOk());
  const std::string part = dir.File("stage-0.safetensors");
  ASSERT_THAT(SaveCheckpoint(part, *stage), IsOk());
  const std::string out = dir.File("out");
  const std::vector<std::pair<std::vector<std::string>, std::string>> usage = {
      {{"--out", out}, "CHECKPOINT is required"},
      {{Folder("tied")}, "--out"},
      {{Folder("tied"), Folder("untied"), "--out", out}, "takes one CHECKPOINT"},
      {{nope, "--out", out}, "CHECKPOINT: '" + nope + "' does not exist"},
      {{garbage, "--out", out}, garbage},
      {{part, "--out", out}, part + " holds pipeline layers [0, 2) of 4"},
      {{Folder("tied"), "--out", out, "--dtype", "fp16"},
       "--dtype: unknown dtype 'fp16'; accepted: fp32, bf16"},
  };
  for (const auto& [args, message] : usage) {
    std::vector<std::string> full = {"export-hf"};
    full.insert(full.end(), args.begin(), args.end());
    CliRun r = Cli(full);
    EXPECT_EQ(r.code, client::kExitUsage) << message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(message));
  }
  EXPECT_FALSE(fs::exists(out));

  const std::string blocker = dir.File("a_file");
  WriteFileOrDie(blocker, "x");
  CliRun r = Cli({"export-hf", Folder("tied"), "--out", blocker + "/sub"});
  EXPECT_EQ(r.code, client::kExitJobFailed) << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot write " + blocker + "/sub"));
}

}  // namespace
}  // namespace pipetrain::model
