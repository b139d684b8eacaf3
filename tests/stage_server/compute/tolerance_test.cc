// The tolerances the suite compares with hold for the arithmetic they claim to bound,
// and are not vacuous: float sums in other orders stay within ReorderedSumTolerance;
// AdamW's update never exceeds AdamWMaxUpdate; two AdamW runs (the backends' own
// update) whose gradients differ stay within AdamWDrift's bound element by element,
// a bound far below a learning rate where the gradient is far above eps, and one that
// is broken when told the gradients were the same.
#include "tests/testing/tolerance.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "stage_server/compute/reference_ops.h"

namespace pipetrain::testing {
namespace {

TEST(ToleranceTest, GammaIsKRoundingsAndEndsWhereTheyMeanNothing) {
  EXPECT_EQ(Gamma(0), 0);
  EXPECT_NEAR(Gamma(1), kFloatEps, 1e-14);
  EXPECT_GT(Gamma(64), 64 * kFloatEps);
  EXPECT_LT(Gamma(64), 64.001 * kFloatEps);
  EXPECT_LT(Gamma(1000, kDoubleEps), 1e-12);
  EXPECT_TRUE(std::isinf(Gamma(int64_t{1} << 24)));
}

// The float sum of `x` in the order of `order`.
float SumInOrder(const std::vector<float>& x, const std::vector<size_t>& order) {
  float s = 0;
  for (size_t i : order) s += x[i];
  return s;
}

// Pairwise (a tree, as a blocked kernel groups it).
float PairwiseSum(const float* x, size_t n) {
  if (n == 1) return x[0];
  return PairwiseSum(x, n / 2) + PairwiseSum(x + n / 2, n - n / 2);
}

TEST(ToleranceTest, FloatSumsInOtherOrdersStayWithinTheReorderedBound) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (size_t n : {2, 4, 16, 64, 1000}) {
    for (double offset : {0.0, 3.0}) {  // mixed signs, and one sign
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      std::vector<float> x(n);
      for (float& v : x) v = static_cast<float>(offset + normal(rng));
      double magnitude = 0;
      for (float v : x) magnitude += std::fabs(v);
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      const float forward = SumInOrder(x, order);
      std::vector<float> others = {PairwiseSum(x.data(), n)};
      std::reverse(order.begin(), order.end());
      others.push_back(SumInOrder(x, order));
      for (int shuffle = 0; shuffle < 20; ++shuffle) {
        std::shuffle(order.begin(), order.end(), rng);
        others.push_back(SumInOrder(x, order));
      }
      for (float other : others) {
        EXPECT_LE(std::fabs(double{forward} - other), ReorderedSumTolerance(n, magnitude));
      }
    }
  }
}

// Terms that cancel: the sum is pure rounding, bounded by their magnitude.
TEST(ToleranceTest, ACancellingSumIsBoundedByItsTermsNotByItsValue) {
  const std::vector<float> x = {1.0f, 1e-8f, -1.0f};
  const double diff = std::fabs(double{SumInOrder(x, {0, 1, 2})} - SumInOrder(x, {0, 2, 1}));
  EXPECT_NEAR(diff, 1e-8, 1e-15) << "(1 + 1e-8) - 1 loses what (1 - 1) + 1e-8 keeps";
  EXPECT_LE(diff, ReorderedSumTolerance(3, 2 + 1e-8));
  EXPECT_GT(diff, ReorderedSumTolerance(3, 1e-8)) << "relative to the sum it would fail";
}

// Tensors whose elements are sums of n random-sign terms, summed in two orders.
TEST(ToleranceTest, RandomSignSumsStayWithinTheTensorBoundNormwise) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  for (int n : {4, 64, 256}) {
    double num = 0, den = 0;
    for (int element = 0; element < 2000; ++element) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      const float forward = SumInOrder(x, order);
      const float pairwise = PairwiseSum(x.data(), n);
      num += std::pow(double{forward} - pairwise, 2);
      den += std::pow(double{forward}, 2);
    }
    EXPECT_LE(std::sqrt(num / den), ReorderedTensorSumTolerance(n)) << "n " << n;
  }
}

AdamWSettings Settings() { return {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8}; }

// |u| of AdamW after the gradients `g` (steps 1, 2, ...), in double.
double Update(const AdamWSettings& o, const std::vector<double>& g) {
  double m = 0, v = 0;
  for (double gk : g) {
    m = o.beta1 * m + (1 - o.beta1) * gk;
    v = o.beta2 * v + (1 - o.beta2) * gk * gk;
  }
  const int t = static_cast<int>(g.size());
  return std::fabs((m / (1 - std::pow(o.beta1, t))) /
                   (std::sqrt(v / (1 - std::pow(o.beta2, t))) + o.eps));
}

TEST(ToleranceTest, AdamWsUpdateNeverExceedsItsMaximumAndReachesIt) {
  const AdamWSettings o = Settings();
  EXPECT_NEAR(AdamWMaxUpdate(o, 1), 1.0, 1e-12);
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  for (int step = 1; step <= 30; ++step) {
    const double u_max = AdamWMaxUpdate(o, step);
    for (int trial = 0; trial < 500; ++trial) {
      std::vector<double> g(step);
      for (double& gk : g) gk = 1e-3 * normal(rng) + (trial % 2 ? 1e-3 : 0);
      ASSERT_LE(Update(o, g), u_max) << "step " << step;
    }
    // Cauchy-Schwarz is tight for g_k proportional to a_k / b_k ~ (b1 / b2)^(t - k).
    std::vector<double> g(step);
    for (int k = 0; k < step; ++k) g[k] = std::pow(o.beta2 / o.beta1, k);
    EXPECT_LE(Update(o, g), u_max) << "step " << step;
    EXPECT_GT(Update(o, g), 0.999999 * u_max) << "step " << step;
  }
}

// Two runs of the backends' AdamW (reference::AdamW, which the CPU backend runs) on
// gradients that differ the way regrouped sums do: relatively by a few u where they
// are large, and entirely where they are rounding noise around zero.
struct TwoRuns {
  std::vector<float> w_a, w_b, m_a, m_b, v_a, v_b;
  explicit TwoRuns(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal;
    w_a.resize(n);
    for (float& w : w_a) w = 0.02f * normal(rng);
    w_b = w_a;
    m_a = m_b = v_a = v_b = std::vector<float>(n, 0.0f);
  }
  void Step(const AdamWSettings& o, int step, const std::vector<float>& g_a,
            const std::vector<float>& g_b) {
    compute::reference::AdamW<float>(g_a.size(), w_a.data(), g_a.data(), m_a.data(), v_a.data(),
                                     o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, step);
    compute::reference::AdamW<float>(g_b.size(), w_b.data(), g_b.data(), m_b.data(), v_b.data(),
                                     o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, step);
  }
};

// Element i's gradients at one step: large ones (1e-3) differing relatively by 8 u,
// and, every fourth element, rounding noise (1e-12) that differs entirely.
void Gradients(size_t n, std::mt19937& rng, std::vector<float>& a, std::vector<float>& b) {
  std::normal_distribution<float> normal;
  a.resize(n);
  b.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (i % 4 == 0) {
      a[i] = 1e-12f * normal(rng);
      b[i] = 1e-12f * normal(rng);
    } else {
      a[i] = 1e-3f * normal(rng);
      b[i] = a[i] * static_cast<float>(1 + 8 * kFloatEps * normal(rng));
    }
  }
}

TEST(ToleranceTest, AdamWRunsWithDifferentGradientsStayWithinTheDrift) {
  AdamWSettings o = Settings();
  o.weight_decay = 0.1;
  std::mt19937 rng(11);
  const size_t n = 4000;
  TwoRuns runs(n, rng);
  AdamWDrift drift(o), unaware(o);
  for (int step = 1; step <= 5; ++step) {
    std::vector<float> g_a, g_b;
    Gradients(n, rng, g_a, g_b);
    runs.Step(o, step, g_a, g_b);
    drift.Step(step, g_a, g_b, runs.v_a, runs.v_b, runs.w_a, runs.w_b);
    unaware.Step(step, g_a, g_a, runs.v_a, runs.v_b, runs.w_a, runs.w_b);
  }
  size_t unaware_broken = 0;
  double worst_large = 0;
  for (size_t i = 0; i < n; ++i) {
    const double diff = std::fabs(double{runs.w_a[i]} - runs.w_b[i]);
    ASSERT_LE(diff, drift.bound()[i]) << "element " << i;
    unaware_broken += diff > unaware.bound()[i];
    if (i % 4 != 0) worst_large = std::max(worst_large, drift.bound()[i]);
  }
  // Where the gradient is far above eps the bound is a few rounding steps of the
  // weight, far below one learning rate; told the gradients were equal, it breaks.
  EXPECT_LT(worst_large, 1e-3 * o.lr);
  EXPECT_GT(unaware_broken, n / 8);
}

TEST(ToleranceTest, RegroupedTrainingIsTheLossRoundingAtStepOneAndGrowsAsTheLossMoves) {
  const AdamWSettings o = Settings();
  const std::vector<double> t = RegroupedTrainingTolerances({5.0, 4.0, 4.5, 4.5}, 128, o);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0], 2 * kFloatEps) << "the same weights: only the losses' own rounding";
  const double rho = ReorderedSumTolerance(128, 1);
  EXPECT_NEAR(t[1], 2 * AdamWMaxUpdate(o, 1) * rho * 1.0 / 4.0 + 2 * kFloatEps, 1e-18);
  EXPECT_NEAR(t[2], 2 * AdamWMaxUpdate(o, 2) * rho * 1.5 / 4.5 + 2 * kFloatEps, 1e-18);
  EXPECT_GE(t[3], t[2]) << "an unchanged loss keeps what the steps before moved";
}

}  // namespace
}  // namespace pipetrain::testing
