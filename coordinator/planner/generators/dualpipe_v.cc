#include "coordinator/planner/generators/dualpipe_v.h"

#include "coordinator/planner/generators/chunk_order.h"

namespace pipetrain::planner::generators {

// Eight phases, counted so that each chunk runs M forwards and M backwards:
//   1. chunk-0 forwards that fill the stages below this one;
//   2. F0 F1 pairs until chunk 1's first gradient can return;
//   3. chunk-1 backwards split (I W), each followed by an F1;
//   4. the steady F0 B1 F1 B0;
//   5. B1 F1 B0 while chunk 0's forwards are done;
//   6. B1 B0 pairs, split into I (W owed) from the middle on, the halves alternating by
//      the stage's parity so neighbours do not both defer at once;
//   7. an owed W, then a split B0;
//   8. the owed W passes.
std::vector<schedule::Action> DualPipeV(int k, int m, int /*chunks*/, int s) {
  ChunkOrder o(2);
  auto backward = [&](int c, bool split) { split ? o.I(c) : o.B(c); };
  Repeat(2 * (k - s - 1), [&](int) { o.F(0); });
  Repeat(s + 1, [&](int) {
    o.F(0);
    o.F(1);
  });
  Repeat(k - s - 1, [&](int) {
    o.I(1);
    o.W(1);
    o.F(1);
  });
  Repeat(m - 2 * k + s + 1, [&](int) {
    o.F(0);
    o.B(1);
    o.F(1);
    o.B(0);
  });
  Repeat(k - s - 1, [&](int) {
    o.B(1);
    o.F(1);
    o.B(0);
  });
  const int middle = (s + 1) / 2;
  Repeat(s + 1, [&](int i) {
    backward(1, s % 2 == 1 ? i >= middle : i > middle);
    backward(0, i >= middle);
  });
  Repeat(k - s - 1, [&](int) {
    o.DeferredW();
    o.I(0);
  });
  Repeat(s + 1, [&](int) { o.DeferredW(); });
  return o.Take();
}

}  // namespace pipetrain::planner::generators
