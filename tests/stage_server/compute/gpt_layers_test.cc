// Each pipeline layer of each model family (GPT-2; Llama with grouped-query attention,
// untied and tied): gradients against central finite differences in double
// precision (the same layer code on the double host backend), the float CPU layer
// against the double one, split backward against fused, and stored activation bytes
// against transformer_config's CostOfLayer.
#include "stage_server/compute/gpt_layers.h"

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "common/model/init.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/host_backend.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;

constexpr int kB = 2;
model::TransformerConfig Tiny() {
  return {.vocab_size = 11, .seq_len = 5, .d_model = 8, .n_heads = 2, .n_layers = 2};
}
// Llama with two query heads sharing one key/value head, an MLP width that is no
// multiple of d_model, and rotary angles of several sizes (theta 100 on heads of 4).
model::TransformerConfig TinyLlama(bool tied = false) {
  model::TransformerConfig c = Tiny();
  c.family = "llama";
  c.n_kv_heads = 1;
  c.ffn_dim = 12;
  c.rope_theta = 100;
  c.norm_eps = 1e-5;
  c.tie_embeddings = tied;
  return c;
}
// The configs every test runs on, by name.
model::TransformerConfig ConfigNamed(const std::string& name) {
  if (name == "gpt2") return Tiny();
  if (name == "llama") return TinyLlama();
  return TinyLlama(/*tied=*/true);
}
const char* const kConfigs[] = {"gpt2", "llama", "llama_tied"};

template <typename Real>
std::vector<Real> Randn(size_t n, uint64_t seed, double scale) {
  std::vector<Real> v(n);
  const uint64_t key = model::InitStreamKey(seed, 3000, 0);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<Real>(scale * model::NormalAt(key, i));
  return v;
}

std::vector<int32_t> Tokens(int n, int V, uint64_t seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7 + seed * 3 + i * i) % V);
  return t;
}

// One layer with every parameter random (LayerNorm weights near 1, not exactly, so a
// missing factor cannot hide), a random input and a random output weighting R that
// turns non-head outputs into the scalar L = sum(output * R).
template <typename Real>
struct Fixture {
  model::TransformerConfig config;
  int index;
  std::unique_ptr<PipelineLayer<Real>> layer;
  std::vector<Real> x;                   // (B, T, C) for blocks and the head
  std::vector<int32_t> tokens, targets;  // (B, T)
  std::vector<Real> r;                   // (B, T, C): dL/d output
  Fixture(BackendT<Real>* backend, int layer_index, model::TransformerConfig c = Tiny())
      : config(std::move(c)), index(layer_index) {
    auto made = MakeLayer<Real>(config, index, backend);
    EXPECT_THAT(made, IsOk());
    layer = std::move(*made);
    const int64_t n = kB * config.seq_len * config.d_model;
    for (size_t i = 0; i < layer->specs().size(); ++i) {
      const model::ParamSpec& s = layer->specs()[i];
      const bool ln_weight = s.shape.size() == 1 &&
                             (s.name.find("ln_") != std::string::npos ||
                              s.name.find("norm") != std::string::npos) &&
                             s.name.find("weight") != std::string::npos;
      std::vector<Real> v = Randn<Real>(s.num_elements(), 100 + 10 * index + i, 0.3);
      if (ln_weight)
        for (Real& w : v) w += 1;
      EXPECT_THAT(
          backend->CopyFromHost(layer->param(i), v.data(), v.size() * sizeof(Real)),
          IsOk());
    }
    EXPECT_THAT(layer->ZeroGrads(), IsOk());
    x = Randn<Real>(n, 7 + index, 1.0);
    r = Randn<Real>(n, 9 + index, 1.0);
    tokens = Tokens(kB * config.seq_len, config.vocab_size, 1);
    targets = Tokens(kB * config.seq_len, config.vocab_size, 2);
  }
  bool is_head() const { return layer->kind() == model::LayerKind::kHead; }
  const void* input() const {
    return layer->kind() == model::LayerKind::kEmbedding ? static_cast<const void*>(tokens.data())
                                                         : x.data();
  }
  // The scalar objective (host backends only: pointers are host memory).
  double Objective() {
    std::vector<Real> out(is_head() ? 1 : r.size());
    Stash<Real> stash;
    EXPECT_THAT(layer->Forward(kB, input(), targets.data(), out.data(), stash), IsOk());
    if (is_head()) return out[0];
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += double{out[i]} * r[i];
    return l;
  }
  // Analytic gradients: returns grad_input, leaves parameter gradients in the layer.
  std::vector<Real> Gradients(bool split) {
    std::vector<Real> out(is_head() ? 1 : r.size()), grad_input(x.size());
    Stash<Real> stash;
    EXPECT_THAT(layer->Forward(kB, input(), targets.data(), out.data(), stash), IsOk());
    if (split) {
      EXPECT_THAT(layer->BackwardInput(stash, r.data(), 1, grad_input.data()), IsOk());
      EXPECT_THAT(layer->BackwardWeight(stash), IsOk());
    } else {
      EXPECT_THAT(layer->Backward(stash, r.data(), 1, grad_input.data()), IsOk());
    }
    EXPECT_EQ(stash.owned_bytes(), 0u) << "backward must free the stash";
    return grad_input;
  }
};

// Central differences in double; the relative error of a gradient vector is measured
// against its largest entry.
void CheckGradient(const char* what, const std::vector<double>& analytic,
                   const std::vector<double>& numeric) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(numeric[i]));
    max_diff = std::max(max_diff, std::fabs(analytic[i] - numeric[i]));
  }
  EXPECT_GT(max_ref, 1e-8) << what << ": the gradient is zero, the check proves nothing";
  EXPECT_LE(max_diff, 1e-6 * std::max(1.0, max_ref)) << what;
}

class LayerGradientTest : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(LayerGradientTest, MatchesFiniteDifferencesInDouble) {
  HostBackendDouble backend;
  Fixture<double> f(&backend, std::get<1>(GetParam()), ConfigNamed(std::get<0>(GetParam())));
  std::vector<double> grad_input = f.Gradients(/*split=*/false);
  constexpr double kEps = 1e-5;
  auto numeric_for = [&](double* values, size_t n) {
    std::vector<double> g(n);
    for (size_t i = 0; i < n; ++i) {
      const double saved = values[i];
      values[i] = saved + kEps;
      const double plus = f.Objective();
      values[i] = saved - kEps;
      const double minus = f.Objective();
      values[i] = saved;
      g[i] = (plus - minus) / (2 * kEps);
    }
    return g;
  };
  for (size_t p = 0; p < f.layer->specs().size(); ++p) {
    const model::ParamSpec& spec = f.layer->specs()[p];
    const size_t n = spec.num_elements();
    std::vector<double> analytic(f.layer->grad(p), f.layer->grad(p) + n);
    CheckGradient(spec.name.c_str(), analytic, numeric_for(f.layer->param(p), n));
  }
  if (f.layer->kind() != model::LayerKind::kEmbedding) {
    CheckGradient("input", grad_input, numeric_for(f.x.data(), f.x.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(EmbeddingBlockHead, LayerGradientTest,
                         ::testing::Combine(::testing::ValuesIn(kConfigs),
                                            ::testing::Values(0, 1, 3)),
                         [](const auto& info) {
                           const int index = std::get<1>(info.param);
                           return std::string(std::get<0>(info.param)) + "_" +
                                  (index == 3   ? "head"
                                   : index == 0 ? "embedding"
                                                : "block");
                         });

class FamilyTest : public ::testing::TestWithParam<const char*> {
 protected:
  model::TransformerConfig config() const { return ConfigNamed(GetParam()); }
};

// The float CPU layer agrees with the double layer, and split backward is exactly the
// fused backward.
TEST_P(FamilyTest, CpuFloatMatchesDoubleAndSplitEqualsFused) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  HostBackendDouble dbl;
  for (int index : {0, 1, 3}) {
    SCOPED_TRACE(model::LayerName(config(), index));
    Fixture<double> fd(&dbl, index, config());
    Fixture<float> ff(cpu->get(), index, config());
    Fixture<float> fs(cpu->get(), index, config());
    const std::vector<double> gd = fd.Gradients(false);
    const std::vector<float> gf = ff.Gradients(false);
    const std::vector<float> gs = fs.Gradients(true);
    EXPECT_EQ(gf, gs);
    for (size_t i = 0; i < gd.size() && index != 0; ++i) {
      EXPECT_NEAR(gf[i], gd[i], 1e-4 * (1 + std::fabs(gd[i])));
    }
    for (size_t p = 0; p < fd.layer->specs().size(); ++p) {
      const int64_t n = fd.layer->specs()[p].num_elements();
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(ff.layer->grad(p)[i], fd.layer->grad(p)[i],
                    1e-4 * (1 + std::fabs(fd.layer->grad(p)[i])))
            << fd.layer->specs()[p].name << "[" << i << "]";
        ASSERT_EQ(ff.layer->grad(p)[i], fs.layer->grad(p)[i])
            << fd.layer->specs()[p].name;
      }
    }
  }
}

// What a layer keeps between forward and backward (its input plus its stash) is what
// transformer_config promises the planner.
TEST_P(FamilyTest, ActivationBytesMatchCostModel) {
  HostBackend backend;
  const model::TransformerConfig c = config();
  for (int index : {0, 1, 3}) {
    Fixture<float> f(&backend, index, c);
    std::vector<float> out(f.is_head() ? 1 : f.r.size());
    Stash<float> stash;
    ASSERT_THAT(f.layer->Forward(kB, f.input(), f.targets.data(), out.data(), stash),
                IsOk());
    const double tokens = kB * c.seq_len;
    const double input_bytes =
        index == 0 ? tokens * sizeof(int32_t) : tokens * c.d_model * sizeof(float);
    EXPECT_EQ(stash.owned_bytes() + input_bytes,
              model::CostOfLayer(c, index).activation_bytes * tokens)
        << model::LayerName(c, index);
    EXPECT_EQ(input_bytes, model::CostOfLayer(c, index).activation_bytes_recompute * tokens);
  }
}

// Counts the FLOPs of matrix products and attention (2 per multiply-add; attention as
// the CPU backend runs it: full T x T products, masked afterwards).
class CountingBackend : public HostBackendT<float> {
 public:
  double flops = 0;
  absl::Status Matmul(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                      const float* b, float beta, float* c) override {
    flops += 2.0 * m * n * k;
    return HostBackendT<float>::Matmul(ta, tb, m, n, k, alpha, a, b, beta, c);
  }
  absl::Status AttentionForward(int B, int T, int C, int NH, const float* qkv, float* out,
                                float* probs) override {
    flops += 4.0 * B * T * T * C;  // scores and mix
    return HostBackendT<float>::AttentionForward(B, T, C, NH, qkv, out, probs);
  }
  absl::Status AttentionBackward(int B, int T, int C, int NH, const float* dout,
                                 const float* qkv, const float* probs,
                                 float* dqkv) override {
    flops += 8.0 * B * T * T * C;  // d probs, dv, dq, dk
    return HostBackendT<float>::AttentionBackward(B, T, C, NH, dout, qkv, probs, dqkv);
  }
};

// Parameter counts and the FLOPs the layers really issue agree with model::CostOfLayer (which
// adds a few elementwise FLOPs per vocabulary entry to the head).
TEST_P(FamilyTest, ParamsAndFlopsMatchCostModel) {
  CountingBackend backend;
  const model::TransformerConfig c = config();
  const double tokens = kB * c.seq_len;
  for (int index : {0, 1, 3}) {
    SCOPED_TRACE(model::LayerName(c, index));
    Fixture<float> f(&backend, index, c);
    const model::LayerCost cost = model::CostOfLayer(c, index);
    EXPECT_EQ(f.layer->num_params(), cost.params);
    std::vector<float> out(f.is_head() ? 1 : f.r.size()), grad_input(f.x.size());
    Stash<float> stash;
    const double slack = index == 3 ? 5.0 * c.vocab_size : c.d_model * 2.0;
    auto expect_flops = [&](double cost_per_token) {
      EXPECT_LE(backend.flops / tokens, cost_per_token);
      EXPECT_GE(backend.flops / tokens, cost_per_token - slack);
      backend.flops = 0;
    };
    backend.flops = 0;
    ASSERT_THAT(f.layer->Forward(kB, f.input(), f.targets.data(), out.data(), stash),
                IsOk());
    expect_flops(cost.forward_flops);
    ASSERT_THAT(f.layer->BackwardInput(stash, f.r.data(), 1, grad_input.data()), IsOk());
    expect_flops(cost.backward_input_flops);
    ASSERT_THAT(f.layer->BackwardWeight(stash), IsOk());
    expect_flops(cost.backward_weight_flops);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest, ::testing::ValuesIn(kConfigs),
                         [](const auto& info) { return std::string(info.param); });

TEST(GptLayersTest, BadInputsAreErrors) {
  HostBackend backend;
  Fixture<float> head(&backend, 3);
  std::vector<float> out(1);
  Stash<float> stash;
  EXPECT_THAT(head.layer->Forward(kB, head.x.data(), nullptr, out.data(), stash),
              ::pipetrain::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                             ::testing::HasSubstr("head")));
  Fixture<float> emb(&backend, 0);
  emb.tokens[4] = 99;
  std::vector<float> x(emb.r.size());
  EXPECT_THAT(emb.layer->Forward(kB, emb.tokens.data(), nullptr, x.data(), stash),
              ::pipetrain::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                             ::testing::HasSubstr("tokens[4] = 99")));
  EXPECT_THAT(MakeLayer<float>(Tiny(), 4, &backend),
              ::pipetrain::testing::StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::compute
