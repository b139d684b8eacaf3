#include "coordinator/planner/generators/interleaved.h"

#include <algorithm>

namespace pipetrain::planner::generators {

// The n-th forward of a stage takes micro-batch (n / Kv) K + n % K of chunk
// (n % Kv) / K; backwards walk the chunks in reverse.
std::vector<schedule::Action> Interleaved(int k, int m, int v, int s) {
  const int total = m * v, group = k * v;
  auto mb = [&](int n) { return (n / group) * k + n % k; };
  auto fwd = [&](int n) { return schedule::Forward(mb(n), (n % group) / k); };
  auto bwd = [&](int n) { return schedule::Backward(mb(n), v - 1 - (n % group) / k); };
  std::vector<schedule::Action> a;
  const int warmup = std::min(2 * (k - s - 1) + (v - 1) * k, total);
  for (int i = 0; i < warmup; ++i) a.push_back(fwd(i));
  for (int i = 0; i < total - warmup; ++i) {
    a.push_back(fwd(warmup + i));
    a.push_back(bwd(i));
  }
  for (int i = total - warmup; i < total; ++i) a.push_back(bwd(i));
  return a;
}

}  // namespace pipetrain::planner::generators
