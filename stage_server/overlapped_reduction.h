// Data-parallel replicas, overlapped with the backward: a layer's gradients are handed
// to the replicas' average (GradientAverage) on a worker thread as soon as they are
// final, while the stage computes on; the optimizer step waits for what is left and
// writes the averages back on its own thread (backends are used from one thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stage_server/chunk_compute.h"

namespace pipetrain::stage_server {

// The reduction's time in one step.
struct ReductionTimes {
  // Every average's own time on the worker, summed: what the reduction costs.
  absl::Duration busy;
  // What Finish waited for and spent writing back: the part the step did not hide.
  absl::Duration exposed;
  int calls = 0;
};

// One step's averages, in the order they were started. Every replica of a stage runs
// the same program, so they start the same buffers in the same order: the collective
// underneath pairs calls by their order.
class OverlappedReduction {
 public:
  // Writes a buffer's average back where it came from (on Finish's thread).
  using WriteBack = std::function<absl::Status(std::span<const float>)>;

  explicit OverlappedReduction(GradientAverage average);
  // Waits for the averages already started (each is bounded by its own deadline).
  ~OverlappedReduction();
  OverlappedReduction(const OverlappedReduction&) = delete;
  OverlappedReduction& operator=(const OverlappedReduction&) = delete;

  // Queues `data` to be averaged; `write_back` gets the result at Finish. After a
  // failed average the rest are skipped (the collective is broken) and Finish fails.
  void Start(std::vector<float> data, WriteBack write_back);
  // Waits for every started average, then writes them back in order; the first error
  // (an average's or a write-back's). Resets for the next step; `times` gets this
  // step's figures.
  absl::Status Finish(ReductionTimes* times);
  // Averages started and not yet finished by the worker (for tests).
  int pending() const;

 private:
  struct Item {
    std::vector<float> data;
    WriteBack write_back;
    bool done = false;
  };
  void Work();

  const GradientAverage average_;
  mutable absl::Mutex mu_;
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);  // grows without moving the others
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // the worker's next item
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  absl::Duration busy_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace pipetrain::stage_server
