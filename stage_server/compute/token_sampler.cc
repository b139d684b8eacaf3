#include "stage_server/compute/token_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/init.h"
#include "common/status_macros.h"

namespace pipetrain::compute {
namespace {

// The sampling stream of a seed: InitStreamKey's derivation with a layer index no
// pipeline layer has, so that it shares no numbers with the initial weights' streams.
constexpr int kSamplingStream = -1;

}  // namespace

absl::Status ValidateSampling(const SamplingOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature must be a finite number >= 0 (0 is greedy), not ", options.temperature));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= 0 (0 keeps every id), not ", options.top_k));
  }
  return absl::OkStatus();
}

template <typename Real>
absl::StatusOr<int32_t> SampleToken(std::span<const Real> logits, const SamplingOptions& options,
                                    uint64_t draw) {
  RETURN_IF_ERROR(ValidateSampling(options));
  const int V = static_cast<int>(logits.size());
  if (V == 0) return absl::InvalidArgumentError("no logits to sample from");
  for (int i = 0; i < V; ++i) {
    if (!std::isfinite(static_cast<double>(logits[i]))) {
      return absl::InvalidArgumentError(
          absl::StrCat("the logit of id ", i, " is ", static_cast<double>(logits[i])));
    }
  }
  // Greedy: the first id of the largest logit.
  const int32_t best =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (options.temperature == 0) return best;
  // Candidates, the top-k of them by logit (ties lowest id first) when k < V.
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  if (options.top_k > 0 && options.top_k < V) {
    std::partial_sort(ids.begin(), ids.begin() + options.top_k, ids.end(),
                      [&](int32_t a, int32_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    ids.resize(options.top_k);
  }
  // softmax(logits / T) over the candidates, in double, the largest logit subtracted
  // first; then the candidate where the cumulative weight passes u * total.
  const double max_logit = static_cast<double>(logits[best]);
  std::vector<double> weights(ids.size());
  double total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[ids[i]]) - max_logit) / options.temperature);
    total += weights[i];
  }
  const uint64_t key = model::InitStreamKey(options.seed, kSamplingStream, 0);
  const double target = model::UniformAt(key, draw) * total;
  double cumulative = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cumulative += weights[i];
    if (cumulative > target) return ids[i];
  }
  // Only rounding gets here (target within an ulp of total): the last id with weight.
  for (size_t i = ids.size(); i-- > 0;) {
    if (weights[i] > 0) return ids[i];
  }
  return best;
}

template absl::StatusOr<int32_t> SampleToken(std::span<const float>, const SamplingOptions&,
                                             uint64_t);
template absl::StatusOr<int32_t> SampleToken(std::span<const double>, const SamplingOptions&,
                                             uint64_t);

}  // namespace pipetrain::compute
