// Joining the exports of copies that split the optimizer: each moment element comes from
// the copy whose piece of the layer holds it, so a stage's R copies give back the
// checkpoint of one unsplit stage bit for bit (every range: the embedding, blocks, the
// head with a tied copy); copies that disagree on anything else are refused by name.
#include "common/model/split_checkpoint.h"

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/transformer_config.h"
#include "common/model/optimizer_split.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TransformerConfig Tied() {
  TransformerConfig c{.vocab_size = 37, .seq_len = 8, .d_model = 12, .n_heads = 2, .n_layers = 2};
  c.tie_embeddings = true;
  return c;
}

common::Tensor Random(const ParamSpec& p, std::mt19937& rng) {
  common::Tensor t = *common::Tensor::Create(common::DType::kF32, p.shape);
  std::normal_distribution<float> d;
  for (float& x : t.data<float>()) x = d(rng);
  return t;
}

// The whole range's state with fresh random weights and moments.
Checkpoint Whole(const TransformerConfig& config, int begin, int end) {
  std::mt19937 rng(begin * 100 + end);
  Checkpoint c{.config = config, .layer_begin = begin, .layer_end = end};
  c.optimizer.emplace();
  c.optimizer->step = 7;
  for (const ParamSpec& p : CheckpointParams(config, begin, end)) {
    c.params.emplace(p.name, Random(p, rng));
    c.optimizer->m.emplace(p.name, Random(p, rng));
    c.optimizer->v.emplace(p.name, Random(p, rng));
  }
  return c;
}

// What copy r of `copies` exports: the whole weights, its pieces' moments, zeros elsewhere.
Checkpoint CopyOf(const Checkpoint& whole, int copies, int r) {
  Checkpoint c{.config = whole.config, .layer_begin = whole.layer_begin,
               .layer_end = whole.layer_end};
  c.optimizer.emplace();
  c.optimizer->step = whole.optimizer->step;
  for (const auto& [name, t] : whole.params) c.params.emplace(name, t.Clone());
  for (int layer = whole.layer_begin; layer < whole.layer_end; ++layer) {
    const std::vector<ParamSpec> specs = LayerParams(whole.config, layer);
    uint64_t elements = 0;
    for (const ParamSpec& p : specs) elements += p.num_elements();
    const CopyRange piece = RangeOfCopy(elements, copies, r);
    uint64_t offset = 0;
    for (const ParamSpec& p : specs) {
      const uint64_t at = offset;
      offset += p.num_elements();
      if (!whole.optimizer->m.contains(p.name)) continue;
      for (bool second : {false, true}) {
        const ParamMap& from = second ? whole.optimizer->v : whole.optimizer->m;
        common::Tensor t = from.at(p.name).Clone();
        std::span<float> x = t.data<float>();
        for (uint64_t i = 0; i < x.size(); ++i) {
          if (at + i < piece.begin || at + i >= piece.end) x[i] = 0.0f;
        }
        (second ? c.optimizer->v : c.optimizer->m).emplace(p.name, std::move(t));
      }
    }
  }
  return c;
}

bool SameBits(const ParamMap& a, const ParamMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || t.bytes().size() != it->second.bytes().size() ||
        !std::equal(t.bytes().begin(), t.bytes().end(), it->second.bytes().begin())) {
      return false;
    }
  }
  return true;
}

TEST(SplitCheckpointTest, CopiesJoinIntoTheUnsplitStagesCheckpointBitForBit) {
  const TransformerConfig config = Tied();
  const int layers = config.num_pipeline_layers();
  for (auto [begin, end] : {std::pair{0, layers}, std::pair{0, 1}, std::pair{1, 3},
                            std::pair{layers - 1, layers}, std::pair{2, layers}}) {
    for (int copies : {1, 2, 3, 5}) {
      SCOPED_TRACE(absl::StrCat("layers [", begin, ", ", end, "), ", copies, " copies"));
      const Checkpoint whole = Whole(config, begin, end);
      std::vector<Checkpoint> parts;
      for (int r = 0; r < copies; ++r) parts.push_back(CopyOf(whole, copies, r));
      absl::StatusOr<Checkpoint> joined = JoinCopies(std::move(parts), "stage 1 chunk 0");
      ASSERT_THAT(joined.status(), IsOk());
      EXPECT_TRUE(SameBits(joined->params, whole.params));
      EXPECT_TRUE(SameBits(joined->optimizer->m, whole.optimizer->m));
      EXPECT_TRUE(SameBits(joined->optimizer->v, whole.optimizer->v));
      EXPECT_EQ(joined->optimizer->step, 7);
      if (copies > 1) {
        // One copy alone is not the whole (its zeros show).
        EXPECT_FALSE(SameBits(CopyOf(whole, copies, 0).optimizer->m, whole.optimizer->m));
      }
    }
  }
}

TEST(SplitCheckpointTest, CopiesThatDisagreeAreRefusedByName) {
  const Checkpoint whole = Whole(Tied(), 1, 3);
  auto join = [&](const std::function<void(Checkpoint&)>& spoil) {
    std::vector<Checkpoint> parts;
    for (int r = 0; r < 2; ++r) parts.push_back(CopyOf(whole, 2, r));
    spoil(parts[1]);
    return JoinCopies(std::move(parts), "job 'j' stage 1 chunk 0").status();
  };
  EXPECT_THAT(join([](Checkpoint& c) { c.optimizer->step = 6; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job 'j' stage 1 chunk 0"), HasSubstr("copy 1"),
                             HasSubstr("update 6"))));
  EXPECT_THAT(join([](Checkpoint& c) { c.optimizer.reset(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no optimizer state")));
  EXPECT_THAT(join([](Checkpoint& c) { c.params.begin()->second.data<float>()[0] += 1; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("other weights")));
  EXPECT_THAT(join([](Checkpoint& c) { c.layer_end = 2; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer range")));
  EXPECT_THAT(join([](Checkpoint& c) { c.optimizer->v.erase(c.optimizer->v.begin()); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lacks the moments")));
  EXPECT_THAT(JoinCopies({}, "x").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::model
