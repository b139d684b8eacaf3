// The costs a job actually pays, fitted from the timelines its stages report: per stage
// and chunk the mean time of each action kind, of the link's transfers and of the
// optimizer step. The coordinator re-simulates the job's own programs with them (its
// fitted prediction of each step); turned into rates per FLOP, byte and parameter they
// predict other shapes of the same model on the same hardware (`plan --costs-from`).
#pragma once

#include <deque>
#include <map>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule/topology.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/simulator.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::planner {

// The means of one chunk's actions over the steps measured; < 0 where none was seen.
struct ChunkMeasure {
  double forward_s = -1;
  double backward_s = -1;         // B, recompute included
  double backward_input_s = -1;   // I, recompute included
  double backward_weight_s = -1;  // W
  double send_busy_s = -1;        // a SEND action's own time
  double recv_busy_s = -1;        // a RECV that came after its send ended: taking a tensor
  // From the start of the send to its arrival, on the receiver's clock, measured where
  // the receiver was waiting before the send began; the receiver's recv_busy_s is taken
  // out in Fit.
  double transfer_activation_s = -1;
  double transfer_gradient_s = -1;
  // Mean bytes a send of this chunk moved (its output and its input gradient are of
  // the same (rows, seq_len, d_model) shape).
  double send_bytes = 0;
};

// Accumulates the timelines of a job's training steps, keeping the latest `window`.
// Each stage's times count from when that stage started the step; the coordinator
// starts every stage's step at once, so the clocks are taken as aligned (their skew
// is the RunStep calls' spread, well under a millisecond on one machine).
class MeasuredCosts {
 public:
  MeasuredCosts(int stages, int chunks, int window = 20,
                schedule::Placement placement = schedule::Placement::kLooped);

  // One step's events from every stage. Errors name the stage and the action that
  // does not fit the job's shape; nothing is added then.
  absl::Status AddStep(const std::vector<pipetrain::v1::TimelineEvent>& events);
  int steps() const { return static_cast<int>(steps_.size()); }
  int stages() const { return stages_; }
  int chunks() const { return chunks_; }

  std::vector<std::vector<ChunkMeasure>> Means() const;  // [stage][chunk]
  std::vector<double> OptimizerMeans() const;             // per stage; < 0 unseen
  // Transfer seconds per byte over every waited-for message; 0 when none was.
  double TransferSecondsPerByte() const;

  // `planned` with every figure measured so far in place of the planner's guess (the
  // memory figures stay the plan's). A chunk whose backward ran as B gets its whole
  // time as backward_input_s (W 0, recompute 0: B's time already holds them). Once a
  // step is measured, stages that share a device no longer take turns in the model: the
  // measured times hold what sharing cost them.
  CostModel Fit(const CostModel& planned) const;

  // The step predicted from `Fit(planned)` with every compute action of the same
  // programs taking a time drawn from those that very action (stage, kind, micro-batch,
  // chunk) took over the window, averaged over `draws` simulations. A step's actions are
  // not alike (1F1B's first forwards share the cores with fewer stages than its steady
  // state's), and their spread lengthens the critical path: a kind's mean misses both
  // (by about 0.02 of bubble on the quickstart). Deterministic for the same
  // measurements; the kind's mean where an action was never seen.
  struct Prediction {
    double step_time_s = 0;
    double bubble_fraction = 0;
  };
  absl::StatusOr<Prediction> Predict(const schedule::Schedule& programs,
                                     const CostModel& planned, int draws) const;

 private:
  struct Sum {
    double seconds = 0;
    double bytes = 0;
    int count = 0;
    void Add(double s, double b = 0);
    void Add(const Sum& other);
    double Mean() const { return count > 0 ? seconds / count : -1.0; }  // -1: none
  };
  enum Slot { kF, kB, kI, kW, kSend, kRecv, kTransferAct, kTransferGrad, kSlots };
  struct StepSums {
    std::vector<Sum> chunk;      // [(stage * chunks + chunk) * kSlots + slot]
    std::vector<Sum> optimizer;  // per stage
    // Every compute action's seconds, by (stage, kind, micro-batch, chunk).
    std::map<std::tuple<int, int, int, int>, double> compute;
  };
  Sum Total(int stage, int chunk, Slot slot) const;

  int stages_, chunks_, window_;
  schedule::Placement placement_;
  std::deque<StepSums> steps_;
};

// Rates measured on one job (its plan and its timelines), for another plan of the
// same model on the same hardware. A schedule that ran full backwards gives I and W
// the same rate. Errors: nothing measured, or a plan of another shape.
absl::StatusOr<CostRates> RatesFromMeasured(const Plan& measured_plan, const MeasuredCosts& m);

}  // namespace pipetrain::planner
