// ModelChunk: whole-model gradients against finite differences (double), any split into
// stages equals the whole model, recomputation is bit-identical (and timed), the split
// backward of zero-bubble schedules, activation accounting, deterministic init, AdamW and
// errors.
// The backends here keep tensors in host memory, so tests pass host pointers directly.
#include <algorithm>
#include "stage_server/compute/model_chunk.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/gpt2_family.h"
#include "common/model/init.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/host_backend.h"
#include "tests/testing/tolerance.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

model::TransformerConfig Tiny() {
  return {.vocab_size = 11, .seq_len = 5, .d_model = 8, .n_heads = 2, .n_layers = 3};
}

template <typename Real>
using Stages = std::vector<std::unique_ptr<ModelChunkT<Real>>>;

// Stages cut at `cuts` (e.g. {2} gives [0, 2) and [2, L + 2)), initialised with seed 5.
template <typename Real>
Stages<Real> MakeStages(BackendT<Real>* backend, const model::TransformerConfig& c,
                        std::vector<int> cuts, ChunkOptions options = {}) {
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(c.num_pipeline_layers());
  Stages<Real> stages;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    auto s = ModelChunkT<Real>::Create(c, cuts[i], cuts[i + 1], backend, options);
    EXPECT_THAT(s, IsOk());
    EXPECT_THAT((*s)->Initialize(5), IsOk());
    stages.push_back(std::move(*s));
  }
  return stages;
}

struct Batch {
  int rows;
  std::vector<int32_t> tokens, targets;  // (rows, T)
};
Batch MakeBatch(const model::TransformerConfig& c, int rows) {
  Batch b{rows, {}, {}};
  for (int i = 0; i < rows * c.seq_len; ++i) {
    b.tokens.push_back((i * 5 + 3 + i * i / 3) % c.vocab_size);
    b.targets.push_back((i * 7 + 1) % c.vocab_size);
  }
  return b;
}

enum class Mode { kFused, kSplit, kSplitWeightsReversed };

// One GPipe-ordered step: every micro-batch forward through every stage, then backward
// in reverse order. Returns the mean loss; gradients accumulate in the stages.
template <typename Real>
double RunStep(Stages<Real>& stages, const Batch& batch, int M, Mode mode = Mode::kFused) {
  const model::TransformerConfig& c = stages[0]->config();
  const int rows = batch.rows / M;
  const int64_t tokens = int64_t{rows} * c.seq_len;
  double loss = 0;
  for (int mb = 0; mb < M; ++mb) {
    const void* in = batch.tokens.data() + mb * tokens;
    std::vector<Real> out;
    for (auto& s : stages) {
      std::vector<Real> next(s->OutputElements(rows));
      const int32_t* targets = s->has_head() ? batch.targets.data() + mb * tokens : nullptr;
      EXPECT_THAT(s->Forward(mb, rows, in, targets, next.data()), IsOk());
      out = std::move(next);
      in = out.data();
    }
    loss += out[0];
  }
  for (int mb = M - 1; mb >= 0; --mb) {
    std::vector<Real> grad;
    for (int i = static_cast<int>(stages.size()) - 1; i >= 0; --i) {
      std::vector<Real> grad_input(stages[i]->GradInputElements(rows));
      Real* gi = grad_input.empty() ? nullptr : grad_input.data();
      const Real* go = stages[i]->has_head() ? nullptr : grad.data();
      if (mode == Mode::kFused) {
        EXPECT_THAT(stages[i]->Backward(mb, go, gi, Real{1} / M), IsOk());
      } else {
        EXPECT_THAT(stages[i]->BackwardInput(mb, go, gi, Real{1} / M), IsOk());
      }
      grad = std::move(grad_input);
    }
  }
  if (mode != Mode::kFused) {
    for (int k = 0; k < M; ++k) {
      const int mb = mode == Mode::kSplit ? M - 1 - k : k;
      for (auto& s : stages) EXPECT_THAT(s->BackwardWeight(mb), IsOk());
    }
  }
  return loss / M;
}

template <typename Real>
std::map<std::string, std::vector<Real>> Collect(Stages<Real>& stages, bool grads) {
  std::map<std::string, std::vector<Real>> out;
  for (auto& s : stages) {
    for (const model::ParamSpec& p : s->Params()) {
      auto v = grads ? s->GetGrad(p.name) : s->GetParam(p.name);
      EXPECT_THAT(v, IsOk());
      out[p.name] = *v;
    }
  }
  return out;
}

// The loss of `batch` as one micro-batch through a whole-model chunk, keeping nothing:
// what a finite-difference check evaluates at each perturbed weight.
double ForwardLoss(ModelChunkT<double>& m, const Batch& batch) {
  double loss = 0;
  EXPECT_THAT(m.Forward(0, batch.rows, batch.tokens.data(), batch.targets.data(), &loss), IsOk());
  m.Abandon();
  return loss;
}

TEST(ModelChunkTest, WholeModelGradientMatchesFiniteDifferences) {
  HostBackendDouble backend;
  const model::TransformerConfig c = Tiny();
  Stages<double> model = MakeStages<double>(&backend, c, {});
  ModelChunkT<double>& m = *model[0];
  // Move every parameter off its init (LayerNorm weights off 1, biases off 0).
  for (int l = 0; l < c.num_pipeline_layers(); ++l) {
    PipelineLayer<double>& layer = m.layer(l);
    const uint64_t key = model::InitStreamKey(77, l, 0);
    for (int64_t i = 0; i < layer.num_params(); ++i) {
      layer.all_params()[i] += 0.2 * model::NormalAt(key, i);
    }
  }
  const Batch batch = MakeBatch(c, 2);
  ASSERT_THAT(m.ZeroGrads(), IsOk());
  RunStep(model, batch, 1);
  auto loss_of = [&] { return ForwardLoss(m, batch); };
  constexpr double kEps = 1e-5;
  for (int l = 0; l < c.num_pipeline_layers(); ++l) {
    PipelineLayer<double>& layer = m.layer(l);
    double max_diff = 0, max_ref = 0;
    for (int64_t i = 0; i < layer.num_params(); ++i) {
      double& w = layer.all_params()[i];
      const double saved = w;
      w = saved + kEps;
      const double plus = loss_of();
      w = saved - kEps;
      const double minus = loss_of();
      w = saved;
      const double numeric = (plus - minus) / (2 * kEps);
      max_ref = std::max(max_ref, std::fabs(numeric));
      max_diff = std::max(max_diff, std::fabs(numeric - layer.all_grads()[i]));
    }
    EXPECT_GT(max_ref, 1e-6) << model::LayerName(c, l);
    EXPECT_LE(max_diff, 1e-7 * std::max(1.0, max_ref)) << model::LayerName(c, l);
  }
}

// Tied embeddings: one matrix W serves as wte and as the head's projection. The loss
// as a function of W (both copies moved together) has the derivative that
// SumTiedGradients leaves in both copies, and the copies start equal.
TEST(ModelChunkTest, TiedEmbeddingGradientIsTheSumAndMatchesFiniteDifferences) {
  HostBackendDouble backend;
  model::TransformerConfig c = Tiny();
  c.tie_embeddings = true;
  Stages<double> model = MakeStages<double>(&backend, c, {});
  ModelChunkT<double>& m = *model[0];
  PipelineLayer<double>& embedding = m.layer(0);
  PipelineLayer<double>& head = m.layer(c.num_pipeline_layers() - 1);
  const int64_t n = int64_t{c.vocab_size} * c.d_model;
  double* wte = embedding.param(0);
  double* copy = head.param(2);
  ASSERT_EQ(head.specs()[2].tied_to, model::kTokenEmbeddingName);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(wte[i], copy[i]) << "element " << i;
  const Batch batch = MakeBatch(c, 2);
  ASSERT_THAT(m.ZeroGrads(), IsOk());
  RunStep(model, batch, 1);
  const std::vector<double> own_embedding(embedding.grad(0), embedding.grad(0) + n);
  const std::vector<double> own_head(head.grad(2), head.grad(2) + n);
  ASSERT_THAT(m.SumTiedGradients(), IsOk());
  auto loss_of = [&] { return ForwardLoss(m, batch); };
  constexpr double kEps = 1e-5;
  double max_diff = 0, max_ref = 0, max_head_only = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(embedding.grad(0)[i], head.grad(2)[i]) << "element " << i;
    EXPECT_EQ(embedding.grad(0)[i], own_embedding[i] + own_head[i]) << "element " << i;
    const double saved = wte[i];
    wte[i] = copy[i] = saved + kEps;
    const double plus = loss_of();
    wte[i] = copy[i] = saved - kEps;
    const double minus = loss_of();
    wte[i] = copy[i] = saved;
    const double numeric = (plus - minus) / (2 * kEps);
    max_ref = std::max(max_ref, std::fabs(numeric));
    max_diff = std::max(max_diff, std::fabs(numeric - embedding.grad(0)[i]));
    max_head_only = std::max(max_head_only, std::fabs(numeric - own_head[i]));
  }
  EXPECT_GT(max_ref, 1e-6);
  EXPECT_LE(max_diff, 1e-7 * std::max(1.0, max_ref));
  // Neither half alone is the derivative (the test would notice a missing sum).
  EXPECT_GT(max_head_only, 1e-4 * max_ref);
}

// The copy counts once in the gradient norm, and an untied model is unchanged.
TEST(ModelChunkTest, ATiedCopyIsLeftOutOfTheGradientNorm) {
  HostBackendDouble backend;
  model::TransformerConfig c = Tiny();
  c.tie_embeddings = true;
  Stages<double> model = MakeStages<double>(&backend, c, {});
  ModelChunkT<double>& m = *model[0];
  ASSERT_THAT(m.ZeroGrads(), IsOk());
  RunStep(model, MakeBatch(c, 2), 1);
  ASSERT_THAT(m.SumTiedGradients(), IsOk());
  double want = 0;
  for (int l = 0; l < c.num_pipeline_layers(); ++l) {
    PipelineLayer<double>& layer = m.layer(l);
    for (int p = 0; p < static_cast<int>(layer.specs().size()); ++p) {
      if (!layer.specs()[p].tied_to.empty()) continue;
      for (int64_t i = 0; i < layer.specs()[p].num_elements(); ++i) {
        want += layer.grad(p)[i] * layer.grad(p)[i];
      }
    }
  }
  auto got = m.GradSquaredNorm();
  ASSERT_THAT(got, IsOk());
  EXPECT_NEAR(*got, want, 1e-12 * want);
}

TEST(ModelChunkTest, SplittingAtEveryPointMatchesTheWholeModel) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 4);
  Stages<float> whole = MakeStages<float>(cpu->get(), c, {});
  const double loss = RunStep(whole, batch, 2);
  const auto grads = Collect(whole, true);
  for (int cut = 1; cut < c.num_pipeline_layers(); ++cut) {
    SCOPED_TRACE(::testing::Message() << "cut at " << cut);
    Stages<float> split = MakeStages<float>(cpu->get(), c, {cut});
    EXPECT_EQ(RunStep(split, batch, 2), loss);
    EXPECT_EQ(Collect(split, true), grads);
  }
  // One stage per layer, with the zero-bubble split backward.
  Stages<float> each = MakeStages<float>(cpu->get(), c, {1, 2, 3, 4});
  EXPECT_EQ(RunStep(each, batch, 2, Mode::kSplit), loss);
  EXPECT_EQ(Collect(each, true), grads);
}

TEST(ModelChunkTest, SplitBackwardInAnyOrderMatchesFused) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 4);
  Stages<float> fused = MakeStages<float>(cpu->get(), c, {2});
  Stages<float> split = MakeStages<float>(cpu->get(), c, {2});
  EXPECT_EQ(RunStep(fused, batch, 4), RunStep(split, batch, 4, Mode::kSplitWeightsReversed));
  const auto a = Collect(fused, true), b = Collect(split, true);
  // Weight gradients are summed over the batch's tokens with the micro-batches in another
  // order: each tensor equal up to that regrouping (tests/testing/tolerance.h).
  const int64_t tokens = int64_t{batch.rows} * c.seq_len;
  for (const auto& [name, g] : a) {
    EXPECT_LE(::pipetrain::testing::RelativeL2Error(b.at(name), g),
              ::pipetrain::testing::ReorderedTensorSumTolerance(tokens))
        << name;
  }
}

// Data-parallel replicas average each layer's gradients as soon as they are final: the
// hook sees layer i right after its gradients were added (the backward goes from the
// last layer down, the weight half from the first up), when the next one's are still
// zero, and LayerGradients / SetLayerGradients read and write exactly that layer's.
TEST(ModelChunkTest, TheGradientsAddedHookSeesEachLayerAsItsGradientsAreAdded) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 2);
  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "BackwardWeight" : "Backward");
    Stages<float> one = MakeStages<float>(cpu->get(), c, {});
    ModelChunk& chunk = *one[0];
    const int n = chunk.num_layers();
    ASSERT_EQ(n, c.num_pipeline_layers());
    float loss = 0;
    ASSERT_THAT(chunk.Forward(0, batch.rows, batch.tokens.data(), batch.targets.data(), &loss), IsOk());
    std::vector<int> order;
    std::vector<std::vector<float>> at_hook(n);
    chunk.OnFinalGradients([&](int i) {
      order.push_back(i);
      at_hook[i] = *chunk.LayerGradients(i);
      // The layer the backward reaches next has nothing yet.
      const int next = split ? i + 1 : i - 1;
      if (next >= 0 && next < n) {
        const std::vector<float> g = *chunk.LayerGradients(next);
        EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; })) << next;
      }
    });
    if (split) {
      ASSERT_THAT(chunk.BackwardInput(0, nullptr, nullptr), IsOk());
      EXPECT_TRUE(order.empty()) << "the input half adds no parameter gradient";
      ASSERT_THAT(chunk.BackwardWeight(0), IsOk());
    } else {
      ASSERT_THAT(chunk.Backward(0, nullptr, nullptr), IsOk());
    }
    chunk.OnFinalGradients({});
    std::vector<int> want(n);
    for (int i = 0; i < n; ++i) want[i] = split ? i : n - 1 - i;
    EXPECT_EQ(order, want);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(at_hook[i], *chunk.LayerGradients(i)) << "layer " << i << " was final at its hook";
      EXPECT_FALSE(std::all_of(at_hook[i].begin(), at_hook[i].end(), [](float v) { return v == 0.0f; }));
    }
    // Written back: the layer's gradients are the values given, the others unchanged.
    std::vector<float> halves = at_hook[1];
    for (float& v : halves) v *= 0.5f;
    ASSERT_THAT(chunk.SetLayerGradients(1, halves), IsOk());
    EXPECT_EQ(*chunk.LayerGradients(1), halves);
    EXPECT_EQ(*chunk.LayerGradients(0), at_hook[0]);
    EXPECT_THAT(chunk.SetLayerGradients(1, std::vector<float>(3)), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(chunk.LayerGradients(n).status(), StatusIs(absl::StatusCode::kOutOfRange));
    EXPECT_FALSE(chunk.LayerHoldsTiedParam(0)) << "untied";
  }
  model::TransformerConfig tied = c;
  tied.tie_embeddings = true;
  Stages<float> one = MakeStages<float>(cpu->get(), tied, {});
  for (int i = 0; i < one[0]->num_layers(); ++i) {
    EXPECT_EQ(one[0]->LayerHoldsTiedParam(i), i == 0 || i == one[0]->num_layers() - 1) << i;
  }
}

TEST(ModelChunkTest, RecomputeIsBitIdenticalAndKeepsOnlyInputs) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 4);
  Stages<float> plain = MakeStages<float>(cpu->get(), c, {2});
  Stages<float> recompute = MakeStages<float>(cpu->get(), c, {2}, {.recompute = true});
  for (int step = 0; step < 3; ++step) {
    for (auto* stages : {&plain, &recompute}) {
      for (auto& s : *stages) ASSERT_THAT(s->ZeroGrads(), IsOk());
    }
    EXPECT_EQ(RunStep(plain, batch, 2, Mode::kSplit), RunStep(recompute, batch, 2, Mode::kSplit));
    EXPECT_EQ(Collect(plain, true), Collect(recompute, true));
    for (auto* stages : {&plain, &recompute}) {
      for (auto& s : *stages) ASSERT_THAT(s->OptimizerStep({.lr = 1e-2f}), IsOk());
    }
  }
  EXPECT_EQ(Collect(plain, false), Collect(recompute, false));
  // With the fused backward a recomputed micro-batch's stash lives only during its own
  // backward, so the peak drops (with the split backward every stash lives until its
  // weight half, so it would not).
  for (auto* stages : {&plain, &recompute}) (*stages)[0]->ResetPeak();
  EXPECT_EQ(RunStep(plain, batch, 2), RunStep(recompute, batch, 2));
  EXPECT_LT(recompute[0]->PeakActivationBytes(), plain[0]->PeakActivationBytes());
  // The re-run forward is timed (what a stage reports as recompute_us); without
  // recomputation there is none.
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_GT(recompute[i]->last_recompute_seconds(), 0.0) << "stage " << i;
    EXPECT_EQ(plain[i]->last_recompute_seconds(), 0.0) << "stage " << i;
  }
}

void CheckActivationBytes(HostBackend& backend, common::DType products) {
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 6);
  const int M = 3, rows = 2;
  const double tokens = rows * c.seq_len;
  double per_mb = 0;
  for (int l = 0; l < c.num_pipeline_layers(); ++l) {
    per_mb += model::CostOfLayer(c, l, products).activation_bytes * tokens;
  }
  if (products == common::DType::kBF16) {
    // 2 bytes instead of 4 for ln_1, attention out, ln_2 and post-GELU (7C a token) in
    // each block and for ln_f out (C) in the head.
    const double fp32 = model::ChunkActivationBytes(c, 0, c.num_pipeline_layers(), false).stored;
    EXPECT_EQ(per_mb, (fp32 - 2.0 * (7 * c.n_layers + 1) * c.d_model) * tokens);
  }
  for (bool recompute : {false, true}) {
    Stages<float> model = MakeStages<float>(&backend, c, {}, {.recompute = recompute});
    ModelChunk& m = *model[0];
    float loss;
    for (int mb = 0; mb < M; ++mb) {
      ASSERT_THAT(m.Forward(mb, rows, batch.tokens.data() + mb * rows * c.seq_len,
                            batch.targets.data() + mb * rows * c.seq_len, &loss),
                  IsOk());
    }
    EXPECT_EQ(m.in_flight(), M);
    // With recomputation only the tokens and targets stay (4 bytes each per token).
    EXPECT_EQ(m.ActivationBytes(), recompute ? M * tokens * 8 : M * per_mb);
    EXPECT_GE(m.PeakActivationBytes(), recompute ? per_mb : M * per_mb);
    for (int mb = 0; mb < M; ++mb) ASSERT_THAT(m.Backward(mb, nullptr, nullptr), IsOk());
    EXPECT_EQ(m.ActivationBytes(), 0u);
    EXPECT_EQ(m.in_flight(), 0);
  }
}

// In both precisions: with bf16 products the activations kept only for the weight
// gradients' products are kept as 2-byte product copies, and the model counts them so.
TEST(ModelChunkTest, ActivationBytesFollowTheCostModel) {
  for (common::DType products : {common::DType::kF32, common::DType::kBF16}) {
    SCOPED_TRACE(common::DTypeName(products));
    HostBackend backend;
    ASSERT_THAT(backend.SetProductOperands(products), IsOk());
    CheckActivationBytes(backend, products);
  }
}

// A host backend that counts the bytes it has handed out and not had back.
class CountingBackend : public HostBackend {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    absl::StatusOr<void*> p = HostBackend::Allocate(bytes);
    if (p.ok() && *p != nullptr) live_[*p] = bytes;
    return p;
  }
  absl::Status Free(void* ptr) override {
    live_.erase(ptr);
    return HostBackend::Free(ptr);
  }
  uint64_t live_bytes() const {
    uint64_t total = 0;
    for (const auto& [ptr, bytes] : live_) total += bytes;
    return total;
  }

 private:
  std::map<void*, size_t> live_;
};

// What a chunk holds besides its micro-batches is its parameters, their gradients and
// the tables its layers share, exactly model::ChunkTableBytes: Llama's blocks read one
// pair of rotary tables made at Create (one pair for three blocks, not three), a chunk
// of only the embedding or the head none, GPT-2 none. A step leaves nothing else.
TEST(ModelChunkTest, AChunkHoldsItsParametersAndTheTablesItsLayersShareExactly) {
  model::TransformerConfig llama = Tiny();  // heads of 4: rotary tables of 5 x 2 each
  llama.family = "llama";
  llama.n_kv_heads = 1;
  llama.ffn_dim = 12;
  llama.rope_theta = 10000;
  llama.norm_eps = 1e-5;
  EXPECT_EQ(model::ChunkTableBytes(llama, 0, llama.num_pipeline_layers()), 2u * 5 * 2 * 4);
  for (const model::TransformerConfig& c : {Tiny(), llama}) {
    const int n = c.num_pipeline_layers();
    for (const auto& [begin, end] :
         std::vector<std::pair<int, int>>{{0, n}, {0, 1}, {1, 2}, {1, 4}, {n - 1, n}, {2, n}}) {
      SCOPED_TRACE(absl::StrCat(c.family, " layers ", begin, "..", end));
      CountingBackend backend;
      auto made = ModelChunk::Create(c, begin, end, &backend);
      ASSERT_THAT(made, IsOk());
      ModelChunk& m = **made;
      const uint64_t held = static_cast<uint64_t>(m.NumParams()) * 2 * sizeof(float) +
                            model::ChunkTableBytes(c, begin, end);
      EXPECT_EQ(backend.live_bytes(), held);
      EXPECT_EQ(model::ChunkTableBytes(c, begin, end) > 0,
                c.family == "llama" && end > 1 && begin < n - 1);
      if (begin != 0 || end != n) continue;
      // A micro-batch through the whole model and back, forward-only too: nothing more.
      ASSERT_THAT(m.Initialize(5), IsOk());
      const Batch batch = MakeBatch(c, 2);
      float loss = 0;
      ASSERT_THAT(m.Forward(0, 2, batch.tokens.data(), batch.targets.data(), &loss), IsOk());
      ASSERT_THAT(m.Backward(0, nullptr, nullptr), IsOk());
      ASSERT_THAT(m.Evaluate(2, batch.tokens.data(), batch.targets.data(), &loss), IsOk());
      EXPECT_EQ(backend.live_bytes(), held);
    }
  }
}

TEST(ModelChunkTest, InitIsDeterministicAcrossPartitions) {
  HostBackend backend;
  const model::TransformerConfig c{
      .vocab_size = 64, .seq_len = 8, .d_model = 64, .n_heads = 4, .n_layers = 2};
  Stages<float> whole = MakeStages<float>(&backend, c, {});
  Stages<float> split = MakeStages<float>(&backend, c, {1, 3});
  const auto params = Collect(whole, false);
  EXPECT_EQ(params, Collect(split, false));
  EXPECT_EQ(params.size(), model::RangeParams(c, 0, c.num_pipeline_layers()).size());
  auto stddev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += double{x} * x;
    }
    return std::sqrt(s2 / v.size() - (s / v.size()) * (s / v.size()));
  };
  EXPECT_NEAR(stddev(params.at("transformer.h.0.mlp.c_fc.weight")), 0.02, 0.001);
  EXPECT_NEAR(stddev(params.at("transformer.h.1.mlp.c_proj.weight")), 0.01, 0.0005);
  EXPECT_NEAR(stddev(params.at("transformer.h.1.attn.c_proj.weight")), 0.01, 0.001);
  EXPECT_EQ(params.at("transformer.h.0.ln_1.weight"), std::vector<float>(64, 1.0f));
  EXPECT_EQ(params.at("transformer.h.0.attn.c_attn.bias"), std::vector<float>(192, 0.0f));
  // Every matrix draws its own stream.
  EXPECT_NE(params.at("transformer.h.0.mlp.c_fc.weight"),
            params.at("transformer.h.1.mlp.c_fc.weight"));
  auto other = ModelChunk::Create(c, 0, 1, &backend);
  ASSERT_THAT(other, IsOk());
  ASSERT_THAT((*other)->Initialize(6), IsOk());
  EXPECT_NE(*(*other)->GetParam("transformer.wte.weight"), params.at("transformer.wte.weight"));
}

TEST(ModelChunkTest, AdamWDecaysMatricesOnlyAndClipsByTheGivenNorm) {
  HostBackend backend;
  const model::TransformerConfig c = Tiny();
  Stages<float> a = MakeStages<float>(&backend, c, {});
  const auto before = Collect(a, false);
  // Zero gradients: Adam moves nothing, only decoupled decay acts.
  ASSERT_THAT(a[0]->OptimizerStep({.lr = 0.1f, .weight_decay = 0.5f}), IsOk());
  for (const model::ParamSpec& p : a[0]->Params()) {
    const std::vector<float> after = *a[0]->GetParam(p.name);
    for (size_t i = 0; i < after.size(); ++i) {
      const float want =
          p.is_matrix ? before.at(p.name)[i] * (1 - 0.1f * 0.5f) : before.at(p.name)[i];
      ASSERT_FLOAT_EQ(after[i], want) << p.name;
    }
  }
  // Clipping to half the supplied global norm equals halving the gradients (eps = 1
  // makes Adam sensitive to the gradient's scale).
  const Batch batch = MakeBatch(c, 2);
  Stages<float> x = MakeStages<float>(&backend, c, {});
  Stages<float> y = MakeStages<float>(&backend, c, {});
  RunStep(x, batch, 1);
  RunStep(y, batch, 1);
  const double norm = std::sqrt(*x[0]->GradSquaredNorm());
  EXPECT_GT(norm, 0);
  auto used = x[0]->OptimizerStep({.lr = 0.1f, .eps = 1.0f, .grad_clip_norm = 1.0f}, 2.0);
  ASSERT_THAT(used, IsOk());
  EXPECT_EQ(*used, 2.0);
  for (int l = 0; l < c.num_pipeline_layers(); ++l) {
    PipelineLayer<float>& layer = y[0]->layer(l);
    ASSERT_THAT(backend.Scale(layer.num_params(), 0.5f, layer.all_grads()), IsOk());
  }
  ASSERT_THAT(y[0]->OptimizerStep({.lr = 0.1f, .eps = 1.0f}), IsOk());
  // x's factor is 1 / (2 + 1e-6) in float, y's exactly 0.5: their gradients differ
  // relatively by d = 5e-7 and a rounding each. AdamW's first update g / (|g| + 1) moves
  // by at most |dg| / (|g| + 1)^2 <= d, so a weight by lr d and the step's own rounding.
  const ::pipetrain::testing::AdamWSettings adam = {.lr = 0.1, .eps = 1};
  const double d = 1e-6 / (2 + 1e-6) + 2 * ::pipetrain::testing::kFloatEps;
  const auto px = Collect(x, false), py = Collect(y, false);
  for (const auto& [name, v] : px) {
    for (size_t i = 0; i < v.size(); ++i) {
      const double w = py.at(name)[i];
      ASSERT_NEAR(v[i], w, adam.lr * d + ::pipetrain::testing::AdamWStepRounding(adam, 1, w))
          << name;
    }
  }
  EXPECT_NE(px, before);
}

// Copies of a stage that split the optimizer each step their piece of every layer; put
// together, the pieces are the whole step bit for bit (AdamW is element by element),
// with weight decay on matrices only and clipping by the norm their pieces sum to.
TEST(ModelChunkTest, CopiesSteppingTheirPiecesGiveTheWholeStepBitForBit) {
  HostBackend backend;
  model::TransformerConfig c = Tiny();
  c.tie_embeddings = true;  // the head's tied copy stays out of every piece's norm
  const Batch batch = MakeBatch(c, 2);
  const OptimizerSettings adam = {.lr = 0.1f, .weight_decay = 0.1f, .grad_clip_norm = 0.5f};
  for (int copies : {2, 3, 7}) {
    SCOPED_TRACE(absl::StrCat(copies, " copies"));
    Stages<float> whole = MakeStages<float>(&backend, c, {});
    RunStep(whole, batch, 1);
    ASSERT_THAT(whole[0]->SumTiedGradients(), IsOk());
    std::vector<Stages<float>> pieces;
    double squares = 0;
    for (int r = 0; r < copies; ++r) {
      pieces.push_back(MakeStages<float>(&backend, c, {}, {.split = {copies, r}}));
      RunStep(pieces.back(), batch, 1);
      ASSERT_THAT(pieces.back()[0]->SumTiedGradients(), IsOk());
      auto sq = pieces.back()[0]->GradSquaredNorm();
      ASSERT_THAT(sq, IsOk());
      squares += *sq;
    }
    const Stages<float> fresh = MakeStages<float>(&backend, c, {});
    const double whole_squares = *whole[0]->GradSquaredNorm();
    ASSERT_GT(whole_squares, 0);
    // Doubles summing floats' squares in another grouping: far below a float's rounding.
    EXPECT_NEAR(squares, whole_squares, 1e-12 * whole_squares);
    const double norm = std::sqrt(whole_squares);
    ASSERT_GT(norm, adam.grad_clip_norm) << "clipping must act";
    ASSERT_THAT(whole[0]->OptimizerStep(adam, norm), IsOk());
    for (int r = 0; r < copies; ++r) {
      ASSERT_THAT(pieces[r][0]->OptimizerStep(adam, norm), IsOk());
    }
    for (int l = 0; l < c.num_pipeline_layers(); ++l) {
      const PipelineLayer<float>& want = whole[0]->layer(l);
      const size_t n = want.num_params();
      for (int r = 0; r < copies; ++r) {
        const PipelineLayer<float>& got = pieces[r][0]->layer(l);
        const PipelineLayer<float>& before = fresh[0]->layer(l);
        const model::CopyRange own = model::RangeOfCopy(n, copies, r);
        for (size_t i = 0; i < n; ++i) {
          const bool mine = i >= own.begin && i < own.end;
          ASSERT_EQ(got.all_params()[i], mine ? want.all_params()[i] : before.all_params()[i])
              << "layer " << l << " element " << i << " of copy " << r;
          if (mine) {
            ASSERT_EQ(*got.adam_m_at(i), *want.adam_m_at(i)) << "layer " << l << " element " << i;
            ASSERT_EQ(*got.adam_v_at(i), *want.adam_v_at(i)) << "layer " << l << " element " << i;
          }
        }
        // A copy keeps the moments of its piece only: that is the memory the split saves.
        EXPECT_EQ(got.moment_piece(), own) << "layer " << l << " copy " << r;
      }
    }
    // Checkpoints: each copy gives its piece's moments and zeros elsewhere, so the pieces
    // added up are the whole's; given the whole, a copy keeps its piece.
    for (const model::ParamSpec& p : whole[0]->Params()) {
      for (bool second : {false, true}) {
        const std::vector<float> want = *whole[0]->GetOptimizerMoment(p.name, second);
        std::vector<float> sum(want.size(), 0.0f);
        for (int r = 0; r < copies; ++r) {
          const std::vector<float> part = *pieces[r][0]->GetOptimizerMoment(p.name, second);
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
        }
        ASSERT_EQ(sum, want) << p.name << (second ? " v" : " m");
      }
    }
    uint64_t held = 0, pieces_size = 0;
    for (int l = 0; l < c.num_pipeline_layers(); ++l) {
      pieces_size += pieces[1][0]->layer(l).moment_piece().size();
    }
    for (const model::ParamSpec& p : whole[0]->Params()) {
      const std::vector<float> ones(p.num_elements(), 1.0f), twos(p.num_elements(), 2.0f);
      ModelChunkT<float>& copy = *pieces[1][0];
      ASSERT_THAT(copy.SetOptimizerMoment(p.name, true, ones), IsOk());
      const std::vector<float> mask = *copy.GetOptimizerMoment(p.name, true);
      ASSERT_THAT(copy.SetOptimizerMoment(p.name, true, twos), IsOk());
      const std::vector<float> back = *copy.GetOptimizerMoment(p.name, true);
      for (size_t i = 0; i < back.size(); ++i) {
        ASSERT_TRUE(mask[i] == 1.0f || mask[i] == 0.0f) << p.name << " " << i;
        ASSERT_EQ(back[i], 2.0f * mask[i]) << p.name << " " << i;
        held += mask[i] == 1.0f;
      }
    }
    EXPECT_EQ(held, pieces_size) << "copy 1 takes exactly its pieces' moments";
  }
  Stages<float> one = MakeStages<float>(&backend, c, {}, {.split = {2, 1}});
  EXPECT_THAT(one[0]->OptimizerStep(adam),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("copy 1 of 2: clipping needs the global gradient norm")));
  EXPECT_EQ(one[0]->step(), 0) << "a refused step counts nothing";
  // A layer steps and takes a piece only within its parameters and its moment piece.
  PipelineLayer<float>& layer = one[0]->layer(0);
  const model::CopyRange own = layer.moment_piece();
  EXPECT_THAT(layer.AdamWStep(0.1f, 0.9f, 0.95f, 1e-8f, 0, 1, 1.0f, {0, own.end}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whose moments it keeps")));
  EXPECT_THAT(layer.SetMomentPiece({0, static_cast<uint64_t>(layer.num_params()) + 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 0: moment piece")));
  ASSERT_THAT(layer.EnsureOptimizerState(), IsOk());
  EXPECT_THAT(layer.SetMomentPiece({0, 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("state exists")));
  for (OptimizerSplit bad : {OptimizerSplit{2, 2}, OptimizerSplit{0, 0}, OptimizerSplit{3, -1}}) {
    EXPECT_THAT(ModelChunkT<float>::Create(c, 0, c.num_pipeline_layers(), &backend,
                                           {.split = bad}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("copy ", bad.copy, " of ", bad.copies))));
  }
}

// Evaluation runs the forward's arithmetic, so its output is Forward's bit for bit,
// but keeps nothing: no micro-batch in flight after it, and a lower peak than a
// forward that keeps its stashes for the backward.
TEST(ModelChunkTest, EvaluateIsForwardBitForBitAndKeepsNothing) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 2);
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    Stages<float> s = MakeStages<float>(cpu->get(), c, {2}, {.recompute = recompute});
    std::vector<float> x(2 * c.seq_len * c.d_model), y(x.size());
    float loss = 0, eval_loss = 0;
    ASSERT_THAT(s[0]->Forward(0, 2, batch.tokens.data(), nullptr, x.data()), IsOk());
    ASSERT_THAT(s[1]->Forward(0, 2, x.data(), batch.targets.data(), &loss), IsOk());
    for (auto& stage : s) stage->ResetPeak();
    const size_t held = s[0]->ActivationBytes();
    ASSERT_THAT(s[0]->Evaluate(2, batch.tokens.data(), nullptr, y.data()), IsOk());
    ASSERT_THAT(s[1]->Evaluate(2, y.data(), batch.targets.data(), &eval_loss), IsOk());
    EXPECT_EQ(x, y);
    EXPECT_EQ(loss, eval_loss);
    // What the training forward keeps is untouched; the evaluation added nothing.
    EXPECT_EQ(s[0]->in_flight(), 1);
    EXPECT_EQ(s[0]->ActivationBytes(), held);
    EXPECT_GT(s[0]->PeakActivationBytes(), held);
    if (!recompute) {
      // A whole forward's stashes outweigh one layer's at a time.
      Stages<float> fresh = MakeStages<float>(cpu->get(), c, {2});
      ASSERT_THAT(fresh[1]->Evaluate(2, y.data(), batch.targets.data(), &eval_loss), IsOk());
      const size_t evaluate_peak = fresh[1]->PeakActivationBytes();
      ASSERT_THAT(fresh[1]->Forward(0, 2, y.data(), batch.targets.data(), &loss), IsOk());
      EXPECT_LT(evaluate_peak, fresh[1]->PeakActivationBytes());
    }
    EXPECT_THAT(s[1]->Evaluate(2, y.data(), nullptr, &eval_loss),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("targets")));
  }
}

// With bf16 products the layers multiply by a bf16 copy of each weight made once per
// step. Whatever changes the weights (the optimizer, SetParam, Initialize) must remake
// it: after each change the chunk evaluates exactly as a fresh chunk given the same
// weights, whose copy is new.
TEST(ModelChunkTest, TheBf16ProductCopyFollowsEveryChangeOfTheWeights) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  ASSERT_THAT((*cpu)->SetProductOperands(common::DType::kBF16), IsOk());
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 2);
  Stages<float> trained = MakeStages<float>(cpu->get(), c, {});
  const auto evaluate = [&](ModelChunk& m) {
    float loss = 0;
    EXPECT_THAT(m.Evaluate(2, batch.tokens.data(), batch.targets.data(), &loss), IsOk());
    return loss;
  };
  const auto fresh_with_weights_of = [&](ModelChunk& m) {
    Stages<float> fresh = MakeStages<float>(cpu->get(), c, {});
    for (const model::ParamSpec& p : m.Params()) {
      EXPECT_THAT(fresh[0]->SetParam(p.name, *m.GetParam(p.name)), IsOk());
    }
    return evaluate(*fresh[0]);
  };
  const float initial = evaluate(*trained[0]);

  RunStep(trained, batch, 2);
  ASSERT_THAT(trained[0]->OptimizerStep({.lr = 0.05f}), IsOk());
  const float stepped = evaluate(*trained[0]);
  EXPECT_NE(stepped, initial);
  EXPECT_EQ(stepped, fresh_with_weights_of(*trained[0]));

  const std::string fc = "transformer.h.0.mlp.c_fc.weight";
  std::vector<float> w = *trained[0]->GetParam(fc);
  for (float& v : w) v *= 1.5f;
  ASSERT_THAT(trained[0]->SetParam(fc, w), IsOk());
  const float set = evaluate(*trained[0]);
  EXPECT_NE(set, stepped);
  EXPECT_EQ(set, fresh_with_weights_of(*trained[0]));

  ASSERT_THAT(trained[0]->Initialize(5), IsOk());
  EXPECT_EQ(evaluate(*trained[0]), initial);
}

// The weights' copy is made once per step and layer, however many micro-batches read
// it: a backend that counts the copies it makes of parameters, over two steps of three
// micro-batches.
TEST(ModelChunkTest, TheBf16ProductCopyIsMadeOncePerStep) {
  class CountingCopies : public HostBackend {
   public:
    absl::Status MakeProductCopy(int64_t n, const float* x, void* copy) override {
      if (weights.contains(x)) ++copies;  // activations are copied too
      return HostBackend::MakeProductCopy(n, x, copy);
    }
    std::set<const float*> weights;
    int copies = 0;
  } backend;
  ASSERT_THAT(backend.SetProductOperands(common::DType::kBF16), IsOk());
  const model::TransformerConfig c = Tiny();
  const Batch batch = MakeBatch(c, 3);
  Stages<float> s = MakeStages<float>(&backend, c, {2});
  const int layers = c.num_pipeline_layers();
  for (auto& stage : s) {
    for (int l = stage->begin(); l < stage->end(); ++l) {
      backend.weights.insert(stage->layer(l).all_params());
    }
  }
  // The embedding reads its table by lookup, not by a product: it makes no copy.
  for (int step = 1; step <= 2; ++step) {
    RunStep(s, batch, 3);
    for (auto& stage : s) ASSERT_THAT(stage->OptimizerStep({.lr = 0.01f}), IsOk());
    EXPECT_EQ(backend.copies, step * (layers - 1)) << "step " << step;
  }
  // fp32 products read the weights themselves: no copy.
  ASSERT_THAT(backend.SetProductOperands(common::DType::kF32), IsOk());
  RunStep(s, batch, 3);
  EXPECT_EQ(backend.copies, 2 * (layers - 1));
  EXPECT_THAT(backend.MakeProductCopy(1, s[0]->layer(0).param(0), s[0]->layer(0).param(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("bf16 products")));
}

TEST(ModelChunkTest, MisuseIsAnErrorNamingTheMicroBatch) {
  HostBackend backend;
  const model::TransformerConfig c = Tiny();
  EXPECT_THAT(ModelChunk::Create(c, 2, 2, &backend),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[2, 2)")));
  EXPECT_THAT(ModelChunk::Create(c, 0, 9, &backend), StatusIs(absl::StatusCode::kInvalidArgument));
  Stages<float> s = MakeStages<float>(&backend, c, {2});
  const Batch batch = MakeBatch(c, 1);
  std::vector<float> out(c.seq_len * c.d_model);
  ASSERT_THAT(s[0]->Forward(4, 1, batch.tokens.data(), nullptr, out.data()), IsOk());
  EXPECT_THAT(s[0]->Forward(4, 1, batch.tokens.data(), nullptr, out.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("micro-batch 4")));
  EXPECT_THAT(s[0]->BackwardWeight(4),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("backward-input")));
  EXPECT_THAT(s[0]->Backward(5, out.data(), nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("micro-batch 5")));
  float loss;
  EXPECT_THAT(s[1]->Forward(0, 1, out.data(), nullptr, &loss),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("targets")));
  EXPECT_THAT(s[1]->GetParam("transformer.wte.weight"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("layers [2, 5)")));
  EXPECT_THAT(s[1]->SetParam("lm_head.weight", {1.0f}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("88 elements")));
}

}  // namespace
}  // namespace pipetrain::compute
