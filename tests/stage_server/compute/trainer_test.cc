// The single-process trainer: batch sampling, a golden 10-step loss trajectory of a tiny
// model (tests/testdata/compute_golden_loss.txt, made by this code; regenerate with
// PIPETRAIN_UPDATE_GOLDEN=1 after an intended change), falling loss, and gradient
// accumulation and recomputation changing nothing.
#include "stage_server/compute/trainer.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/tolerance.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

// A deterministic text of English words (no files needed).
std::string Corpus() {
  const char* words[] = {"the ",   "quick ", "brown ", "fox ",  "jumps ", "over ",
                         "lazy ",  "dog ",   "and ",   "runs ", "away. ", "a ",
                         "small ", "cat ",   "sees ",  "it. "};
  std::string text;
  uint32_t state = 12345;
  while (text.size() < 20000) {
    state = state * 1664525u + 1013904223u;
    text += words[(state >> 16) % 16];
  }
  return text;
}

TrainOptions TinyOptions() {
  TrainOptions o;
  o.model = {
      .vocab_size = 256, .seq_len = 16, .d_model = 32, .n_heads = 4, .n_layers = 2};
  o.steps = 10;
  o.batch = 8;
  o.seed = 1;
  o.optimizer = {.lr = 1e-2f, .weight_decay = 0.1f, .grad_clip_norm = 1.0f};
  return o;
}

std::vector<double> Losses(const TrainOptions& o) {
  auto stats = TrainLocal(o, Corpus());
  EXPECT_THAT(stats, IsOk());
  std::vector<double> losses;
  if (stats.ok()) {
    for (const StepStats& s : *stats) {
      losses.push_back(s.loss);
      EXPECT_GT(s.tokens_per_second, 0);
    }
  }
  return losses;
}

TEST(TrainerTest, BatchesAreDeterministicShiftedRows) {
  const model::TransformerConfig c = TinyOptions().model;
  const std::string text = Corpus();
  auto a = model::SampleBatch(text, c, 4, 7, 3), b = model::SampleBatch(text, c, 4, 7, 3);
  auto other = model::SampleBatch(text, c, 4, 7, 4);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->inputs, b->inputs);
  EXPECT_NE(a->inputs, other->inputs);
  ASSERT_EQ(a->inputs.size(), 4u * 16);
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t + 1 < 16; ++t)
      EXPECT_EQ(a->targets[r * 16 + t], a->inputs[r * 16 + t + 1]);
  }
  auto lead = model::LeadingBatch("abcdefghijklmnopqrstuvwxyz0123456789", {256, 16, 32, 4, 2}, 2);
  ASSERT_THAT(lead, IsOk());
  EXPECT_EQ(lead->inputs[0], 'a');
  EXPECT_EQ(lead->targets[15], 'q');
  EXPECT_EQ(lead->inputs[16], 'r');  // the second row starts after T + 1 bytes
  EXPECT_THAT(model::LeadingBatch("short", c, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("need at least 17")));
}

TEST(TrainerTest, GoldenLossTrajectoryAndLossFalls) {
  const std::vector<double> losses = Losses(TinyOptions());
  ASSERT_EQ(losses.size(), 10u);
  EXPECT_NEAR(losses[0], std::log(256.0), 0.1);  // near-uniform predictions at init
  EXPECT_LT(losses[9], losses[0] - 1.0);
  const std::string path =
      std::string(PIPETRAIN_TESTDATA_DIR) + "/compute_golden_loss.txt";
  if (std::getenv("PIPETRAIN_UPDATE_GOLDEN") != nullptr) {
    std::ofstream out(path);
    out << "# step loss: trainer_test TinyOptions() on Corpus(), CPU backend\n";
    out.precision(9);
    for (size_t i = 0; i < losses.size(); ++i) out << i + 1 << " " << losses[i] << "\n";
    GTEST_SKIP() << "wrote " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing " << path;
  std::string line;
  std::vector<double> golden;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int step;
    double loss;
    fields >> step >> loss;
    golden.push_back(loss);
  }
  ASSERT_EQ(golden.size(), losses.size());
  // oneDNN picks kernels per CPU, so other machines round differently; Adam amplifies
  // that a little over ten steps.
  for (size_t i = 0; i < golden.size(); ++i) {
    EXPECT_NEAR(losses[i], golden[i], 1e-3 * golden[i]) << "step " << i + 1;
  }
}

TEST(TrainerTest, AccumulationAndRecomputeChangeNothing) {
  TrainOptions o = TinyOptions();
  o.steps = 4;
  const std::vector<double> base = Losses(o);
  o.recompute = true;
  EXPECT_EQ(Losses(o), base);
  o.recompute = false;
  o.micro_batches = 4;
  const std::vector<double> accumulated = Losses(o);
  ASSERT_EQ(accumulated.size(), base.size());
  // Accumulating over 4 micro-batches regroups each gradient's sum over the batch's
  // tokens and rounds the loss per micro-batch (tests/testing/tolerance.h).
  const std::vector<double> tolerances = ::pipetrain::testing::RegroupedTrainingTolerances(
      base, int64_t{o.batch} * o.model.seq_len,
      {.beta1 = o.optimizer.beta1, .beta2 = o.optimizer.beta2});
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_NEAR(accumulated[i], base[i], tolerances[i] * base[i]) << "step " << i + 1;
  }
  o.micro_batches = 3;
  EXPECT_THAT(TrainLocal(o, Corpus()), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("micro_batches (3)")));
}

}  // namespace
}  // namespace pipetrain::compute
