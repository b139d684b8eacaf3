// What the backend tests share (the conformance suite, the cpu and cuda backend tests):
// random tensors from the project's deterministic generator (init.h), the closeness
// rule for each dtype, and buffers in a backend's memory that a test fills and reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "common/model/init.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/backend.h"
#include "stage_server/compute/backend_buffer.h"

namespace pipetrain::testing {

// ---- Random tensors ---------------------------------------------------------------------

// A new seed on every call, for tests that want every draw to differ from the last.
inline uint64_t NextSeed() {
  static uint64_t seed = 1;
  return seed++;
}

// n draws of offset + scale * N(0, 1), from stream `seed`.
inline std::vector<float> RandomNormal(size_t n, uint64_t seed, double scale = 1.0,
                                       double offset = 0.0) {
  std::vector<float> v(n);
  const uint64_t key = model::InitStreamKey(seed, 4242, 0);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(offset + scale * model::NormalAt(key, i));
  }
  return v;
}

// n ids in [0, V), from stream `seed`.
inline std::vector<int32_t> RandomIds(size_t n, int V, uint64_t seed) {
  std::vector<int32_t> t(n);
  const uint64_t key = model::InitStreamKey(seed, 4243, 0);
  for (size_t i = 0; i < n; ++i) {
    const double u = std::fabs(model::NormalAt(key, i)) * 1e9;
    t[i] = static_cast<int32_t>(static_cast<uint64_t>(u) % static_cast<uint64_t>(V));
  }
  return t;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<float> ToFloat(const std::vector<double>& v) {
  std::vector<float> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](double x) { return static_cast<float>(x); });
  return out;
}

// ---- Closeness --------------------------------------------------------------------------
// One rule: the relative L2 error ||got - want|| / ||want|| against the plain-loop
// reference run in double on the same inputs stays within the tolerance of the result's
// dtype, and the largest elementwise error within twice that of the largest reference
// entry. Relative to the tensor rather than to each element, so that entries near zero
// in a large tensor (whose relative error means nothing) do not decide the outcome.

// (docs/TESTING.md, "Tolerances".) The references are exact to double precision, so
// what is measured is the float arithmetic's own error. The cases' inputs have random
// signs, and the rounding errors of such a sum of n terms add as a random walk: about u
// sqrt(n / 2) relative (Higham and Mary, 2019), not the worst case gamma_n sum |x| /
// |sum x|, which is some 10^3 times larger and which random data does not meet.

// Results computed in float: u sqrt(n / 2) is 2.7e-6 for the longest sum in the cases
// (4096 rows of BiasGrad), with a margin of about 4.
inline constexpr double kFp32Tolerance = 1e-5;
// Matrix products in TF32 (cuda's option): 10 bits of mantissa in the products (u =
// 2^-11), 5e-4 for a single product's rounding.
inline constexpr double kTf32Tolerance = 1e-3;
// bf16 products (Backend::SetProductOperands), where both sides round the same operands.
// An operand read from the inputs rounds the same way on both (nearest even, from the
// same float), leaving only fp32's summation error. An operand computed inside the op
// (attention's probabilities and score gradients) is a float on the backend and a double
// on the reference, a relative 2^-20 or so apart after the softmax's dozen roundings;
// the two round to different bf16 values only where they straddle a rounding boundary,
// for a fraction p of about 2^-20 / 2^-8 = 2^-12 of such operands, and then one bf16 ulp
// (2^-8) apart. The output's relative L2 difference is then about sqrt(p) 2^-8 = 2^-14;
// the budget is twice that. (Products that did not round at all would miss by about
// 2^-9, far outside it.)
inline constexpr double kBf16Tolerance = 0x1p-13;
// Results accumulated in double from float inputs (SumOfSquares): exact squares, then
// a double sum of up to 3 * 2^20 terms of one sign, gamma_n(double) = 3.5e-10.
inline constexpr double kFp64Tolerance = 1e-9;

// Passes when got is within `tolerance` of want by the rule above (the L2 part alone
// when !elementwise: the cuda checks have held only that so far, and no GPU has shown
// what the other would do); otherwise says by how much, with the largest elementwise
// error and where it is. Any NaN or infinity in got fails, and so does an all-zero
// reference (such a test would prove nothing).
template <typename T>
::testing::AssertionResult IsClose(const std::vector<T>& got, const std::vector<double>& want,
                                   double tolerance, bool elementwise = true) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "size " << got.size() << ", the reference has " << want.size();
  }
  double num = 0, den = 0, worst = -1, max_want = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double err = std::isfinite(g) ? std::fabs(g - want[i])
                                        : std::numeric_limits<double>::infinity();
    num += err * err;
    den += want[i] * want[i];
    max_want = std::max(max_want, std::fabs(want[i]));
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  if (den == 0) {
    return ::testing::AssertionFailure() << "the reference is all zeros: the test proves nothing";
  }
  const double rel = std::sqrt(num) / std::sqrt(den);
  // And no single element off by more than twice the tolerance of the largest
  // reference entry: L2 alone would let one stray element of a large tensor through.
  const double max_rel = worst / max_want;
  if (rel <= tolerance && (!elementwise || max_rel <= 2 * tolerance)) {
    return ::testing::AssertionSuccess();
  }
  std::ostringstream msg;
  msg.precision(9);
  msg << "relative L2 error " << rel << " (at most " << tolerance << "), max |error| / max "
      << "|reference| " << max_rel << " (at most " << 2 * tolerance << "); max |error| " << worst
      << " at [" << at << "] of " << got.size() << " (got " << static_cast<double>(got[at])
      << ", want " << want[at] << ")";
  return ::testing::AssertionFailure() << msg.str();
}

// ---- Backend memory ---------------------------------------------------------------------

// Buffers in one backend's memory, freed through it on destruction (so declare this
// after the backend it uses). Each failure is a gtest failure and gives nullptr or an
// empty vector, so tests go on to report what else is wrong.
class BackendTensors {
 public:
  explicit BackendTensors(compute::Backend* backend) : backend_(backend) {}

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    auto buf = compute::BackendBuffer<float>::Allocate(backend_, bytes);
    EXPECT_THAT(buf, IsOk());
    if (!buf.ok()) return nullptr;
    EXPECT_THAT(backend_->CopyFromHost(buf->raw(), host.data(), bytes), IsOk());
    T* p = static_cast<T*>(buf->raw());
    buffers_.push_back(std::move(*buf));
    return p;
  }
  // n floats of NaN: an element the op should write but does not stays NaN.
  float* Poisoned(size_t n) {
    return Upload(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
  }
  template <typename T>
  std::vector<T> Download(const T* p, size_t n) {
    std::vector<T> host(n);
    EXPECT_THAT(backend_->CopyToHost(host.data(), p, n * sizeof(T)), IsOk());
    return host;
  }

 private:
  compute::Backend* backend_;
  std::vector<compute::BackendBuffer<float>> buffers_;
};

}  // namespace pipetrain::testing
