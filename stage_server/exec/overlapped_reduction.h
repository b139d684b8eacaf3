// Data-parallel replicas, overlapped with the backward: a layer's gradients are handed
// to the replicas' average (GradientAverage) on a worker thread as soon as they are
// final, while the stage computes on; the optimizer step waits for what is left and
// writes the averages back on its own thread (backends are used from one thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stage_server/exec/chunk_compute.h"

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
// underneath pairs calls by their order. Start, Finish and Abort may be called from
// different threads.
class OverlappedReduction {
 public:
  // Writes a buffer's average back where it came from (on Finish's thread).
  using WriteBack = std::function<absl::Status(std::span<const float>)>;

  // `average` may outlive this object after an Abort (see the destructor): what it
  // uses must be owned by it, not borrowed.
  explicit OverlappedReduction(GradientAverage average);
  // Waits for the averages already started (each is bounded by its own deadline);
  // after an Abort it does not: the worker finishes the one it is in on its own.
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
  // For good: a Finish waiting now, and every later one, returns ABORTED with `why` at
  // once, writing nothing back (a step stuck in the collective while the stage is
  // reconfigured). The average in progress is not interrupted; later ones are skipped.
  void Abort(const std::string& why);
  // Averages started and not yet finished by the worker (for tests).
  int pending() const;

 private:
  struct Item {
    std::vector<float> data;
    WriteBack write_back;
  };
  // Shared with the worker, which may outlive this object after an Abort.
  struct State {
    explicit State(GradientAverage a) : average(std::move(a)) {}
    const GradientAverage average;
    mutable absl::Mutex mu;
    std::deque<Item> items ABSL_GUARDED_BY(mu);  // grows without moving the others
    size_t next ABSL_GUARDED_BY(mu) = 0;           // the worker's next item
    absl::Status failure ABSL_GUARDED_BY(mu);
    absl::Duration busy ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    std::string aborted ABSL_GUARDED_BY(mu);  // why, once aborted
  };
  static void Work(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::thread worker_;
};

}  // namespace pipetrain::stage_server
