// How far apart two floating-point computations of one quantity may be, derived from the
// arithmetic that separates them rather than from what one processor gave: the same
// operations in the same order give the same bits; a regrouped sum differs by at most
// Higham's bound; AdamW turns a gradient difference into at most a known weight drift.
// docs/TESTING.md, "Tolerances", says which kind each comparison in the suite is.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace pipetrain::testing {

// Unit roundoff u: one float (double) operation gives the exact result times (1 + d),
// |d| <= u, rounding to nearest. A float holds 24 significant bits, a double 53.
inline constexpr double kFloatEps = 0x1p-24;
inline constexpr double kDoubleEps = 0x1p-53;

// The same operations on the same inputs in the same order give the same bits, on any
// processor (within one process every kernel is the same one: oneDNN picks per CPU and
// shape, not per call). Comparisons of such results are exact; pass this where a tolerance is
// asked for.
inline constexpr double kSameArithmetic = 0;

// Higham's gamma_k = k u / (1 - k u): k successive roundings, each within (1 + d), |d| <=
// u, multiply to within 1 + gamma_k (Accuracy and Stability of Numerical Algorithms,
// lemma 3.1). Meaningless (infinite) once k u reaches 1.
constexpr double Gamma(int64_t k, double unit = kFloatEps) {
  const double ku = static_cast<double>(k) * unit;
  return ku < 1 ? ku / (1 - ku) : INFINITY;
}

// Two evaluations of one sum of n terms, in different orders or groupings, differ by at
// most this: each is within gamma_{n-1} * sum |x_i| of the exact sum, whatever the
// order (Higham, (4.4)). `magnitude` is sum |x_i|: the sum itself when the terms share a
// sign; where they cancel, the relative difference grows by sum |x_i| / |sum x_i|.
constexpr double ReorderedSumTolerance(int64_t n_terms, double magnitude,
                                       double unit = kFloatEps) {
  return 2 * Gamma(n_terms > 1 ? n_terms - 1 : 0, unit) * magnitude;
}

// The same, normwise, for a tensor each of whose elements is a sum of n terms of no
// common sign (a gradient: one term per token of the batch): sum |x_i| is then about
// sqrt(n) times |sum x_i| (a random walk), so the relative L2 difference of the two
// tensors stays within this. One element can be worse (one whose terms cancel exactly
// is pure rounding); the tensor's norm is carried by the elements that do not cancel.
inline double ReorderedTensorSumTolerance(int64_t n_terms, double unit = kFloatEps) {
  return ReorderedSumTolerance(n_terms, std::sqrt(static_cast<double>(n_terms)), unit);
}

// ||got - want|| / ||want|| (L2), the measure the normwise bound above is for; infinite
// when the sizes differ.
inline double RelativeL2Error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    norm += double{want[i]} * want[i];
  }
  return std::sqrt(diff) / (std::sqrt(norm) + 1e-300);
}

// ---- AdamW ------------------------------------------------------------------------------

// AdamW as compute::Backend::AdamW computes it (torch.optim.AdamW):
//   w -= lr wd w;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w -= lr u,  u = m_hat / (s + eps),  m_hat = m / (1 - b1^t),  s = sqrt(v / (1 - b2^t)).
struct AdamWSettings {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
};

// The most |u| can be at step t (1-based), whatever the gradients: m_hat and s weigh
// step k's gradient by a_k = (1 - b1) b1^(t-k) / (1 - b1^t) and, squared, by b_k =
// (1 - b2) b2^(t-k) / (1 - b2^t), so |m_hat| / s <= sqrt(sum_k a_k^2 / b_k) (Cauchy-
// Schwarz). 1 at step 1 (u = g / (|g| + eps)); about 1.17 for b1 0.9, b2 0.95.
inline double AdamWMaxUpdate(const AdamWSettings& o, int step) {
  // sum_k a_k^2 / b_k = (1 - b1)^2 (1 - b2^t) / ((1 - b1^t)^2 (1 - b2)) sum_j (b1^2 / b2)^j.
  const double t = step;
  const double c1 = 1 - std::pow(o.beta1, t), c2 = 1 - std::pow(o.beta2, t);
  const double ratio = o.beta1 * o.beta1 / o.beta2;
  double geometric = 0;
  for (int j = 0; j < step; ++j) geometric += std::pow(ratio, j);
  const double sum = (1 - o.beta1) * (1 - o.beta1) * c2 / (c1 * c1 * (1 - o.beta2)) * geometric;
  return std::sqrt(sum);
}

// What one AdamW step's own roundings can add to |w_a - w_b| when the runs' inputs
// differ: each run rounds u's dozen operations (and m and v, which carry their rounding
// into later steps) and the weight's two updates, each by a relative kFloatEps, and two
// different inputs may round in opposite directions.
inline double AdamWStepRounding(const AdamWSettings& o, int step, double weight) {
  const double u_max = AdamWMaxUpdate(o, step);
  // u: m and v carry about three roundings a step each (relative to sum |a_k g_k|,
  // which is at most U s, as |m| is), then bias corrections, sqrt, + eps and the
  // division; the weight: lr wd w, lr u and the two subtractions.
  const double update = Gamma(6 * static_cast<int64_t>(step) + 6) * o.lr * u_max;
  const double weight_ops = Gamma(4) * (std::fabs(weight) + o.lr * u_max);
  return 2 * (update + weight_ops);  // each run rounds its own way
}

// How far apart, element by element, the weights of two AdamW runs can be when they
// started from the same weights and moments and their gradients differed. Call Step
// after each optimizer step with what both runs hold for one tensor; bound()[i] is then
// the most |w_a[i] - w_b[i]| may be.
//
// Why: with D = sum over the steps so far of |g_a - g_b| (each step's gradients as the
// runs computed them, so a difference in the weights that produced them is included),
//   |u_a - u_b| <= (|m_hat_a - m_hat_b| + |u| |s_a - s_b|) / (max(s_a, s_b) + eps)
//              <= (1 + U) D / (max(s_a, s_b) + eps),
// since a_k <= 1 and sqrt(b_k) <= 1; and never more than 2 U (both |u| <= U). The step
// moves w by lr u, decay shrinks an earlier difference, so a step adds at most lr |u_a -
// u_b|, plus its own rounding (AdamWStepRounding). Where the gradient is far above eps
// this is about lr times the gradient's relative difference; where it is near zero -- in
// exact arithmetic it is zero for a key bias, which softmax cancels, so what each run
// computes is pure rounding -- AdamW divides by eps and the bound follows it up to 2 lr U.
class AdamWDrift {
 public:
  explicit AdamWDrift(const AdamWSettings& settings) : o_(settings) {}

  // After optimizer step `step` (1-based) of both runs, for one tensor: the gradients
  // that step used, the second moments v after it and the weights after it. All spans
  // have one size, the same at every call.
  void Step(int step, std::span<const float> grad_a, std::span<const float> grad_b,
            std::span<const float> v_a, std::span<const float> v_b,
            std::span<const float> w_a, std::span<const float> w_b);

  const std::vector<double>& bound() const { return bound_; }

 private:
  AdamWSettings o_;
  std::vector<double> grad_diff_;  // per element: D, the sum over steps of |g_a - g_b|
  std::vector<double> bound_;      // per element: the most |w_a - w_b| may be
};

inline void AdamWDrift::Step(int step, std::span<const float> grad_a,
                             std::span<const float> grad_b, std::span<const float> v_a,
                             std::span<const float> v_b, std::span<const float> w_a,
                             std::span<const float> w_b) {
  const size_t n = grad_a.size();
  if (bound_.empty()) {
    grad_diff_.assign(n, 0);
    bound_.assign(n, 0);
  }
  const double u_max = AdamWMaxUpdate(o_, step);
  const double correction = 1 - std::pow(o_.beta2, step);
  for (size_t i = 0; i < n; ++i) {
    grad_diff_[i] += std::fabs(double{grad_a[i]} - grad_b[i]);
    const double s = std::sqrt(std::max(v_a[i], v_b[i]) / correction);
    const double update_diff = std::min(2 * u_max, (1 + u_max) * grad_diff_[i] / (s + o_.eps));
    const double weight = std::max(std::fabs(w_a[i]), std::fabs(w_b[i]));
    bound_[i] += o_.lr * update_diff + AdamWStepRounding(o_, step, weight);
  }
}

// ---- Trainings that regroup their gradient sums ------------------------------------------

// For each step s (1-based, index s - 1) of a training whose losses were `losses`, how far
// (relatively) another run's loss may be when it computes the same steps but groups each
// gradient's sum over the batch's `tokens` differently -- data-parallel replicas averaging
// their shares against one stage summing the whole batch, or another number of replicas:
//   - every step's loss is a mean of micro-batch losses, each rounded to float once
//     (cpu_backend.cc sums in double): where the runs cut the micro-batches differently
//     (4 rows against 2 of 2) they round differently, by at most 2 u; step 1, on the
//     same weights, differs by no more;
//   - from then on, each step's gradient differs relatively by at most rho =
//     ReorderedSumTolerance(tokens, 1) in the elements that carry the loss (their terms
//     share a sign; those whose terms cancel are small and weigh little), and AdamW's
//     update by at most 2 U rho (|m_hat| and s both move by at most rho of sum a_k |g_k|
//     <= U s and of s). AdamW steps each weight by about lr against its gradient's sign,
//     so the first-order loss change of an update is sum |g_i| lr |u_i|: the loss then
//     moves by at most 2 U rho of what the steps so far moved it, their total variation
//     sum_t |L_t+1 - L_t|.
// First order: a weight difference also feeds back through later gradients, which this
// leaves out; it matters only over many steps (docs/TESTING.md, "Tolerances", gives the
// measured differences against these bounds).
inline std::vector<double> RegroupedTrainingTolerances(const std::vector<double>& losses,
                                                       int64_t tokens, const AdamWSettings& o) {
  const double rho = ReorderedSumTolerance(tokens, 1);
  std::vector<double> out;
  double moved = 0;  // sum over the steps so far of |L_t+1 - L_t|
  for (size_t s = 0; s < losses.size(); ++s) {
    double drift = 0;
    if (s > 0) {
      moved += std::fabs(losses[s] - losses[s - 1]);
      drift = 2 * AdamWMaxUpdate(o, static_cast<int>(s)) * rho * moved / std::fabs(losses[s]);
    }
    out.push_back(drift + 2 * kFloatEps);
  }
  return out;
}

}  // namespace pipetrain::testing
