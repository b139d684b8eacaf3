// The C++ model against an independent implementation: tests/testdata/
// gpt_reference_tiny.txt holds weights, a batch, the float64 loss and finite-difference
// gradients of a pure-Python GPT-2 (make_gpt_reference.py, written from the model's
// definition, not from this code). Loss within 1e-5 relative, gradients within 1e-4.
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/trainer.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;

struct Fixture {
  model::TransformerConfig config;
  model::TokenBatch batch;
  std::vector<std::pair<std::string, std::vector<float>>> params;
  double loss = 0;
  struct Grad {
    std::string name;
    int64_t index;
    double value;
  };
  std::vector<Grad> grads;
};

Fixture Load() {
  Fixture f;
  std::ifstream in(std::string(PIPETRAIN_TESTDATA_DIR) + "/gpt_reference_tiny.txt");
  EXPECT_TRUE(in.good()) << "missing gpt_reference_tiny.txt";
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    if (kind == "config") {
      s >> f.config.vocab_size >> f.config.seq_len >> f.config.d_model >>
          f.config.n_heads >> f.config.n_layers;
    } else if (kind == "rows") {
      s >> f.batch.rows;
    } else if (kind == "tokens" || kind == "targets") {
      std::vector<int32_t>& out = kind == "tokens" ? f.batch.inputs : f.batch.targets;
      for (int32_t v; s >> v;) out.push_back(v);
    } else if (kind == "param") {
      std::string name;
      size_t n;
      s >> name >> n;
      std::vector<float> values(n);
      for (float& v : values) {
        double d;
        s >> d;
        v = static_cast<float>(d);
      }
      f.params.emplace_back(name, std::move(values));
    } else if (kind == "loss") {
      s >> f.loss;
    } else if (kind == "grad") {
      Fixture::Grad g;
      s >> g.name >> g.index >> g.value;
      f.grads.push_back(g);
    }
  }
  return f;
}

TEST(GptReferenceTest, LossAndGradientsMatchAnIndependentImplementation) {
  const Fixture f = Load();
  ASSERT_THAT(model::ValidateConfig(f.config), IsOk());
  ASSERT_EQ(f.batch.inputs.size(), size_t(f.batch.rows) * f.config.seq_len);
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  auto model = ModelChunk::Create(f.config, 0, f.config.num_pipeline_layers(), cpu->get());
  ASSERT_THAT(model, IsOk());
  ASSERT_EQ(f.params.size(), (*model)->Params().size()) << "every parameter, once";
  for (const auto& [name, values] : f.params) {
    ASSERT_THAT((*model)->SetParam(name, values), IsOk()) << name;
  }
  ASSERT_THAT((*model)->ZeroGrads(), IsOk());
  auto loss = LossAndGrads(**model, f.batch);
  ASSERT_THAT(loss, IsOk());
  EXPECT_NEAR(*loss, f.loss, 1e-5 * f.loss);
  ASSERT_EQ(f.grads.size(), 3 * f.params.size());
  int nonzero = 0;
  for (const Fixture::Grad& g : f.grads) {
    auto grad = (*model)->GetGrad(g.name);
    ASSERT_THAT(grad, IsOk());
    EXPECT_NEAR((*grad)[g.index], g.value, 1e-4 * std::fabs(g.value) + 2e-6)
        << g.name << "[" << g.index << "]";
    nonzero += std::fabs(g.value) > 1e-4;
  }
  EXPECT_GT(nonzero, 70);
}

}  // namespace
}  // namespace pipetrain::compute
