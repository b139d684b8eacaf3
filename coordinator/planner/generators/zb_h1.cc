#include "coordinator/planner/generators/zb_h1.h"

#include <algorithm>

namespace pipetrain::planner::generators {

// Stage s starts its W passes s steps late, so the last stages, which would otherwise
// idle at the tail waiting for gradients, keep W passes for the end and the gradient
// chain (I only) runs faster.
std::vector<schedule::Action> ZbH1(int k, int m, int /*chunks*/, int s) {
  std::vector<schedule::Action> a;
  const int warmup = std::min(k - 1 - s, m);
  int next_w = 0;
  auto maybe_w = [&](int i) {
    if (i >= s && next_w < m) a.push_back(schedule::BackwardWeight(next_w++));
  };
  for (int i = 0; i < warmup; ++i) a.push_back(schedule::Forward(i));
  for (int i = 0; i < m - warmup; ++i) {
    a.push_back(schedule::Forward(warmup + i));
    a.push_back(schedule::BackwardInput(i));
    maybe_w(i);
  }
  for (int i = m - warmup; i < m; ++i) {
    a.push_back(schedule::BackwardInput(i));
    maybe_w(i);
  }
  while (next_w < m) a.push_back(schedule::BackwardWeight(next_w++));
  return a;
}

}  // namespace pipetrain::planner::generators
