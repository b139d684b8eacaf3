#include "stage_server/exec/executor.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/schedule/validator.h"
#include "common/status_macros.h"

namespace pipetrain::stage_server {
namespace {

using common::Tensor;
using schedule::Action;
using schedule::ActionKind;

bool IsLink(ActionKind k) {
  return k == ActionKind::kSendActivation || k == ActionKind::kRecvActivation ||
         k == ActionKind::kSendGradient || k == ActionKind::kRecvGradient;
}

}  // namespace

struct Executor::StepState {
  StepInputs inputs;
  int num_micro_batches = 0;
  // Evaluation: forwards keep nothing for a backward, and no gradient is touched.
  bool forward_only = false;
  absl::Time start;
  // Received tensors stay in the link's network buffers until the chunk copies them.
  std::map<Key, common::PiecewiseTensor> received_activations;  // RECV_F -> F
  std::map<Key, std::shared_ptr<const Tensor>> outputs;  // F -> SEND_F
  std::map<Key, common::PiecewiseTensor> received_gradients;    // RECV_B -> B / I
  std::map<Key, std::shared_ptr<const Tensor>> input_grads;  // B / I -> SEND_B
  // Sent from one chunk of this stage to another (a V placement's turn): by kind, the
  // receiving chunk and micro-batch, until its RECV takes it.
  std::map<std::tuple<common::TensorKind, int, int>, std::shared_ptr<const Tensor>> handed_over;
  std::vector<float> losses;
  std::vector<bool> have_loss;
  double grad_norm_sq = 0;  // this stage's, summed when the optimizer step comes
  std::optional<PendingOptimizer> deferred;  // held back by defer_optimizer
  size_t peak_bytes = 0;    // activations of all chunks together, at their most
  // Replicas (a training step with average_gradients): per chunk, the position after
  // which its gradients are final (-1: none), and which of its layers' averages have
  // started.
  bool averaging_on = false;
  std::vector<int> last_gradient_position;
  std::vector<std::vector<bool>> averaging;
  absl::Status averaging_failure;  // a layer's gradients could not be read
};

namespace {

bool AddsParamGradients(ActionKind k) {
  return k == ActionKind::kBackward || k == ActionKind::kBackwardWeight;
}

}  // namespace

Executor::Executor(ExecutorConfig config, std::vector<std::unique_ptr<ChunkCompute>> chunks,
                   TensorChannel* next, TensorChannel* prev,
                   std::shared_ptr<common::BufferPool> pool)
    : config_(std::move(config)),
      chunks_(std::move(chunks)),
      next_(next),
      prev_(prev),
      pool_(std::move(pool)) {
  if (config_.average_gradients) {
    reduction_ = std::make_unique<OverlappedReduction>(config_.average_gradients);
  }
}

Executor::~Executor() = default;

void Executor::StartAveraging(int c, int layer, StepState& st) {
  if (st.averaging[c][layer] || !st.averaging_failure.ok()) return;
  ChunkCompute& chunk = *chunks_[c];
  st.averaging[c][layer] = true;
  absl::StatusOr<std::vector<float>> grads = chunk.LayerGradients(layer);
  if (!grads.ok()) {
    st.averaging_failure = grads.status();
    return;
  }
  reduction_->Start(*std::move(grads), [&chunk, layer](std::span<const float> average) {
    return chunk.SetLayerGradients(layer, average);
  });
}

absl::Status Executor::AverageGradients(StepState& st, ActionTiming& t) {
  // What the backward did not start: the tied layers (summed with their other holder
  // just now) and any other, chunk by chunk in layer order, the same on every replica.
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (int l = 0; l < chunks_[c]->NumGradientLayers(); ++l) StartAveraging(c, l, st);
  }
  ReductionTimes times;
  absl::Status s = reduction_->Finish(&times);
  if (s.ok()) s = std::exchange(st.averaging_failure, absl::OkStatus());
  t.reduce_us = absl::ToInt64Microseconds(times.exposed);
  t.reduce_total_us = absl::ToInt64Microseconds(times.busy);
  return s;
}

std::shared_ptr<const Tensor> Executor::Share(Tensor tensor) {
  std::shared_ptr<common::BufferPool> pool = pool_;
  return std::shared_ptr<const Tensor>(new Tensor(std::move(tensor)), [pool](const Tensor* t) {
    Tensor* owned = const_cast<Tensor*>(t);
    pool->Release(owned->ReleaseBuffer());
    delete owned;
  });
}

common::ErrorContext Executor::StepContext(uint64_t step) const {
  return common::ErrorContext()
      .Job(config_.job_id)
      .Stage(config_.stage)
      .Step(static_cast<int64_t>(step));
}

absl::Status Executor::CheckProgram(const schedule::StageProgram& p,
                                    const StepInputs& inputs) const {
  // The schedule's own rules (each action in range, forward before backward, every
  // micro-batch once, the in-flight limit) live in the validator; here only what this
  // stage's configuration and inputs add to them.
  RETURN_IF_ERROR(schedule::ValidateProgram(p));
  const common::ErrorContext context =
      common::ErrorContext("program").Job(config_.job_id).Stage(config_.stage);
  auto bad = [&](const std::string& what) {
    return context.Error(absl::StatusCode::kInvalidArgument, what);
  };
  if (p.stage != config_.stage) return bad(absl::StrCat("field stage is ", p.stage));
  if (p.num_stages != config_.num_stages) {
    return bad(absl::StrCat("field num_stages is ", p.num_stages, ", configured ",
                            config_.num_stages));
  }
  if (p.num_chunks != config_.num_chunks) {
    return bad(absl::StrCat("field num_chunks is ", p.num_chunks, ", configured ",
                            config_.num_chunks));
  }
  if (p.placement != config_.placement) {
    return bad(absl::StrCat("field placement is ", schedule::PlacementName(p.placement),
                            ", configured ", schedule::PlacementName(config_.placement)));
  }
  const int M = p.num_micro_batches;
  if (config_.stage == 0 && static_cast<int>(inputs.tokens.size()) != M) {
    return bad(absl::StrCat("tokens has ", inputs.tokens.size(), " micro-batches, the program ",
                            M));
  }
  if (HoldsHead() && static_cast<int>(inputs.targets.size()) != M) {
    return bad(absl::StrCat("targets has ", inputs.targets.size(), " micro-batches, the program ",
                            M));
  }
  if (inputs.defer_optimizer &&
      std::none_of(p.actions.begin(), p.actions.end(),
                   [](const Action& a) { return a.kind == ActionKind::kOptimizerStep; })) {
    return StepContext(inputs.step)
        .Error(absl::StatusCode::kInvalidArgument,
               "field defer_optimizer is set but the program has no optimizer step");
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Executor::RunStep(const schedule::StageProgram& program,
                                             StepInputs inputs) {
  RETURN_IF_ERROR(CheckNoPendingOptimizer(absl::StrCat("step ", inputs.step)));
  RETURN_IF_ERROR(CheckProgram(program, inputs));
  ASSIGN_OR_RETURN(std::unique_ptr<StepState> st, StartStep(program, std::move(inputs)));
  StepResult result;
  absl::Status failure = RunTimedPositions(program, *st, result.timings);
  if (failure.ok()) failure = FinishStep(*st);
  if (!failure.ok()) {
    AbandonStep(*st);
    return failure;
  }
  result.peak_activation_bytes = st->peak_bytes;
  if (HoldsHead()) result.losses = st->losses;
  result.grad_norm_sq = st->grad_norm_sq;
  pending_ = std::move(st->deferred);
  const LinkBytes moved = StepBytes(result.timings);
  result.bytes_sent = moved.sent;
  result.bytes_received = moved.received;
  return result;
}

Executor::LinkBytes Executor::StepBytes(const std::vector<ActionTiming>& timings) {
  LinkBytes b;
  for (const ActionTiming& t : timings) {
    const ActionKind k = t.action.kind;
    if (k == ActionKind::kSendActivation || k == ActionKind::kSendGradient) b.sent += t.bytes;
    if (k == ActionKind::kRecvActivation || k == ActionKind::kRecvGradient) b.received += t.bytes;
  }
  return b;
}

absl::StatusOr<std::unique_ptr<Executor::StepState>> Executor::StartStep(
    const schedule::StageProgram& program, StepInputs inputs) {
  auto st = std::make_unique<StepState>();
  st->num_micro_batches = program.num_micro_batches;
  st->forward_only = program.forward_only;
  st->inputs = std::move(inputs);
  st->losses.assign(st->num_micro_batches, 0.0f);
  st->have_loss.assign(st->num_micro_batches, false);
  if (next_) next_->BeginStep(st->inputs.step);
  if (prev_) prev_->BeginStep(st->inputs.step);
  // Evaluation leaves the gradients (like the weights and AdamW state) as they are.
  if (!st->forward_only) {
    for (auto& chunk : chunks_) RETURN_IF_ERROR(chunk->ZeroGrads());
  }
  st->averaging_on = reduction_ != nullptr && !st->forward_only;
  if (st->averaging_on) {
    st->last_gradient_position.assign(chunks_.size(), -1);
    st->averaging.resize(chunks_.size());
    for (size_t c = 0; c < chunks_.size(); ++c) {
      st->averaging[c].assign(chunks_[c]->NumGradientLayers(), false);
    }
    for (size_t i = 0; i < program.actions.size(); ++i) {
      const Action& a = program.actions[i];
      if (AddsParamGradients(a.kind)) st->last_gradient_position[a.chunk] = static_cast<int>(i);
    }
  }
  st->start = absl::Now();
  return st;
}

absl::Status Executor::RunTimedPositions(const schedule::StageProgram& program,
                                         StepState& st, std::vector<ActionTiming>& timings) {
  for (size_t i = 0; i < program.actions.size(); ++i) {
    const Action& a = program.actions[i];
    if (config_.before_action && !st.forward_only) {
      config_.before_action(a, st.num_micro_batches, st.inputs.step);
    }
    ActionTiming t;
    t.action = a;
    t.link = IsLink(a.kind);
    t.start_us = absl::ToInt64Microseconds(absl::Now() - st.start);
    const bool compute = schedule::IsCompute(a.kind);
    if (compute) chunks_[a.chunk]->ResetPeak();
    absl::Status s = a.kind == ActionKind::kOptimizerStep ? PrepareOptimizerStep(st, t)
                                                          : absl::OkStatus();
    if (s.ok()) s = RunStartingReductions(static_cast<int>(i), a, st, t);
    if (compute && s.ok()) RecordActivationPeak(a, st);
    FinishTiming(a, s.ok(), st, t);
    if (!s.ok()) {
      const common::ErrorContext position(
          absl::StrCat("position ", i, " (", schedule::ToString(a), ")"));
      return StepContext(st.inputs.step).Wrap(position.Wrap(s));
    }
    // A held-back optimizer step reports its timing (and its averaging's) when
    // ApplyOptimizer runs it.
    if (a.kind == ActionKind::kOptimizerStep && st.inputs.defer_optimizer) {
      if (st.deferred) {
        st.deferred->reduce_us = t.reduce_us;
        st.deferred->reduce_total_us = t.reduce_total_us;
      }
      continue;
    }
    timings.push_back(t);
  }
  return absl::OkStatus();
}

absl::Status Executor::PrepareOptimizerStep(StepState& st, ActionTiming& t) {
  // The tied gradients are summed first: the norm and the update need the sum.
  if (config_.tie_embeddings) RETURN_IF_ERROR(SumTiedGradients(st));
  // The norm and the update need the replicas' mean gradient.
  if (st.averaging_on) {
    RETURN_IF_ERROR(common::ErrorContext("averaging the gradients over the replicas")
                        .Wrap(AverageGradients(st, t)));
  }
  for (auto& chunk : chunks_) {
    ASSIGN_OR_RETURN(const double sq, chunk->GradSquaredNorm());
    st.grad_norm_sq += sq;
  }
  return absl::OkStatus();
}

absl::Status Executor::RunStartingReductions(int position, const Action& a, StepState& st,
                                             ActionTiming& t) {
  // The chunk's last gradient action: each layer's average starts as it completes.
  const bool last_gradients = st.averaging_on && schedule::IsCompute(a.kind) &&
                              st.last_gradient_position[a.chunk] == position;
  if (!last_gradients) return Dispatch(a, st, t);
  const int c = a.chunk;
  chunks_[c]->OnFinalGradients([this, c, &st](int layer) {
    // Tied gradients change at the optimizer step: those wait for it.
    if (config_.tie_embeddings && chunks_[c]->LayerHoldsTiedParam(layer)) return;
    StartAveraging(c, layer, st);
  });
  absl::Status s = Dispatch(a, st, t);
  chunks_[c]->OnFinalGradients({});
  if (s.ok()) s = st.averaging_failure;
  return s;
}

void Executor::RecordActivationPeak(const Action& a, StepState& st) const {
  size_t total = chunks_[a.chunk]->PeakActivationBytes();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (static_cast<int>(c) != a.chunk) total += chunks_[c]->ActivationBytes();
  }
  st.peak_bytes = std::max(st.peak_bytes, total);
}

void Executor::FinishTiming(const Action& a, bool ok, const StepState& st, ActionTiming& t) const {
  t.end_us = absl::ToInt64Microseconds(absl::Now() - st.start);
  const int64_t length = std::max<int64_t>(t.end_us - t.start_us, 0);
  t.reduce_us = std::min(t.reduce_us, length);
  if (ok && schedule::ProducesInputGradient(a.kind)) {
    // Never more than the action itself: both are truncated to microseconds.
    const auto recompute = static_cast<int64_t>(chunks_[a.chunk]->LastRecomputeSeconds() * 1e6);
    t.recompute_us = std::min(std::max<int64_t>(recompute, 0), length);
  }
}

absl::Status Executor::FinishStep(StepState& st) {
  // Everything sent must leave before the step counts as done.
  const absl::Time deadline = absl::Now() + config_.recv_timeout;
  if (next_) RETURN_IF_ERROR(next_->Flush(deadline));
  if (prev_) RETURN_IF_ERROR(prev_->Flush(deadline));
  if (!st.outputs.empty() || !st.input_grads.empty() || !st.received_activations.empty() ||
      !st.received_gradients.empty() || !st.handed_over.empty()) {
    return StepContext(st.inputs.step)
        .Error(absl::StatusCode::kInvalidArgument,
               absl::StrCat("the program left tensors unsent or unused (", st.outputs.size(),
                            " outputs, ", st.input_grads.size(), " input gradients, ",
                            st.received_activations.size(), " activations, ",
                            st.received_gradients.size(), " gradients, ",
                            st.handed_over.size(), " handed between chunks)"));
  }
  return absl::OkStatus();
}

void Executor::AbandonStep(const StepState& st) {
  for (auto& chunk : chunks_) chunk->Abandon();
  if (st.averaging_on) {
    // The averages already started end (each within its deadline) before the buffers
    // they write back to change; the next step starts afresh.
    ReductionTimes ignored;
    (void)reduction_->Finish(&ignored);
  }
}

absl::Status Executor::Dispatch(const Action& a, StepState& st, ActionTiming& timing) {
  switch (a.kind) {
    case ActionKind::kRecvActivation:
      return Receive(a, common::TensorKind::kActivation, st, timing);
    case ActionKind::kRecvGradient:
      return Receive(a, common::TensorKind::kGradient, st, timing);
    case ActionKind::kForward:
      return RunForward(a, st);
    case ActionKind::kSendActivation:
      return Send(a, common::TensorKind::kActivation, st, timing);
    case ActionKind::kSendGradient:
      return Send(a, common::TensorKind::kGradient, st, timing);
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      return RunBackward(a, st);
    case ActionKind::kBackwardWeight:
      return chunks_[a.chunk]->BackwardWeight(a.micro_batch);
    case ActionKind::kOptimizerStep:
      return RunOptimizerStep(a, st);
  }
  return absl::InvalidArgumentError("unknown action kind");
}

common::FrameTag Executor::Tag(const StepState& st, int micro_batch, int receiver_chunk,
                               common::TensorKind kind) const {
  return common::FrameTag{config_.job_id, st.inputs.step, static_cast<uint32_t>(micro_batch),
                          static_cast<uint32_t>(receiver_chunk), kind};
}

absl::StatusOr<TensorChannel*> Executor::Neighbour(common::TensorKind kind, bool sending,
                                                  int chunk) const {
  // The hop an activation takes out of this chunk (sending it, or receiving the
  // gradient that comes back over it) or into it (the other two).
  const bool activation = kind == common::TensorKind::kActivation;
  const bool out_of_chunk = activation == sending;
  const int j = VirtualStage(chunk), from = out_of_chunk ? j : j - 1;
  if (from < 0 || from >= LastVirtualStage()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chunk ", chunk, " has no ", out_of_chunk ? "downstream" : "upstream", " neighbour"));
  }
  const schedule::Hop hop = topology().HopAfter(from);
  if (hop == schedule::Hop::kSelf) return nullptr;
  // Leaving by a hop's own direction, or arriving against it.
  const bool downstream = (hop == schedule::Hop::kNext) == out_of_chunk;
  TensorChannel* channel = downstream ? next_ : prev_;
  if (channel != nullptr) return channel;
  return absl::FailedPreconditionError(
      absl::StrCat("this stage has no ", downstream ? "downstream" : "upstream", " neighbour"));
}

absl::Status Executor::Receive(const Action& a, common::TensorKind kind, StepState& st,
                               ActionTiming& timing) {
  ASSIGN_OR_RETURN(TensorChannel * channel, Neighbour(kind, /*sending=*/false, a.chunk));
  const absl::Time deadline = absl::Now() + config_.recv_timeout;
  common::PiecewiseTensor t;
  if (channel == nullptr) {
    ASSIGN_OR_RETURN(t, TakeHandedOver(kind, a, st));
  } else {
    ASSIGN_OR_RETURN(t, channel->Receive(Tag(st, a.micro_batch, a.chunk, kind), deadline));
  }
  timing.bytes = t.num_bytes();
  auto& received = kind == common::TensorKind::kActivation ? st.received_activations
                                                           : st.received_gradients;
  received[{a.chunk, a.micro_batch}] = std::move(t);
  return absl::OkStatus();
}

absl::StatusOr<common::PiecewiseTensor> Executor::TakeHandedOver(common::TensorKind kind,
                                                                 const Action& a,
                                                                 StepState& st) const {
  auto it = st.handed_over.find({kind, a.chunk, a.micro_batch});
  if (it == st.handed_over.end()) {
    return absl::FailedPreconditionError(
        "receives from another chunk of this stage before that chunk sent it");
  }
  std::shared_ptr<const Tensor> tensor = std::move(it->second);
  st.handed_over.erase(it);
  std::vector<common::PiecewiseTensor::Piece> pieces;
  if (tensor->num_bytes() > 0) pieces.push_back(tensor->bytes());
  return common::PiecewiseTensor::FromPieces(tensor->dtype(), tensor->shape(), std::move(pieces),
                                             {tensor});
}

absl::Status Executor::Send(const Action& a, common::TensorKind kind, StepState& st,
                            ActionTiming& timing) {
  ASSIGN_OR_RETURN(TensorChannel * channel, Neighbour(kind, /*sending=*/true, a.chunk));
  const bool activation = kind == common::TensorKind::kActivation;
  auto& produced = activation ? st.outputs : st.input_grads;
  auto it = produced.find({a.chunk, a.micro_batch});
  if (it == produced.end()) {
    return absl::FailedPreconditionError(activation ? "nothing to send: no forward output"
                                                    : "nothing to send: no input gradient");
  }
  // The receiver's chunk: of virtual stage + 1 for an activation, - 1 for a gradient.
  const int receiver_chunk = topology().ChunkOf(VirtualStage(a.chunk) + (activation ? 1 : -1));
  timing.bytes = it->second->num_bytes();
  if (channel == nullptr) {  // to another chunk of this stage: no copy, no link
    st.handed_over[{kind, receiver_chunk, a.micro_batch}] = std::move(it->second);
    produced.erase(it);
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + config_.recv_timeout;
  RETURN_IF_ERROR(
      channel->Send(Tag(st, a.micro_batch, receiver_chunk, kind), it->second, deadline));
  produced.erase(it);
  return absl::OkStatus();
}

absl::Status Executor::RunForward(const Action& a, StepState& st) {
  const Key key{a.chunk, a.micro_batch};
  const int vs = VirtualStage(a.chunk);
  const bool holds_embedding = vs == 0, holds_head = vs == LastVirtualStage();
  common::PiecewiseTensor tokens;
  const common::PiecewiseTensor* input;
  if (holds_embedding) {
    tokens = common::PiecewiseTensor::View(st.inputs.tokens[a.micro_batch]);
    input = &tokens;
  } else {
    auto it = st.received_activations.find(key);
    if (it == st.received_activations.end()) {
      return absl::FailedPreconditionError("forward before its activation was received");
    }
    input = &it->second;
  }
  ChunkCompute& chunk = *chunks_[a.chunk];
  const Tensor* targets = holds_head ? &st.inputs.targets[a.micro_batch] : nullptr;
  ASSIGN_OR_RETURN(Tensor out, st.forward_only ? chunk.Evaluate(*input, targets)
                                               : chunk.Forward(a.micro_batch, *input, targets));
  // The layers keep their own copy of what they need; the network buffers go.
  if (!holds_embedding) st.received_activations.erase(key);
  if (holds_head) {
    st.losses[a.micro_batch] = out.data<float>()[0];
    st.have_loss[a.micro_batch] = true;
  } else {
    st.outputs[key] = Share(std::move(out));
  }
  return absl::OkStatus();
}

absl::Status Executor::RunBackward(const Action& a, StepState& st) {
  const Key key{a.chunk, a.micro_batch};
  const int vs = VirtualStage(a.chunk);
  const bool holds_embedding = vs == 0, holds_head = vs == LastVirtualStage();
  const common::PiecewiseTensor* grad_output = nullptr;
  if (!holds_head) {
    auto it = st.received_gradients.find(key);
    if (it == st.received_gradients.end()) {
      return absl::FailedPreconditionError("backward before its gradient was received");
    }
    grad_output = &it->second;
  }
  ChunkCompute& chunk = *chunks_[a.chunk];
  const float loss_grad = 1.0f / st.num_micro_batches;
  ASSIGN_OR_RETURN(Tensor grad_input,
                   a.kind == ActionKind::kBackward
                       ? chunk.Backward(a.micro_batch, grad_output, loss_grad)
                       : chunk.BackwardInput(a.micro_batch, grad_output, loss_grad));
  if (!holds_head) st.received_gradients.erase(key);
  if (!holds_embedding) st.input_grads[key] = Share(std::move(grad_input));
  return absl::OkStatus();
}

absl::Status Executor::RunOptimizerStep(const Action& a, StepState& st) {
  compute::OptimizerSettings settings = config_.optimizer;
  if (st.inputs.lr) settings.lr = *st.inputs.lr;
  if (st.inputs.defer_optimizer) {
    // The gradients stay as they are until ApplyOptimizer brings the global norm.
    st.deferred = PendingOptimizer{st.inputs.step, a, settings, st.start};
    return absl::OkStatus();
  }
  std::optional<double> norm = st.inputs.global_grad_norm;
  // Without the global norm, clip by this stage's (all its chunks together), unless it
  // holds only its pieces of them: then only the norm over every copy will do.
  if (!norm && settings.grad_clip_norm > 0) {
    if (config_.gather_weights) {
      return StepContext(st.inputs.step)
          .Error(absl::StatusCode::kFailedPrecondition,
                 "clipping with the optimizer split among the replicas needs the global "
                 "gradient norm over every copy's pieces: run the step with defer_optimizer, "
                 "then ApplyOptimizer with that norm");
    }
    norm = std::sqrt(st.grad_norm_sq);
  }
  return StepChunks(settings, norm);
}

absl::Status Executor::StepChunks(const compute::OptimizerSettings& settings,
                                  std::optional<double> global_grad_norm) {
  for (auto& c : chunks_) RETURN_IF_ERROR(c->OptimizerStep(settings, global_grad_norm));
  if (!config_.gather_weights) return absl::OkStatus();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (int l = 0; l < chunks_[c]->NumGradientLayers(); ++l) {
      ASSIGN_OR_RETURN(std::vector<float> weights, chunks_[c]->LayerParams(l));
      RETURN_IF_ERROR(common::ErrorContext(absl::StrCat("gathering the weights of chunk ", c,
                                                        " layer ", l, " from the replicas"))
                          .Wrap(config_.gather_weights(weights)));
      RETURN_IF_ERROR(chunks_[c]->SetLayerParams(l, weights));
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::SumTiedGradients(StepState& st) {
  const schedule::Topology t = topology();
  const int embedding_chunk = config_.stage == 0 ? 0 : -1;
  const int head_chunk = HoldsHead() ? t.HeadChunk() : -1;
  if (embedding_chunk < 0 && head_chunk < 0) return absl::OkStatus();
  if (embedding_chunk >= 0 && embedding_chunk == head_chunk) {  // one chunk holds both
    return chunks_[embedding_chunk]->SumTiedGradients();
  }
  if (embedding_chunk >= 0 && head_chunk >= 0) {  // one stage holds both, in two chunks
    ChunkCompute& e = *chunks_[embedding_chunk];
    ChunkCompute& h = *chunks_[head_chunk];
    ASSIGN_OR_RETURN(common::Tensor from_embedding, e.TiedGradient(true));
    ASSIGN_OR_RETURN(common::Tensor from_head, h.TiedGradient(false));
    RETURN_IF_ERROR(e.AddTiedGradient(true, common::PiecewiseTensor::View(from_head)));
    return h.AddTiedGradient(false, common::PiecewiseTensor::View(from_embedding));
  }
  // Stage 0 and the head's stage (K-1, looped): the ring link joins them (prev of 0,
  // next of K-1).
  const bool embedding_side = embedding_chunk >= 0;
  TensorChannel* peer = embedding_side ? prev_ : next_;
  if (peer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tied embeddings: no link to stage ", embedding_side ? t.HeadStage() : 0,
        " for the embedding gradient"));
  }
  const int mine = embedding_side ? embedding_chunk : head_chunk;
  const int theirs = embedding_side ? t.HeadChunk() : 0;
  auto tag = [&](int receiver_chunk) {
    return common::FrameTag{config_.job_id, st.inputs.step, 0, static_cast<uint32_t>(receiver_chunk),
                            common::TensorKind::kTiedGradient};
  };
  const absl::Time deadline = absl::Now() + config_.recv_timeout;
  ASSIGN_OR_RETURN(common::Tensor own, chunks_[mine]->TiedGradient(embedding_side));
  RETURN_IF_ERROR(peer->Send(tag(theirs), Share(std::move(own)), deadline));
  ASSIGN_OR_RETURN(common::PiecewiseTensor other, peer->Receive(tag(mine), deadline));
  return chunks_[mine]->AddTiedGradient(embedding_side, other);
}

std::optional<uint64_t> Executor::pending_optimizer_step() const {
  if (!pending_) return std::nullopt;
  return pending_->step;
}

absl::Status Executor::CheckNoPendingOptimizer(const std::string& what) const {
  if (!pending_) return absl::OkStatus();
  return common::ErrorContext(what)
      .Job(config_.job_id)
      .Stage(config_.stage)
      .Error(absl::StatusCode::kFailedPrecondition,
             absl::StrCat("the optimizer step of step ", pending_->step,
                          " is still pending (its deferred run ended; ApplyOptimizer must come "
                          "first)"));
}

absl::StatusOr<ActionTiming> Executor::ApplyOptimizer(uint64_t step, double global_grad_norm,
                                                      std::optional<float> lr) {
  const common::ErrorContext context = common::ErrorContext("apply optimizer")
                                           .Job(config_.job_id)
                                           .Stage(config_.stage)
                                           .Step(static_cast<int64_t>(step));
  if (!pending_ || pending_->step != step) {
    return context.Error(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("no optimizer step is pending for this step",
                     pending_ ? absl::StrCat(" (step ", pending_->step, "'s is)")
                              : std::string(" (none is: run the step with defer_optimizer first)")));
  }
  // NaN passes through, as it does when a stage clips by its own norm.
  if (global_grad_norm < 0) {
    return context.Error(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("field global_grad_norm is ", global_grad_norm, ", must be >= 0"));
  }
  PendingOptimizer p = *std::move(pending_);
  pending_.reset();  // applied or failed, it is not pending any more
  if (lr) p.settings.lr = *lr;
  ActionTiming t;
  t.action = p.action;
  t.start_us = absl::ToInt64Microseconds(absl::Now() - p.step_start);
  t.reduce_us = p.reduce_us;  // at the end of the step's first phase, before this
  t.reduce_total_us = p.reduce_total_us;
  RETURN_IF_ERROR(context.Wrap(StepChunks(p.settings, global_grad_norm)));
  t.end_us = absl::ToInt64Microseconds(absl::Now() - p.step_start);
  return t;
}

}  // namespace pipetrain::stage_server
