// Generation with a key-value cache: on tiny random models (several blocks, untied and
// tied embeddings) the decoder's logits at every position equal those of the training
// path's forwards (Logits), on cpu (float) and on the double host backend; greedy
// generation is the argmax of the reference logits of the growing text, the sliding
// window included; sampling is reproducible from its seed, follows softmax(logits / T)
// and its top-k cut; bad arguments are refused. The cuda case skips without a GPU.
#include "stage_server/compute/kv_cache_decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/host_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/token_generator.h"
#include "stage_server/compute/token_sampler.h"
#include "tests/testing/backend_testing.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsClose;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::RandomIds;
using ::pipetrain::testing::RandomNormal;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

model::TransformerConfig Tiny(bool tied) {
  return {.vocab_size = 23,
          .seq_len = 12,
          .d_model = 16,
          .n_heads = 4,
          .n_layers = 3,
          .tie_embeddings = tied};
}

// Every parameter random, biases and LayerNorms included, so that a wrong bias, scale
// or cache position shows: matrices N(0, 0.25^2) (attention far from uniform), LayerNorm
// weights 1 + N(0, 0.1^2), biases N(0, 0.1^2). A tied lm_head gets wte's values. The
// values are drawn in float, so float and double models hold the same weights.
template <typename Real>
std::unique_ptr<ModelChunkT<Real>> RandomModel(BackendT<Real>* be,
                                               const model::TransformerConfig& c, uint64_t seed) {
  auto chunk = ModelChunkT<Real>::Create(c, 0, c.num_pipeline_layers(), be);
  EXPECT_THAT(chunk, IsOk());
  if (!chunk.ok()) return nullptr;
  std::map<std::string, std::vector<Real>> values;
  uint64_t stream = seed * 1000;
  for (const model::ParamSpec& p : (*chunk)->Params()) {
    const size_t n = static_cast<size_t>(p.num_elements());
    std::vector<float> v;
    if (!p.tied_to.empty()) {
      v.assign(values[p.tied_to].begin(), values[p.tied_to].end());
    } else if (p.is_matrix) {
      v = RandomNormal(n, ++stream, 0.25);
    } else if (absl::StrContains(p.name, "ln_") && absl::EndsWith(p.name, ".weight")) {
      v = RandomNormal(n, ++stream, 0.1, 1.0);
    } else {
      v = RandomNormal(n, ++stream, 0.1);
    }
    values[p.name].assign(v.begin(), v.end());
    EXPECT_THAT((*chunk)->SetParam(p.name, values[p.name]), IsOk()) << p.name;
  }
  return *std::move(chunk);
}

// A prompt of random ids in [0, V) that is not one id repeated.
std::vector<int32_t> RandomPrompt(size_t n, int V, uint64_t seed) {
  std::vector<int32_t> ids = RandomIds(n, V, seed);
  if (n > 1 && std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return id == ids[0]; })) {
    ids[1] = (ids[0] + 1) % V;
  }
  return ids;
}

template <typename Real>
std::vector<double> Row(const std::vector<Real>& m, int row, int V) {
  return {m.begin() + int64_t{row} * V, m.begin() + int64_t{row + 1} * V};
}

template <typename Real>
int32_t Argmax(std::span<const Real> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The reference's choice after `context`: the argmax of its last row of logits.
template <typename Real>
int32_t ReferenceGreedy(ModelChunkT<Real>& model, std::span<const int32_t> context) {
  auto logits = Logits(model, context);
  EXPECT_THAT(logits, IsOk());
  if (!logits.ok()) return -1;
  const int V = model.config().vocab_size;
  return Argmax(std::span<const Real>(*logits).last(V));
}

// A random model and its decoder, on the cpu backend (float) or the double host backend.
// Members are destroyed in reverse order, the backend last.
template <typename Real>
struct TestModel {
  std::unique_ptr<BackendT<Real>> backend;
  std::unique_ptr<ModelChunkT<Real>> model;
  std::unique_ptr<KvCacheDecoderT<Real>> decoder;
};

template <typename Real>
TestModel<Real> MakeTestModel(bool tied, uint64_t seed) {
  TestModel<Real> m;
  if constexpr (std::is_same_v<Real, float>) {
    auto cpu = CpuBackend::Create(1);
    EXPECT_THAT(cpu, IsOk());
    if (!cpu.ok()) return m;
    m.backend = *std::move(cpu);
  } else {
    m.backend = std::make_unique<HostBackendDouble>();
  }
  m.model = RandomModel<Real>(m.backend.get(), Tiny(tied), seed);
  if (m.model == nullptr) return m;
  auto decoder = KvCacheDecoderT<Real>::Create(m.model.get());
  EXPECT_THAT(decoder, IsOk());
  if (decoder.ok()) m.decoder = *std::move(decoder);
  return m;
}

absl::StatusOr<std::vector<int32_t>> Generate(KvCacheDecoder& d, std::span<const int32_t> prompt,
                                              int n, const SamplingOptions& s) {
  return GenerateTokens(d, prompt, n, s, [](int32_t) { return absl::OkStatus(); });
}

// ---- Decoder logits against the reference -----------------------------------------------

// Feeds a random prompt of seq_len tokens one at a time and holds the logits after each
// to row t of the reference's logits of the whole prompt.
template <typename Real>
void ExpectDecoderMatchesLogits(BackendT<Real>* be, bool tied, double tolerance) {
  const model::TransformerConfig c = Tiny(tied);
  for (uint64_t seed : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(be->Name(), tied ? " tied" : " untied", " seed ", seed));
    auto model = RandomModel(be, c, seed);
    ASSERT_NE(model, nullptr);
    const std::vector<int32_t> prompt = RandomPrompt(c.seq_len, c.vocab_size, seed);
    auto want = Logits(*model, prompt);
    ASSERT_THAT(want, IsOk());
    auto decoder = KvCacheDecoderT<Real>::Create(model.get());
    ASSERT_THAT(decoder, IsOk());
    std::vector<Real> got;
    for (int t = 0; t < c.seq_len; ++t) {
      ASSERT_THAT((*decoder)->Feed(prompt[t], &got), IsOk()) << "position " << t;
      EXPECT_TRUE(IsClose(got, Row(*want, t, c.vocab_size), tolerance)) << "position " << t;
    }
    EXPECT_EQ((*decoder)->position(), c.seq_len);
    // After a Reset the cache is rewritten from position 0: a shorter prompt matches the
    // reference of that prompt alone.
    (*decoder)->Reset();
    const std::vector<int32_t> other = RandomPrompt(5, c.vocab_size, seed + 10);
    auto want_other = Logits(*model, other);
    ASSERT_THAT(want_other, IsOk());
    for (int t = 0; t < 5; ++t) {
      ASSERT_THAT((*decoder)->Feed(other[t], t == 4 ? &got : nullptr), IsOk());
    }
    EXPECT_TRUE(IsClose(got, Row(*want_other, 4, c.vocab_size), tolerance)) << "after Reset";
  }
}

TEST(KvCacheDecoderTest, MatchesLogitsOnCpu) {
  auto cpu = CpuBackend::Create(1);
  ASSERT_THAT(cpu, IsOk());
  for (bool tied : {false, true}) {
    ExpectDecoderMatchesLogits<float>(cpu->get(), tied, ::pipetrain::testing::kFp32Tolerance);
  }
}

TEST(KvCacheDecoderTest, MatchesLogitsOnTheDoubleHostBackend) {
  HostBackendDouble host;
  for (bool tied : {false, true}) ExpectDecoderMatchesLogits<double>(&host, tied, 1e-12);
}

// Logits of a prefix are the first rows of the logits of the whole: the padding the
// reference adds never reaches an earlier position.
TEST(KvCacheDecoderTest, LogitsOfAPrefixAreTheFirstRowsOfTheWhole) {
  HostBackendDouble host;
  const model::TransformerConfig c = Tiny(false);
  auto model = RandomModel<double>(&host, c, 3);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(c.seq_len, c.vocab_size, 3);
  auto whole = Logits(*model, prompt);
  ASSERT_THAT(whole, IsOk());
  auto prefix = Logits(*model, std::span<const int32_t>(prompt).first(4));
  ASSERT_THAT(prefix, IsOk());
  ASSERT_EQ(prefix->size(), size_t{4} * c.vocab_size);
  EXPECT_TRUE(IsClose(*prefix, std::vector<double>(whole->begin(), whole->begin() + prefix->size()),
                      1e-13));
}

TEST(KvCacheDecoderTest, MatchesLogitsOnCuda) {
  if (!common::HasCudaDevice()) {
    GTEST_SKIP() << "no usable GPU: " << common::ProbeCuda().reason;
  }
  auto cuda = CreateCudaBackend(0, {.check_every_op = true});
  ASSERT_THAT(cuda, IsOk());
  HostBackendDouble host;
  for (bool tied : {false, true}) {
    const model::TransformerConfig c = Tiny(tied);
    auto model = RandomModel<float>(cuda->get(), c, 4);
    auto reference = RandomModel<double>(&host, c, 4);  // the same weights, in double
    ASSERT_NE(model, nullptr);
    ASSERT_NE(reference, nullptr);
    const std::vector<int32_t> prompt = RandomPrompt(c.seq_len, c.vocab_size, 4);
    auto want = Logits(*reference, prompt);
    ASSERT_THAT(want, IsOk());
    auto decoder = KvCacheDecoder::Create(model.get());
    ASSERT_THAT(decoder, IsOk());
    std::vector<float> got;
    for (int t = 0; t < c.seq_len; ++t) {
      ASSERT_THAT((*decoder)->Feed(prompt[t], &got), IsOk()) << "position " << t;
      // The L2 rule only, as for the cuda ops (backend_testing.h).
      EXPECT_TRUE(IsClose(got, Row(*want, t, c.vocab_size), ::pipetrain::testing::kFp32Tolerance,
                          /*elementwise=*/false))
          << (tied ? "tied" : "untied") << " position " << t;
    }
  }
}

// ---- Greedy generation ---------------------------------------------------------------

TEST(TokenGeneratorTest, GreedyIsTheArgmaxOfTheReferenceOfTheGrowingText) {
  for (bool tied : {false, true}) {
    const model::TransformerConfig c = Tiny(tied);
    TestModel<float> m = MakeTestModel<float>(tied, 5);
    ASSERT_NE(m.decoder, nullptr);
    const std::vector<int32_t> prompt = RandomPrompt(3, c.vocab_size, 5);
    std::vector<int32_t> streamed;
    auto tokens =
        GenerateTokens(*m.decoder, prompt, c.seq_len - 3, {.temperature = 0}, [&](int32_t t) {
          streamed.push_back(t);
          return absl::OkStatus();
        });
    ASSERT_THAT(tokens, IsOk());
    ASSERT_EQ(tokens->size(), size_t(c.seq_len - 3));
    EXPECT_EQ(streamed, *tokens) << "each token is handed over as it is drawn";
    std::vector<int32_t> text = prompt;
    for (size_t i = 0; i < tokens->size(); ++i) {
      EXPECT_EQ((*tokens)[i], ReferenceGreedy(*m.model, text)) << "token " << i;
      text.push_back((*tokens)[i]);
    }
  }
}

// Past seq_len the window slides: the context of every draw is what the header says
// (the last seq_len tokens of a long prompt; when full, the last seq_len / 2 tokens).
TEST(TokenGeneratorTest, SlidingWindowDrawsFromTheDocumentedContext) {
  const model::TransformerConfig c = Tiny(false);
  TestModel<double> m = MakeTestModel<double>(false, 6);
  ASSERT_NE(m.decoder, nullptr);
  const int keep = SlideKeep(c.seq_len);
  EXPECT_EQ(keep, 6);
  for (size_t prompt_length : {size_t{5}, size_t{20}}) {
    SCOPED_TRACE(absl::StrCat("prompt of ", prompt_length));
    const std::vector<int32_t> prompt = RandomPrompt(prompt_length, c.vocab_size, 6);
    auto tokens = GenerateTokens(*m.decoder, prompt, 30, {.temperature = 0},
                                 [](int32_t) { return absl::OkStatus(); });
    ASSERT_THAT(tokens, IsOk());
    std::vector<int32_t> text = prompt;
    size_t start = text.size() > size_t(c.seq_len) ? text.size() - c.seq_len : 0;
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::span<const int32_t> context = std::span<const int32_t>(text).subspan(start);
      ASSERT_LE(context.size(), size_t(c.seq_len));
      EXPECT_EQ((*tokens)[i], ReferenceGreedy(*m.model, context)) << "token " << i;
      text.push_back((*tokens)[i]);
      if (context.size() == size_t(c.seq_len)) start = text.size() - keep;
    }
  }
}

// ---- Sampling ---------------------------------------------------------------------------

TEST(TokenSamplerTest, GreedyTakesTheLowestIdOfATie) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  auto id = SampleToken<float>(logits, {.temperature = 0}, 0);
  ASSERT_THAT(id, IsOk());
  EXPECT_EQ(*id, 1);
  // top-k 1 keeps the same id whatever the draw.
  for (uint64_t draw = 0; draw < 50; ++draw) {
    auto k1 = SampleToken<float>(logits, {.temperature = 1.5, .top_k = 1, .seed = 3}, draw);
    ASSERT_THAT(k1, IsOk());
    EXPECT_EQ(*k1, 1) << "draw " << draw;
  }
}

// The draws are pinned: the same seed gives these ids on every machine (the uniform
// numbers come from model::UniformAt, not from a standard library's distribution).
TEST(TokenSamplerTest, DrawsArePinnedBySeedAndIndex) {
  const std::vector<double> logits = {0.1, -0.3, 0.8, 0.0, 0.5, -1.2, 0.3, 0.2};
  std::vector<int32_t> got;
  for (uint64_t draw = 0; draw < 12; ++draw) {
    auto id = SampleToken<double>(logits, {.temperature = 1.0, .seed = 42}, draw);
    ASSERT_THAT(id, IsOk());
    got.push_back(*id);
  }
  EXPECT_EQ(got, (std::vector<int32_t>{4, 2, 7, 4, 5, 2, 7, 6, 3, 2, 4, 2}));
}

// Frequencies follow softmax(logits / T): two ids with logits 0 and ln 3 are drawn 1:3
// at T = 1 and 1:sqrt(3) at T = 2.
TEST(TokenSamplerTest, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(3.0))};
  for (const auto& [temperature, p1] : {std::pair{1.0, 0.75}, {2.0, 0.6339746}}) {
    int ones = 0;
    const int n = 20000;
    for (int draw = 0; draw < n; ++draw) {
      auto id = SampleToken<float>(logits, {.temperature = temperature, .seed = 9}, draw);
      ASSERT_THAT(id, IsOk());
      ones += *id;
    }
    // 4 standard deviations of a binomial proportion.
    EXPECT_NEAR(double(ones) / n, p1, 4 * std::sqrt(p1 * (1 - p1) / n)) << "T " << temperature;
  }
}

TEST(TokenSamplerTest, TopKDrawsOnlyTheKMostLikely) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.5f, 2.9f, 2.8f, -4.0f, 2.8f};
  std::map<int32_t, int> seen;
  for (uint64_t draw = 0; draw < 3000; ++draw) {
    auto id = SampleToken<float>(logits, {.temperature = 5.0, .top_k = 3, .seed = 1}, draw);
    ASSERT_THAT(id, IsOk());
    ++seen[*id];
  }
  // 3.0, 2.9, and of the two 2.8s the lower id; all three are drawn.
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
  EXPECT_GT(seen[4], 0);
  // k >= V keeps every id.
  auto all = SampleToken<float>(logits, {.temperature = 1.0, .top_k = 100}, 0);
  EXPECT_THAT(all, IsOk());
}

TEST(TokenGeneratorTest, ASeedReproducesTheTextAndSeedsDiffer) {
  TestModel<float> m = MakeTestModel<float>(true, 7);
  ASSERT_NE(m.decoder, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(4, Tiny(true).vocab_size, 7);
  auto run = [&](SamplingOptions s) {
    auto tokens = Generate(*m.decoder, prompt, 40, s);
    EXPECT_THAT(tokens, IsOk());
    return tokens.ok() ? *tokens : std::vector<int32_t>{};
  };
  const std::vector<int32_t> a = run({.temperature = 1.0, .seed = 1});
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(run({.temperature = 1.0, .seed = 1}), a) << "the same seed, the same tokens";
  EXPECT_NE(run({.temperature = 1.0, .seed = 2}), a) << "another seed, other tokens";
  // top-k 1 is greedy at any temperature and seed.
  EXPECT_EQ(run({.temperature = 0.7, .top_k = 1, .seed = 5}), run({.temperature = 0}));
}

// ---- Errors -------------------------------------------------------------------------------

TEST(TokenSamplerTest, RefusesBadOptionsAndLogits) {
  const std::vector<float> logits = {0.0f, 1.0f};
  for (double t : {-0.5, std::nan(""), double{INFINITY}}) {
    EXPECT_THAT(SampleToken<float>(logits, {.temperature = t}, 0),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("temperature")))
        << t;
  }
  EXPECT_THAT(SampleToken<float>(logits, {.top_k = -1}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));
  EXPECT_THAT(SampleToken<float>({}, {}, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<float> nan = {0.0f, std::nanf("")};
  EXPECT_THAT(SampleToken<float>(nan, {}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the logit of id 1")));
}

TEST(KvCacheDecoderTest, RefusesBadTokensAPartialModelAndAFullCache) {
  const model::TransformerConfig c = Tiny(false);
  TestModel<double> m = MakeTestModel<double>(false, 8);
  ASSERT_NE(m.decoder, nullptr);
  KvCacheDecoderT<double>* decoder = m.decoder.get();
  ModelChunkT<double>* model = m.model.get();
  HostBackendDouble host;
  EXPECT_THAT(decoder->Feed(c.vocab_size, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("token 23 at position 0 is outside the vocabulary [0, 23)")));
  EXPECT_THAT(decoder->Feed(-1, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(decoder->position(), 0) << "a refused token takes no position";
  for (int t = 0; t < c.seq_len; ++t) ASSERT_THAT(decoder->Feed(1, nullptr), IsOk());
  EXPECT_THAT(decoder->Feed(1, nullptr),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("seq_len = 12")));

  auto part = ModelChunkT<double>::Create(c, 0, 2, &host);
  ASSERT_THAT(part, IsOk());
  EXPECT_THAT(KvCacheDecoderT<double>::Create(part->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whole model")));
  EXPECT_THAT(Logits(**part, std::vector<int32_t>{1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whole model")));
  EXPECT_THAT(Logits(*model, std::vector<int32_t>{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to seq_len")));
  EXPECT_THAT(Logits(*model, std::vector<int32_t>(13, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to seq_len")));
}

TEST(TokenGeneratorTest, RefusesAnEmptyPromptBadCountsAndOptions) {
  TestModel<float> m = MakeTestModel<float>(false, 9);
  ASSERT_NE(m.decoder, nullptr);
  KvCacheDecoder& decoder = *m.decoder;
  const std::vector<int32_t> prompt = {1, 2};
  EXPECT_THAT(Generate(decoder, {}, 3, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prompt is empty")));
  EXPECT_THAT(Generate(decoder, prompt, -1, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(Generate(decoder, prompt, 3, {.temperature = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("temperature")));
  EXPECT_THAT(Generate(decoder, prompt, 3, {.top_k = -2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));
  EXPECT_THAT(Generate(decoder, std::vector<int32_t>{1, 99}, 3, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 99")));
  // The caller's error stops the loop.
  int calls = 0;
  EXPECT_THAT(GenerateTokens(decoder, prompt, 5, {},
                             [&](int32_t) {
                               return ++calls == 2 ? absl::CancelledError("enough")
                                                   : absl::OkStatus();
                             }),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(calls, 2);
  auto none = Generate(decoder, prompt, 0, {});
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace pipetrain::compute
