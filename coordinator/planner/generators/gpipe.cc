#include "coordinator/planner/generators/gpipe.h"

namespace pipetrain::planner::generators {

std::vector<schedule::Action> Gpipe(int /*stages*/, int m, int /*chunks*/, int /*stage*/) {
  std::vector<schedule::Action> a;
  for (int i = 0; i < m; ++i) a.push_back(schedule::Forward(i));
  for (int i = 0; i < m; ++i) a.push_back(schedule::Backward(i));
  return a;
}

}  // namespace pipetrain::planner::generators
