// A stage's program being written chunk by chunk: each call appends the next forward,
// backward, I or W of a chunk in micro-batch order, and deferred W passes wait in a
// queue until the generator places them. For the generators of two-chunk schedules.
#pragma once

#include <deque>
#include <vector>

#include "common/schedule/action.h"

namespace pipetrain::planner::generators {

class ChunkOrder {
 public:
  explicit ChunkOrder(int chunks) : forwards_(chunks), backwards_(chunks) {}

  void F(int c) { actions_.push_back(schedule::Forward(forwards_[c]++, c)); }
  void B(int c) { actions_.push_back(schedule::Backward(backwards_[c]++, c)); }
  // I of the chunk's next micro-batch; its W is owed (W(c) or DeferredW()).
  void I(int c) {
    deferred_.push_back({c, backwards_[c]});
    actions_.push_back(schedule::BackwardInput(backwards_[c]++, c));
  }
  // The W of the chunk's oldest owed I.
  void W(int c) {
    for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
      if (it->chunk != c) continue;
      actions_.push_back(schedule::BackwardWeight(it->micro_batch, c));
      deferred_.erase(it);
      return;
    }
  }
  // The oldest owed W of any chunk.
  void DeferredW() {
    if (!deferred_.empty()) W(deferred_.front().chunk);
  }
  bool Owes(int c) const {
    for (const Owed& o : deferred_) {
      if (o.chunk == c) return true;
    }
    return false;
  }

  int forwards(int c) const { return forwards_[c]; }
  std::vector<schedule::Action> Take() { return std::move(actions_); }

 private:
  struct Owed {
    int chunk;
    int micro_batch;
  };
  std::vector<int> forwards_, backwards_;
  std::deque<Owed> deferred_;
  std::vector<schedule::Action> actions_;
};

// `n` times `body` (n <= 0: none).
template <typename Body>
void Repeat(int n, Body body) {
  for (int i = 0; i < n; ++i) body(i);
}

}  // namespace pipetrain::planner::generators
