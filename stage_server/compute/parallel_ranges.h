// ForRanges: the cpu backend's one way to spread a loop over its threads (OpenMP, the
// runtime oneDNN's products already use, so one thread count covers every op).
//
// [0, n) is cut into one contiguous piece per thread and body(begin, end) runs each.
// Every loop that uses it computes each output element from its own inputs in the same
// order whatever the pieces (rows of a LayerNorm, columns of a bias gradient, elements
// of AdamW), so its bits do not depend on the thread count. Work under `min_items` per
// thread runs on the calling thread alone: waking a thread costs microseconds.
//
// Without OpenMP (a clang build: see cmake/PipetrainDependencies.cmake) every loop runs
// on the calling thread.
#pragma once

#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pipetrain::compute {

template <typename Body>
void ForRanges(int threads, int64_t n, int64_t min_items, const Body& body) {
  const int64_t most = min_items > 0 ? n / min_items : n;
  const int pieces = static_cast<int>(most < threads ? (most < 1 ? 1 : most) : threads);
#ifdef _OPENMP
  if (pieces > 1) {
#pragma omp parallel num_threads(pieces)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      body(n * t / nt, n * (t + 1) / nt);
    }
    return;
  }
#else
  (void)pieces;
#endif
  body(int64_t{0}, n);
}

// Items of `per_item` elements each that make a piece worth a thread (~16k elements).
inline int64_t MinItems(int64_t per_item) {
  constexpr int64_t kElementsPerPiece = 16 * 1024;
  return per_item >= kElementsPerPiece ? 1 : kElementsPerPiece / (per_item < 1 ? 1 : per_item);
}

}  // namespace pipetrain::compute
