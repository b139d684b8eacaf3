// Schedule generators: pure functions of stages K, micro-batches M and chunks v that
// return compute-only programs (F, B or I/W, OPT), one per stage, each carrying its
// in-flight bound. lowering.h turns them into programs with sends and receives.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/stage_program.h"

namespace pipetrain::planner {

enum class ScheduleKind {
  kGpipe,        // all forwards, then all backwards (fill-drain)
  kOneFOneB,     // PipeDream-Flush: warm-up, one forward one backward, cool-down
  kInterleaved,  // Megatron interleaved 1F1B with v model chunks per stage
  kZbH1,         // zero-bubble H1: backward split into I and W, W deferred into bubbles
};

// "gpipe", "1f1b", "interleaved", "zb-h1".
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);
std::string ScheduleName(ScheduleKind kind);

// Limits far above any real job, so that a typo cannot make the planner build programs
// of billions of actions.
inline constexpr int kMaxStages = 1024;
inline constexpr int kMaxMicroBatches = 65536;
inline constexpr int kMaxChunks = 64;

// Whether (K, M, v) suits the schedule; errors name the job-spec field
// (pipeline.stages, pipeline.micro_batches, pipeline.chunks). Interleaved needs v >= 2
// and M a multiple of K (Megatron's condition: micro-batches go round in groups of K);
// the others need v = 1.
absl::Status CheckShape(ScheduleKind kind, int stages, int micro_batches, int chunks);

absl::StatusOr<schedule::Schedule> Generate(ScheduleKind kind, int stages, int micro_batches,
                                            int chunks = 1);

// Activations stage s holds at most (per chunk, from forward to backward or W):
// GPipe M; 1F1B min(K - s, M); interleaved min(2(K - s - 1) + (v - 1)K + 1, vM);
// ZB-H1 min(K, M): its W passes are deferred so every stage holds as many as 1F1B's
// first stage does, which is the paper's "same peak memory as 1F1B".
int InFlightBound(ScheduleKind kind, int stages, int micro_batches, int chunks, int stage);

// The textbook bubble as a fraction of the step, for forward 1, backward 2 (I 1 + W 1)
// and free transfer: GPipe and 1F1B (K-1)/(M+K-1); interleaved (K-1)/(vM + K-1), i.e.
// (K-1)/(vM) of the ideal step; ZB-H1 (K-1)/(3M + K-1), the paper's (K-1)(F+I-W) bubble,
// a third of 1F1B's bubble time, which the generator reaches exactly when M >= K.
double TextbookBubble(ScheduleKind kind, int stages, int micro_batches, int chunks);
std::string TextbookFormula(ScheduleKind kind);

}  // namespace pipetrain::planner
