// Runs one stage's program for one training step, action by action, without knowing
// which schedule made it: forwards and backwards on the stage's model chunks, tensors
// to and from the neighbours, the optimizer step. It records when every action ran,
// the losses (on the stage holding the head), peak activation memory and bytes moved.
// A forward-only (evaluation) program runs its forwards through ChunkCompute::Evaluate,
// which keeps nothing for a backward, and touches no gradient, weight or AdamW state.
//
// Topology (as the planner's, common/schedule/topology.h): the program's placement says
// which virtual stage each chunk is. An activation goes to virtual stage + 1 by the hop
// between them: through `next` (stage (s+1) mod K: a ring with looped chunks), through
// `prev` (the V placement's odd chunks run back), or to another chunk of this stage,
// handed over in memory; a gradient goes back the same way. A frame's tag names the
// receiver's chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/buffer_pool.h"
#include "common/error_context.h"
#include "common/schedule/stage_program.h"
#include "common/tensor.h"
#include "stage_server/exec/chunk_compute.h"
#include "stage_server/exec/overlapped_reduction.h"
#include "stage_server/link/tensor_channel.h"

namespace pipetrain::stage_server {

struct ExecutorConfig {
  std::string job_id;
  int stage = 0;
  int num_stages = 1;
  int num_chunks = 1;
  schedule::Placement placement = schedule::Placement::kLooped;
  // model.tie_embeddings: before the optimizer step the holders of the embedding
  // (virtual stage 0) and of the head (the last) swap their (V, C) gradients, over the
  // ring link when they are different stages, and both add the other's.
  bool tie_embeddings = false;
  // Data-parallel replicas (R > 1): every chunk's gradients are averaged over the
  // replicas with it, layer by layer, each starting (on a worker thread) as soon as the
  // layer's gradients are final; the optimizer step waits for them all, after the
  // tied exchange (tied layers are averaged after it) and before the norm.
  GradientAverage average_gradients;
  // Replicas that split the optimizer (its chunks made with compute::ChunkOptions::split):
  // average_gradients averages only this copy's piece of each layer, the chunks step only
  // their pieces, and right after that step every layer's weights are gathered through
  // this, chunk by chunk in layer order (the same order on every copy). Empty: no split.
  WeightGather gather_weights;
  absl::Duration recv_timeout = absl::Seconds(60);
  compute::OptimizerSettings optimizer = compute::kStageOptimizerDefaults;
  // Called before each action of a training step's program (never of an evaluation's):
  // the stage's --fail-at fault injection (fault_injection.h). May not return.
  std::function<void(const schedule::Action&, int num_micro_batches, uint64_t step)> before_action;
};

struct StepInputs {
  uint64_t step = 0;
  std::vector<common::Tensor> tokens;   // per micro-batch (B, T) i32: stage with the embedding
  std::vector<common::Tensor> targets;  // per micro-batch (B, T) i32: stage with the head
  std::optional<float> lr;              // this step's learning rate (default: optimizer.lr)
  // Global gradient norm for clipping, when the caller computed it across stages;
  // without it, clipping (if on) uses this stage's own norm.
  std::optional<double> global_grad_norm;
  // Phase 1 of a two-phase step: OPTIMIZER_STEP only computes grad_norm_sq; the
  // gradients are kept and the optimizer waits for ApplyOptimizer with the global norm.
  bool defer_optimizer = false;
};

struct ActionTiming {
  schedule::Action action;
  bool link = false;     // a send or receive (else compute)
  int64_t start_us = 0;  // since the start of the step
  int64_t end_us = 0;
  uint64_t bytes = 0;    // moved, for link actions
  // Of a B or I, the time inside [start_us, end_us] (at its start) spent re-running the
  // forward (ChunkCompute::LastRecomputeSeconds); 0 for every other action.
  int64_t recompute_us = 0;
  // Of an OPT action, data-parallel replicas (0 with one): the part of the step's
  // gradient averaging it waited for at its start (what the backward did not hide),
  // and all of the averaging's own time (each layer's average starts as soon as its
  // gradients are final, on a worker, while the backward goes on).
  int64_t reduce_us = 0;
  int64_t reduce_total_us = 0;
};

struct StepResult {
  std::vector<float> losses;  // per micro-batch, on the stage holding the head; else empty
  std::vector<ActionTiming> timings;
  uint64_t peak_activation_bytes = 0;
  uint64_t bytes_sent = 0;  // to and from the neighbours by this step's SEND and RECV actions
  uint64_t bytes_received = 0;
  double grad_norm_sq = 0;  // this stage's share, before the optimizer step
};

class Executor {
 public:
  // chunks[c] is model chunk c of this stage. next / prev may be null where the
  // topology has no such neighbour; the pool serves outgoing tensors.
  Executor(ExecutorConfig config, std::vector<std::unique_ptr<ChunkCompute>> chunks,
           TensorChannel* next, TensorChannel* prev, std::shared_ptr<common::BufferPool> pool);
  ~Executor();

  // Runs the program. On error the step's partial state is dropped and the status
  // names the job, stage, step, and the position and action that failed.
  // While an optimizer step is pending it is FAILED_PRECONDITION naming it.
  absl::StatusOr<StepResult> RunStep(const schedule::StageProgram& program,
                                     StepInputs inputs);

  // Phase 2: applies the optimizer step that `step`'s deferred run held back, clipping
  // (when on) by `global_grad_norm`; `lr` replaces phase 1's learning rate when given.
  // Returns the optimizer action's timing on the step's clock. FAILED_PRECONDITION
  // when no optimizer step of `step` is pending; nothing is pending afterwards.
  absl::StatusOr<ActionTiming> ApplyOptimizer(uint64_t step, double global_grad_norm,
                                              std::optional<float> lr);
  // From any thread: a step waiting for the replicas' averages ends now with ABORTED
  // naming `why`, and so does every later one (the executor is about to be replaced).
  void AbortReduction(const std::string& why) {
    if (reduction_) reduction_->Abort(why);
  }
  // The step whose optimizer step is pending, if any.
  std::optional<uint64_t> pending_optimizer_step() const;
  // OK, or FAILED_PRECONDITION naming the job, stage and pending step and `what` was
  // refused (a step, a configure, an export): they must wait for ApplyOptimizer.
  absl::Status CheckNoPendingOptimizer(const std::string& what) const;

  const ExecutorConfig& config() const { return config_; }
  // Replaces the neighbour channels (after links are made or remade).
  void SetNeighbours(TensorChannel* next, TensorChannel* prev) {
    next_ = next;
    prev_ = prev;
  }
  ChunkCompute& chunk(int c) { return *chunks_[c]; }

 private:
  using Key = std::pair<int, int>;  // (chunk, micro-batch)
  struct StepState;
  // An optimizer step held back by a deferred run, kept until ApplyOptimizer.
  struct PendingOptimizer {
    uint64_t step = 0;
    schedule::Action action;
    compute::OptimizerSettings settings;  // with the step's learning rate
    absl::Time step_start;       // the step's clock, for the action's timing
    int64_t reduce_us = 0, reduce_total_us = 0;  // its averaging, done in phase 1
  };

  // RunStep's steps. Validate: the program (schedule::ValidateProgram) and what this
  // stage's configuration and inputs add to it.
  absl::Status CheckProgram(const schedule::StageProgram& program,
                            const StepInputs& inputs) const;
  // Zeroes the gradients (training), opens the step on the links and starts its clock.
  absl::StatusOr<std::unique_ptr<StepState>> StartStep(const schedule::StageProgram& program,
                                                       StepInputs inputs);
  // Runs the program position by position, timing each action and recording the
  // activation peak of each compute action; the first failure ends the step, named by
  // job, stage, step, position and action.
  absl::Status RunTimedPositions(const schedule::StageProgram& program, StepState& st,
                                 std::vector<ActionTiming>& timings);
  // What the optimizer step needs first: the tied gradients summed, the replicas'
  // average, this stage's squared gradient norm.
  absl::Status PrepareOptimizerStep(StepState& st, ActionTiming& t);
  // The action at `position`; when it is its chunk's last gradient action, each layer's
  // reduction with the other replicas starts as the action makes its gradients final.
  absl::Status RunStartingReductions(int position, const schedule::Action& action,
                                     StepState& st, ActionTiming& t);
  // The peak of activation bytes during a compute action: its chunk's peak with what the
  // other chunks hold meanwhile.
  void RecordActivationPeak(const schedule::Action& action, StepState& st) const;
  // Dispatches an action on its kind to one of the functions below.
  absl::Status Dispatch(const schedule::Action& action, StepState& st, ActionTiming& timing);
  // RECV_F / RECV_B: the tensor from its neighbour, kept in the network's buffers.
  absl::Status Receive(const schedule::Action& action, common::TensorKind kind, StepState& st,
                       ActionTiming& timing);
  // SEND_F / SEND_B: the forward's output or the input gradient, to the neighbour.
  absl::Status Send(const schedule::Action& action, common::TensorKind kind, StepState& st,
                    ActionTiming& timing);
  // A RECV whose sender is another chunk of this stage: what its SEND handed over.
  absl::StatusOr<common::PiecewiseTensor> TakeHandedOver(common::TensorKind kind,
                                                         const schedule::Action& action,
                                                         StepState& st) const;
  absl::Status RunForward(const schedule::Action& action, StepState& st);
  absl::Status RunBackward(const schedule::Action& action, StepState& st);  // B or I
  absl::Status RunOptimizerStep(const schedule::Action& action, StepState& st);
  // The channel a tensor of `kind` leaves chunk `chunk` by (sending) or arrives on;
  // nullptr for a hand-over between two chunks of this stage; FAILED_PRECONDITION
  // naming the side when the topology has no such link.
  absl::StatusOr<TensorChannel*> Neighbour(common::TensorKind kind, bool sending,
                                           int chunk) const;
  common::FrameTag Tag(const StepState& st, int micro_batch, int receiver_chunk,
                       common::TensorKind kind) const;
  // The action's end, and the parts of it spent averaging and recomputing.
  void FinishTiming(const schedule::Action& action, bool ok, const StepState& st,
                    ActionTiming& t) const;
  // Finish: everything sent has left, and nothing received or produced is left over.
  absl::Status FinishStep(StepState& st);
  // After a failure: the chunks drop their micro-batches, started averages end.
  void AbandonStep(const StepState& st);
  // The step's bytes to and from its neighbours: what its SEND and RECV actions moved.
  // Counted from the actions, not the links' running totals, which a neighbour's early
  // frames or a send still leaving would attribute to the wrong step.
  struct LinkBytes {
    uint64_t sent = 0, received = 0;
  };
  static LinkBytes StepBytes(const std::vector<ActionTiming>& timings);
  common::ErrorContext StepContext(uint64_t step) const;  // job, stage and step
  // The tied-embedding gradient exchange (see ExecutorConfig::tie_embeddings).
  absl::Status SumTiedGradients(StepState& st);
  // Replicas: starts the average of layer `layer` of chunk `c` (once a step); at the
  // optimizer step, starts the rest and waits for all, timing it into `t`.
  void StartAveraging(int c, int layer, StepState& st);
  absl::Status AverageGradients(StepState& st, ActionTiming& t);
  // Every chunk's optimizer step, then (with gather_weights) every layer's weights
  // gathered from the copies that own their pieces.
  absl::Status StepChunks(const compute::OptimizerSettings& settings,
                          std::optional<double> global_grad_norm);
  schedule::Topology topology() const {
    return {config_.num_stages, config_.num_chunks, config_.placement};
  }
  int VirtualStage(int chunk) const { return topology().Virtual(config_.stage, chunk); }
  int LastVirtualStage() const { return topology().Last(); }
  bool HoldsHead() const { return topology().HeadStage() == config_.stage; }
  // Wraps a host tensor so that its buffer returns to the pool once sent.
  std::shared_ptr<const common::Tensor> Share(common::Tensor tensor);

  ExecutorConfig config_;
  std::vector<std::unique_ptr<ChunkCompute>> chunks_;
  TensorChannel* next_;
  TensorChannel* prev_;
  std::shared_ptr<common::BufferPool> pool_;
  std::optional<PendingOptimizer> pending_;
  std::unique_ptr<OverlappedReduction> reduction_;  // with average_gradients only
};

}  // namespace pipetrain::stage_server
