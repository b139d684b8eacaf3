#include "coordinator/planner/generators/one_f_one_b.h"

#include <algorithm>

namespace pipetrain::planner::generators {

std::vector<schedule::Action> OneFOneB(int k, int m, int /*chunks*/, int s) {
  std::vector<schedule::Action> a;
  const int warmup = std::min(k - 1 - s, m);
  for (int i = 0; i < warmup; ++i) a.push_back(schedule::Forward(i));
  for (int i = 0; i < m - warmup; ++i) {
    a.push_back(schedule::Forward(warmup + i));
    a.push_back(schedule::Backward(i));
  }
  for (int i = m - warmup; i < m; ++i) a.push_back(schedule::Backward(i));
  return a;
}

}  // namespace pipetrain::planner::generators
