// The golden comparison against an independent implementation: PyTorch (float64)
// computed the loss and every gradient of a tiny GPT-2 (testdata/make_gpt_fixture.py)
// and of a tiny Llama with grouped-query attention and llama3 rotary scaling
// (testdata/make_llama_fixture.py) on a fixed batch; the C++ model loaded from the same
// weights must match (loss relative error < 1e-5, each gradient tensor < 1e-4).
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/model/checkpoint.h"
#include "common/safetensors.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/trainer.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;

class PyTorchFixtureTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::string Dir() const { return std::string(PIPETRAIN_TESTDATA_DIR) + "/" + GetParam() + "/"; }
};

TEST_P(PyTorchFixtureTest, LossAndEveryGradientMatch) {
  std::ifstream in(Dir() + "expected.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json expected = nlohmann::json::parse(in);

  auto ckpt = model::LoadCheckpoint(Dir() + "weights.safetensors");
  ASSERT_THAT(ckpt.status(), IsOk());
  const model::TransformerConfig& config = ckpt->config;
  auto backend = CpuBackend::Create(1);
  ASSERT_THAT(backend.status(), IsOk());
  auto model = ModelChunk::Create(config, 0, config.num_pipeline_layers(), backend->get());
  ASSERT_THAT(model.status(), IsOk());
  for (const model::ParamSpec& p : (*model)->Params()) {
    const common::Tensor& t = ckpt->params.at(p.name);
    auto values = t.data<float>();
    ASSERT_THAT((*model)->SetParam(p.name, std::vector<float>(values.begin(), values.end())), IsOk())
        << p.name;
  }

  model::TokenBatch batch;
  batch.rows = expected["batch"].get<int>();
  for (const auto& row : expected["inputs"]) {
    for (int v : row) batch.inputs.push_back(v);
  }
  for (const auto& row : expected["targets"]) {
    for (int v : row) batch.targets.push_back(v);
  }
  ASSERT_EQ(batch.inputs.size(), static_cast<size_t>(batch.rows * config.seq_len));

  ASSERT_THAT((*model)->ZeroGrads(), IsOk());
  auto loss = LossAndGrads(**model, batch);
  ASSERT_THAT(loss.status(), IsOk());
  const double want = expected["loss"].get<double>();
  EXPECT_LT(std::abs(*loss - want) / std::abs(want), 1e-5) << *loss << " vs " << want;

  auto grads = common::ReadSafetensorsFile(Dir() + "grads.safetensors");
  ASSERT_THAT(grads.status(), IsOk());
  int compared = 0;
  for (const model::ParamSpec& p : (*model)->Params()) {
    const common::Tensor* ref = grads->Find(p.name);
    ASSERT_NE(ref, nullptr) << p.name;
    auto got = (*model)->GetGrad(p.name);
    ASSERT_THAT(got.status(), IsOk());
    auto r = ref->data<float>();
    ASSERT_EQ(got->size(), r.size()) << p.name;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      diff += std::pow(double{(*got)[i]} - r[i], 2);
      norm += std::pow(double{r[i]}, 2);
    }
    EXPECT_LT(std::sqrt(diff), 1e-4 * std::sqrt(norm) + 1e-9) << p.name;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(expected["tensors"].size()));
}

INSTANTIATE_TEST_SUITE_P(Families, PyTorchFixtureTest, ::testing::Values("gpt_tiny", "llama_tiny"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace pipetrain::compute
