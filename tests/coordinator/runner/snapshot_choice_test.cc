// Choosing the state a job continues from out of its surviving stages' snapshots: the
// newest step every chunk is held at, own copies first; and assembling the blobs, which
// refuses one of another step instead of mixing two steps' states.
#include "coordinator/runner/snapshot_choice.h"

#include <random>

#include "common/model/checkpoint.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Holder h of a ring of K: its own chunk at each step, and its predecessor's copy.
std::vector<SnapshotEntry> Ring(int h, int k, std::vector<int64_t> own, std::vector<int64_t> held) {
  std::vector<SnapshotEntry> out;
  for (int64_t s : own) out.push_back({h, 0, s, false});
  for (int64_t s : held) out.push_back({(h - 1 + k) % k, 0, s, true});
  return out;
}

TEST(ChooseSnapshotStepTest, TakesTheNewestStepEveryStageIsHeldAtOwnCopiesFirst) {
  // Stage 1 of 3 is lost; stage 2 holds its copies of steps 4 and 5.
  const std::vector<std::vector<SnapshotEntry>> listings = {Ring(0, 3, {4, 5}, {4, 5}),
                                                            Ring(2, 3, {4, 5}, {4, 5})};
  auto choice = ChooseSnapshotStep(listings, 3, 1, 100);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 5);
  ASSERT_EQ(choice->picks.size(), 3u);
  EXPECT_EQ(choice->picks[0].holder, 0);  // stage 0's own
  EXPECT_EQ(choice->picks[1].holder, 1);  // stage 1's copy on stage 2 (listing 1)
  EXPECT_EQ(choice->picks[2].holder, 1);  // stage 2's own
  EXPECT_EQ(choice->picks[1].owner_stage, 1);
}

TEST(ChooseSnapshotStepTest, FallsBackToTheStepBeforeWhenTheNewestCopyNeverArrived) {
  // Stage 1 was lost while its copy of step 5 was on the way: only 4 is complete.
  const std::vector<std::vector<SnapshotEntry>> listings = {Ring(0, 3, {4, 5}, {4, 5}),
                                                            Ring(2, 3, {4, 5}, {4})};
  auto choice = ChooseSnapshotStep(listings, 3, 1, 100);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 4);
}

TEST(ChooseSnapshotStepTest, NeverAStepTheJobHasNotRecorded) {
  // The stages finished step 5 after the coordinator recorded step 4.
  const std::vector<std::vector<SnapshotEntry>> listings = {Ring(0, 2, {4, 5}, {4, 5}),
                                                            Ring(1, 2, {4, 5}, {4, 5})};
  auto choice = ChooseSnapshotStep(listings, 2, 1, 4);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 4);
  EXPECT_FALSE(ChooseSnapshotStep(listings, 2, 1, 3).has_value());
}

TEST(ChooseSnapshotStepTest, NoneWhenAStageAndItsCopyAreBothGone) {
  // Stages 1 and 2 of 3 lost at once: stage 1's copy was on stage 2.
  const std::vector<std::vector<SnapshotEntry>> listings = {Ring(0, 3, {4, 5}, {4, 5})};
  EXPECT_FALSE(ChooseSnapshotStep(listings, 3, 1, 100).has_value());
  EXPECT_FALSE(ChooseSnapshotStep({}, 3, 1, 100).has_value());
}

TEST(ChooseSnapshotStepTest, NeedsEveryChunkOfAnInterleavedLayoutAndIgnoresOtherLayouts) {
  std::vector<std::vector<SnapshotEntry>> listings = {
      {{0, 0, 3, false}, {0, 1, 3, false}, {1, 0, 3, true}},
      {{7, 0, 3, false}}};  // not a stage of a 2-stage layout
  EXPECT_FALSE(ChooseSnapshotStep(listings, 2, 2, 100).has_value()) << "stage 1 chunk 1 missing";
  listings[0].push_back({1, 1, 3, true});
  auto choice = ChooseSnapshotStep(listings, 2, 2, 100);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 3);
  EXPECT_EQ(choice->picks.size(), 4u);
}

model::TransformerConfig Tiny() { return {256, 16, 32, 4, 2}; }  // pipeline layers 0..3

model::ParamMap Random(int begin, int end, std::mt19937& rng) {
  model::ParamMap params;
  std::normal_distribution<float> normal;
  for (const model::ParamSpec& p : model::CheckpointParams(Tiny(), begin, end)) {
    auto t = common::Tensor::Create(common::DType::kF32, p.shape);
    EXPECT_THAT(t, IsOk());
    for (float& v : t->data<float>()) v = normal(rng);
    params.emplace(p.name, *std::move(t));
  }
  return params;
}

std::string Blob(int begin, int end, int64_t step, uint32_t seed) {
  std::mt19937 rng(seed);
  model::Checkpoint c{Tiny(), begin, end, Random(begin, end, rng), std::nullopt};
  c.optimizer = model::AdamWState{Random(begin, end, rng), Random(begin, end, rng), step};
  absl::StatusOr<std::string> bytes = model::SerializeCheckpoint(c);
  EXPECT_THAT(bytes, IsOk());
  return bytes.ok() ? *bytes : "";
}

TEST(AssembleSnapshotTest, MergesTheChosenBlobsIntoTheWholeModel) {
  SnapshotChoice choice{6, {{0, 0, 0}, {1, 1, 0}}};
  auto whole = AssembleSnapshot(
      choice,
      [](const SnapshotPick& p) -> absl::StatusOr<std::string> {
        return p.owner_stage == 0 ? Blob(0, 2, 6, 1) : Blob(2, 4, 6, 2);
      },
      "job-000001");
  ASSERT_THAT(whole, IsOk());
  EXPECT_EQ(whole->layer_begin, 0);
  EXPECT_EQ(whole->layer_end, 4);
  ASSERT_TRUE(whole->optimizer.has_value());
  EXPECT_EQ(whole->optimizer->step, 6);
}

TEST(AssembleSnapshotTest, RefusesABlobOfAnotherStepNamingIt) {
  SnapshotChoice choice{6, {{0, 0, 0}, {1, 1, 0}}};
  auto whole = AssembleSnapshot(
      choice,
      [](const SnapshotPick& p) -> absl::StatusOr<std::string> {
        return p.owner_stage == 0 ? Blob(0, 2, 6, 1) : Blob(2, 4, 7, 2);
      },
      "job-000001");
  EXPECT_THAT(whole, StatusIs(absl::StatusCode::kDataLoss,
                              AllOf(HasSubstr("job-000001"), HasSubstr("stage 1 chunk 0"),
                                    HasSubstr("after 7 updates, not 6"))));
}

TEST(AssembleSnapshotTest, AFailedFetchNamesTheStageAndStep) {
  SnapshotChoice choice{6, {{0, 0, 0}}};
  auto whole = AssembleSnapshot(
      choice,
      [](const SnapshotPick&) -> absl::StatusOr<std::string> {
        return absl::UnavailableError("connection refused");
      },
      "job-000009");
  EXPECT_THAT(whole, StatusIs(absl::StatusCode::kUnavailable,
                              AllOf(HasSubstr("job-000009"), HasSubstr("step 6 of stage 0"),
                                    HasSubstr("connection refused"))));
}

}  // namespace
}  // namespace pipetrain::coordinator
