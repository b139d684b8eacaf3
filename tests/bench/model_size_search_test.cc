// The searches behind `pipetrain-bench model-size`: the binary search for the largest n
// that fits, the step down after a failed training run, and the planner-only search,
// checked against MakePlan itself at the answer and one past it.
#include "bench/model_size_search.h"

#include <set>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::bench {
namespace {

using ::pipetrain::testing::IsOk;
using ::testing::HasSubstr;

TEST(LargestFittingTest, FindsTheLastNOfAThresholdInFewCalls) {
  for (int64_t threshold : {0, 1, 7, 500, 999, 1000}) {
    int calls = 0;
    auto n = LargestFitting(0, 1000, [&](int64_t x) -> absl::StatusOr<bool> {
      ++calls;
      return x <= threshold;
    });
    ASSERT_THAT(n, IsOk());
    EXPECT_EQ(*n, threshold);
    EXPECT_LE(calls, 12) << "threshold " << threshold;  // 1 + ceil(log2(1001))
  }
}

TEST(LargestFittingTest, EverythingFitsGivesHi) {
  auto n = LargestFitting(3, 17, [](int64_t) -> absl::StatusOr<bool> { return true; });
  ASSERT_THAT(n, IsOk());
  EXPECT_EQ(*n, 17);
  auto one = LargestFitting(5, 5, [](int64_t) -> absl::StatusOr<bool> { return true; });
  ASSERT_THAT(one, IsOk());
  EXPECT_EQ(*one, 5);
}

TEST(LargestFittingTest, NothingFitsIsAClearError) {
  auto n = LargestFitting(4, 40, [](int64_t) -> absl::StatusOr<bool> { return false; });
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(n.status().message(), HasSubstr("nothing in [4, 40] fits"));
}

TEST(LargestFittingTest, AnEmptyRangeAndAPredicateErrorAreReturned) {
  auto empty = LargestFitting(5, 4, [](int64_t) -> absl::StatusOr<bool> { return true; });
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto failing = LargestFitting(0, 100, [](int64_t x) -> absl::StatusOr<bool> {
    if (x > 10) return absl::InternalError("model.d_model: broken at 11+");
    return true;
  });
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failing.status().message(), HasSubstr("model.d_model"));
}

// As documented: a predicate that is not monotone gives a boundary, some n that fits
// with n + 1 not fitting, though not necessarily the largest n that fits.
TEST(LargestFittingTest, ANonMonotonePredicateGivesABoundary) {
  const std::set<int64_t> fitting = {0, 1, 2, 3, 10, 11, 12, 40, 41, 90};
  auto fits = [&](int64_t x) -> absl::StatusOr<bool> { return fitting.count(x) > 0; };
  auto n = LargestFitting(0, 100, fits);
  ASSERT_THAT(n, IsOk());
  EXPECT_TRUE(*fits(*n));
  EXPECT_FALSE(*fits(*n + 1));
}

TEST(StepDownTest, StopsAtTheFirstPassAndKeepsEveryFailure) {
  auto r = StepDown(10, 1, 5, [](int64_t n) {
    return n <= 8 ? absl::OkStatus() : absl::ResourceExhaustedError(absl::StrCat("n=", n, " big"));
  });
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->n, 8);
  ASSERT_EQ(r->tries.size(), 3u);
  EXPECT_EQ(r->tries[0].n, 10);
  EXPECT_EQ(r->tries[0].failure, "n=10 big");
  EXPECT_EQ(r->tries[1].n, 9);
  EXPECT_EQ(r->tries[2].n, 8);
  EXPECT_EQ(r->tries[2].failure, "");
}

TEST(StepDownTest, GivesUpAtLoOrAfterMaxTriesNamingTheLastFailure) {
  auto fail = [](int64_t n) { return absl::InternalError(absl::StrCat("stage 0 died at ", n)); };
  auto at_lo = StepDown(3, 2, 10, fail);
  ASSERT_FALSE(at_lo.ok());
  EXPECT_EQ(at_lo.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(at_lo.status().message(), HasSubstr("stage 0 died at 2"));
  EXPECT_THAT(at_lo.status().message(), HasSubstr("in 2 tries"));

  int calls = 0;
  auto capped = StepDown(100, 1, 3, [&](int64_t n) {
    ++calls;
    return fail(n);
  });
  EXPECT_FALSE(capped.ok());
  EXPECT_EQ(calls, 3);
  EXPECT_THAT(capped.status().message(), HasSubstr("[98, 100]"));

  EXPECT_EQ(StepDown(1, 2, 3, fail).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelFamilyTest, SizesGrowTheRightDimension) {
  FamilySpec depth{ModelFamily::kDepth,
                   {.vocab_size = 256, .seq_len = 32, .d_model = 64, .n_heads = 4, .n_layers = 0}};
  EXPECT_EQ(ModelOfSize(depth, 7).n_layers, 7);
  EXPECT_EQ(ModelOfSize(depth, 7).d_model, 64);
  EXPECT_EQ(SmallestSize(depth, 8), 6);  // 6 blocks + embedding + head = 8 layers
  FamilySpec width{ModelFamily::kWidth,
                   {.vocab_size = 256, .seq_len = 32, .d_model = 0, .n_heads = 4, .n_layers = 8},
                   32};
  EXPECT_EQ(ModelOfSize(width, 5).d_model, 160);
  EXPECT_EQ(ModelOfSize(width, 5).n_layers, 8);
}

// The planner-only search on a small config: MakePlan accepts the answer and refuses
// the next size, for both families and both recompute modes.
TEST(LargestPlannableTest, IsTheLastSizeMakePlanAccepts) {
  const model::TransformerConfig base{
      .vocab_size = 256, .seq_len = 32, .d_model = 64, .n_heads = 4, .n_layers = 8};
  for (ModelFamily family : {ModelFamily::kDepth, ModelFamily::kWidth}) {
    for (auto recompute : {pipetrain::v1::RECOMPUTE_NEVER, pipetrain::v1::RECOMPUTE_ALWAYS}) {
      FamilySpec spec{family, base, 32};
      planner::PlanOptions o;
      o.stages = 2;
      o.micro_batches = 4;
      o.batch_size = 8;
      o.schedule = planner::ScheduleKind::kGpipe;
      o.recompute = recompute;
      o.memory_cap_bytes = 24 << 20;
      auto n = LargestPlannable(spec, o);
      ASSERT_THAT(n, IsOk()) << FamilyName(family);
      EXPECT_GT(*n, SmallestSize(spec, 2)) << FamilyName(family);
      o.model = ModelOfSize(spec, *n);
      EXPECT_THAT(planner::MakePlan(o), IsOk()) << FamilyName(family) << " n=" << *n;
      o.model = ModelOfSize(spec, *n + 1);
      auto next = planner::MakePlan(o);
      EXPECT_EQ(next.status().code(), absl::StatusCode::kResourceExhausted)
          << FamilyName(family) << " n+1=" << *n + 1 << ": " << next.status();
    }
  }
}

TEST(LargestPlannableTest, RecomputeFitsMoreAndATinyCapNothing) {
  FamilySpec spec{ModelFamily::kDepth,
                  {.vocab_size = 256, .seq_len = 32, .d_model = 64, .n_heads = 4, .n_layers = 0}};
  planner::PlanOptions o;
  o.stages = 1;
  o.micro_batches = 8;
  o.batch_size = 16;
  o.schedule = planner::ScheduleKind::kGpipe;
  o.memory_cap_bytes = 16 << 20;
  auto never = LargestPlannable(spec, o);
  o.recompute = pipetrain::v1::RECOMPUTE_ALWAYS;
  auto always = LargestPlannable(spec, o);
  ASSERT_THAT(never, IsOk());
  ASSERT_THAT(always, IsOk());
  EXPECT_GT(*always, *never);

  o.memory_cap_bytes = 1000;  // less than the embedding's state
  EXPECT_EQ(LargestPlannable(spec, o).status().code(), absl::StatusCode::kNotFound);
  o.memory_cap_bytes = 0;
  EXPECT_EQ(LargestPlannable(spec, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::bench
