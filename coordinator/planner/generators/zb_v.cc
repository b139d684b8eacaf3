#include "coordinator/planner/generators/zb_v.h"

#include "coordinator/planner/generators/chunk_order.h"

namespace pipetrain::planner::generators {

// Chunk 0 runs down the V, chunk 1 back up it. A stage fills with chunk-0 forwards
// (more the earlier it is: the first micro-batch must travel 2(K-s)-1 virtual stages
// to come back to it), alternates the two chunks until its first chunk-1 gradient can
// come, then runs F, I, W of chunk 0 and of chunk 1 in turn; in the drain the I passes
// go first (they free the stages upstream) and the W passes fill the wait.
std::vector<schedule::Action> ZbV(int k, int m, int /*chunks*/, int s) {
  ChunkOrder o(2);
  Repeat(2 * (k - s) - 1, [&](int) { o.F(0); });
  Repeat(s, [&](int) {
    o.F(1);
    o.F(0);
  });
  Repeat(k - s, [&](int) {
    o.F(1);
    o.I(1);
    o.W(1);
  });
  while (o.forwards(1) < o.forwards(0) || o.forwards(0) < m) {
    if (o.forwards(0) < m) o.F(0);
    o.I(0);
    o.W(0);
    o.F(1);
    o.I(1);
    o.W(1);
  }
  Repeat(s, [&](int) {
    o.I(0);
    o.I(1);
  });
  Repeat(k - s, [&](int) {
    o.I(0);
    o.W(0);
  });
  while (o.Owes(1)) o.W(1);
  while (o.Owes(0)) o.W(0);
  return o.Take();
}

}  // namespace pipetrain::planner::generators
