#include "coordinator/spec/lr_schedule.h"

#include <cstdint>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

// The rule every job ran with before training.lr_schedule existed (job_runner.cc's
// LearningRate): a linear warm-up in float, then the peak.
float RateBeforeSchedules(float lr, int warmup_steps, int64_t step) {
  if (warmup_steps > 0 && step < warmup_steps) {
    return lr * static_cast<float>(step) / static_cast<float>(warmup_steps);
  }
  return lr;
}

LrSchedule Schedule(LrDecay decay, int64_t warmup, int64_t last, float lr = 1e-3f,
                    float min_lr = 1e-4f) {
  return {.decay = decay, .lr = lr, .min_lr = min_lr, .warmup_steps = warmup, .last_step = last};
}

TEST(LrScheduleTest, ConstantGivesExactlyTheRatesOfBefore) {
  for (float lr : {3e-4f, 0.003f, 0.01f, 6e-4f}) {
    for (int warmup : {0, 1, 3, 4, 10, 30, 715}) {
      const LrSchedule s = Schedule(LrDecay::kConstant, warmup, 1000, lr, 0);
      for (int64_t step = 1; step <= 1000; ++step) {
        ASSERT_EQ(LearningRate(s, step), RateBeforeSchedules(lr, warmup, step))
            << "lr " << lr << " warm-up " << warmup << " step " << step;
      }
    }
  }
}

// Step 1 gets lr / warmup_steps and step warmup_steps the peak (llm.c's (step + 1) / W
// with its 0-based steps); the decays warm up exactly as constant does.
TEST(LrScheduleTest, WarmUpReachesThePeakAtStepWarmupSteps) {
  for (LrDecay decay : {LrDecay::kConstant, LrDecay::kCosine, LrDecay::kLinear}) {
    const LrSchedule s = Schedule(decay, 10, 110);
    EXPECT_EQ(LearningRate(s, 1), 1e-3f * 1.0f / 10.0f);
    EXPECT_FLOAT_EQ(LearningRate(s, 1), 1e-4f);
    EXPECT_FLOAT_EQ(LearningRate(s, 5), 5e-4f);
    EXPECT_FLOAT_EQ(LearningRate(s, 9), 9e-4f);
    EXPECT_EQ(LearningRate(s, 10), 1e-3f) << "the peak";
    for (int64_t step = 1; step < 10; ++step) {
      EXPECT_EQ(LearningRate(s, step), RateBeforeSchedules(1e-3f, 10, step)) << step;
    }
  }
}

TEST(LrScheduleTest, CosineDecaysFromThePeakToMinLrAtTheLastStep) {
  const LrSchedule s = Schedule(LrDecay::kCosine, 10, 110);  // a decay of 100 steps
  EXPECT_EQ(LearningRate(s, 10), 1e-3f) << "the first decay step is the peak";
  // 0.5 (1 + cos(pi r)) of the way from min_lr to lr, r = (step - 10) / 100.
  EXPECT_FLOAT_EQ(LearningRate(s, 11), 9.9977804e-4f);                   // r = 0.01
  EXPECT_FLOAT_EQ(LearningRate(s, 35), 1e-4f + 9e-4f * 0.85355339f);     // r = 1/4
  EXPECT_FLOAT_EQ(LearningRate(s, 60), 5.5e-4f);                         // the middle
  EXPECT_FLOAT_EQ(LearningRate(s, 85), 1e-4f + 9e-4f * 0.14644661f);     // r = 3/4
  EXPECT_EQ(LearningRate(s, 110), 1e-4f) << "min_lr exactly at the last step";
  EXPECT_EQ(LearningRate(s, 111), 1e-4f) << "and after it";
  for (int64_t step = 11; step <= 110; ++step) {
    EXPECT_LT(LearningRate(s, step), LearningRate(s, step - 1)) << step;
  }
}

TEST(LrScheduleTest, LinearDecaysByEqualStepsToMinLrAtTheLastStep) {
  const LrSchedule s = Schedule(LrDecay::kLinear, 10, 110);
  EXPECT_EQ(LearningRate(s, 10), 1e-3f);
  EXPECT_FLOAT_EQ(LearningRate(s, 11), 9.91e-4f);
  EXPECT_FLOAT_EQ(LearningRate(s, 35), 7.75e-4f);
  EXPECT_FLOAT_EQ(LearningRate(s, 60), 5.5e-4f);
  EXPECT_FLOAT_EQ(LearningRate(s, 85), 3.25e-4f);
  EXPECT_FLOAT_EQ(LearningRate(s, 109), 1.09e-4f);
  EXPECT_EQ(LearningRate(s, 110), 1e-4f);
}

TEST(LrScheduleTest, WithoutWarmUpTheFirstStepIsThePeak) {
  for (int warmup : {0, 1}) {
    const LrSchedule s = Schedule(LrDecay::kCosine, warmup, 5, 0.01f, 0);
    EXPECT_EQ(LearningRate(s, 1), 0.01f) << warmup;
    EXPECT_FLOAT_EQ(LearningRate(s, 3), 0.005f) << warmup;
    EXPECT_EQ(LearningRate(s, 5), 0.0f) << "min_lr 0 is a rate of 0, warm-up " << warmup;
  }
}

// A run whose last step is the warm-up's last has no steps to decay over: the peak.
TEST(LrScheduleTest, ARunThatEndsAtThePeakKeepsIt) {
  const LrSchedule s = Schedule(LrDecay::kLinear, 4, 4);
  EXPECT_FLOAT_EQ(LearningRate(s, 3), 7.5e-4f);
  EXPECT_EQ(LearningRate(s, 4), 1e-3f);
}

pb::TrainingSpec Training(const char* schedule, int steps, int warmup) {
  pb::TrainingSpec t;
  t.set_lr(6e-4f);
  t.set_min_lr(6e-5f);
  t.set_lr_schedule(schedule);
  t.set_steps(steps);
  t.set_warmup_steps(warmup);
  return t;
}

// A job from the step-N checkpoint of another runs steps N+1 .. N+steps (`pipetrain
// resume` sets steps to those left), so its schedule's last step is the unbroken run's
// and each of its steps gets the unbroken run's rate, in the warm-up too.
TEST(LrScheduleTest, AResumedRunContinuesTheCurveAtItsGlobalSteps) {
  for (const char* name : {"constant", "cosine", "linear"}) {
    auto unbroken = LrScheduleOf(Training(name, 100, 10), /*last_step=*/0 + 100);
    ASSERT_THAT(unbroken, IsOk());
    for (int checkpoint : {5, 10, 40, 99}) {
      const int left = 100 - checkpoint;
      auto resumed = LrScheduleOf(Training(name, left, 10), /*last_step=*/checkpoint + left);
      ASSERT_THAT(resumed, IsOk());
      for (int64_t step = checkpoint + 1; step <= 100; ++step) {
        ASSERT_EQ(LearningRate(*resumed, step), LearningRate(*unbroken, step))
            << name << " from step " << checkpoint << ", step " << step;
      }
    }
  }
  // Counted from 1 instead, a resumed cosine would warm up again.
  auto from40 = LrScheduleOf(Training("cosine", 60, 10), 100);
  ASSERT_THAT(from40, IsOk());
  EXPECT_NE(LearningRate(*from40, 1), LearningRate(*from40, 41));
}

TEST(LrScheduleTest, ScheduleOfReadsTheSpec) {
  auto s = LrScheduleOf(Training("linear", 50, 5), 50);
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->decay, LrDecay::kLinear);
  EXPECT_EQ(s->lr, 6e-4f);
  EXPECT_EQ(s->min_lr, 6e-5f);
  EXPECT_EQ(s->warmup_steps, 5);
  EXPECT_EQ(s->last_step, 50);
  auto unset = LrScheduleOf(Training("", 50, 5), 50);
  ASSERT_THAT(unset, IsOk());
  EXPECT_EQ(unset->decay, LrDecay::kConstant) << "empty is the default";
}

TEST(LrScheduleTest, NamesRoundTripAndAnUnknownNameListsTheAccepted) {
  for (LrDecay d : {LrDecay::kConstant, LrDecay::kCosine, LrDecay::kLinear}) {
    auto named = LrDecayNamed(LrDecayName(d));
    ASSERT_THAT(named, IsOk());
    EXPECT_EQ(*named, d);
  }
  EXPECT_EQ(LrDecayNames(), "constant, cosine, linear");
  EXPECT_THAT(LrDecayNamed("cosin"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("unknown schedule 'cosin'; accepted: constant, cosine, linear")));
  EXPECT_THAT(LrScheduleOf(Training("Cosine", 10, 0), 10),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'Cosine'")));
}

}  // namespace
}  // namespace pipetrain::coordinator
