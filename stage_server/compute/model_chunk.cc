#include "stage_server/compute/model_chunk.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace pipetrain::compute {

template <typename Real>
absl::StatusOr<std::unique_ptr<ModelChunkT<Real>>> ModelChunkT<Real>::Create(
    const model::TransformerConfig& config, int begin, int end, BackendT<Real>* backend,
    ChunkOptions options) {
  RETURN_IF_ERROR(model::ValidateConfig(config));
  if (begin < 0 || end > config.num_pipeline_layers() || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", begin, ", ", end,
                                                   ") is empty or outside [0, ",
                                                   config.num_pipeline_layers(), ")"));
  }
  if (backend == nullptr) return absl::InvalidArgumentError("model chunk: no backend");
  if (options.boundary != common::DType::kF32 && options.boundary != common::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model chunk: activations between layers in ", common::DTypeName(options.boundary),
        "; fp32 and bf16 are supported"));
  }
  const OptimizerSplit& split = options.split;
  if (split.copies < 1 || split.copy < 0 || split.copy >= split.copies) {
    return absl::InvalidArgumentError(absl::StrCat("model chunk: optimizer split: copy ",
                                                   split.copy, " of ", split.copies,
                                                   " is not a copy"));
  }
  std::unique_ptr<ModelChunkT> chunk(new ModelChunkT(config, begin, end, backend, options));
  ASSIGN_OR_RETURN(chunk->layers_, MakeLayers<Real>(config, begin, end, backend));
  for (auto& layer : chunk->layers_) {
    RETURN_IF_ERROR(layer->SetMomentPiece(
        model::RangeOfCopy(layer->num_params(), split.copies, split.copy)));
  }
  return chunk;
}

template <typename Real>
int64_t ModelChunkT<Real>::OutputElements(int B) const {
  return has_head() ? 1 : int64_t{B} * config_.seq_len * config_.d_model;
}

template <typename Real>
int64_t ModelChunkT<Real>::InputBytes(int B) const {
  const int64_t tokens = int64_t{B} * config_.seq_len;
  return has_embedding() ? BytesOf<int32_t>(tokens) : BytesOf<Real>(tokens * config_.d_model);
}

template <typename Real>
absl::Status ModelChunkT<Real>::Initialize(uint64_t seed) {
  for (auto& layer : layers_) RETURN_IF_ERROR(layer->Initialize(seed));
  step_ = 0;
  return absl::OkStatus();
}

// ---- Micro-batches ------------------------------------------------------------------

template <typename Real>
size_t ModelChunkT<Real>::MicroBatch::Bytes() const {
  size_t total = input.bytes() + targets.bytes();
  for (const auto& o : outputs) total += o.bytes();
  for (const auto& s : stashes) total += s.owned_bytes();
  return total;
}

template <typename Real>
size_t ModelChunkT<Real>::ActivationBytes() const {
  size_t total = 0;
  for (const auto& [id, mb] : micro_batches_) total += mb.Bytes();
  return total;
}

template <typename Real>
void ModelChunkT<Real>::NotePeak() {
  peak_bytes_ = std::max(peak_bytes_, ActivationBytes());
}

template <typename Real>
absl::StatusOr<typename ModelChunkT<Real>::MicroBatch*> ModelChunkT<Real>::Find(int mb,
                                                                                const char* what) {
  auto it = micro_batches_.find(mb);
  if (it == micro_batches_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " of micro-batch ", mb, " on layers [", begin_, ", ", end_,
                     "): it has not been forwarded (or its backward already ran)"));
  }
  return &it->second;
}

template <typename Real>
absl::Status ModelChunkT<Real>::AtBoundary(int64_t n, Real* x) {
  if (options_.boundary != common::DType::kBF16) return absl::OkStatus();
  return backend_->RoundToBf16(n, x);
}

template <typename Real>
absl::Status ModelChunkT<Real>::RunForward(MicroBatch& mb, Real* output) {
  const int n = static_cast<int>(layers_.size());
  const int64_t x_elements = int64_t{mb.rows} * config_.seq_len * config_.d_model;
  mb.stashes.clear();
  mb.stashes.resize(n);
  mb.outputs.clear();
  for (int i = 0; i < n; ++i) {
    const void* in = i == 0 ? mb.input.raw() : mb.outputs[i - 1].raw();
    Real* out = output;
    if (i + 1 < n) {
      ASSIGN_OR_RETURN(auto buffer, BackendBuffer<Real>::Elements(backend_, x_elements));
      mb.outputs.push_back(std::move(buffer));
      out = mb.outputs.back().data();
    }
    const int32_t* targets = mb.targets.empty() ? nullptr : mb.targets.ints();
    RETURN_IF_ERROR(layers_[i]->Forward(mb.rows, in, targets, out, mb.stashes[i]));
    if (i + 1 < n || !has_head()) RETURN_IF_ERROR(AtBoundary(x_elements, out));
  }
  return absl::OkStatus();
}

template <typename Real>
absl::Status ModelChunkT<Real>::Forward(int mb_id, int B, const void* input, const int32_t* targets,
                                        Real* output) {
  const std::string where =
      absl::StrCat("forward of micro-batch ", mb_id, " on layers [", begin_, ", ", end_, ")");
  if (micro_batches_.count(mb_id) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": already in flight"));
  }
  if (B <= 0) return absl::InvalidArgumentError(absl::StrCat(where, ": rows ", B, " <= 0"));
  if (input == nullptr || output == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": null input or output"));
  }
  if (has_head() && targets == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the head needs targets"));
  }
  MicroBatch mb;
  mb.rows = B;
  const int64_t tokens = int64_t{B} * config_.seq_len;
  ASSIGN_OR_RETURN(mb.input,
                   has_embedding()
                       ? BackendBuffer<Real>::template Elements<int32_t>(backend_, tokens)
                       : BackendBuffer<Real>::Elements(backend_, tokens * config_.d_model));
  RETURN_IF_ERROR(backend_->Copy(mb.input.raw(), input, InputBytes(B)));
  if (has_head()) {
    // Targets are an input of the whole chunk, so they travel with the micro-batch.
    ASSIGN_OR_RETURN(mb.targets, BackendBuffer<Real>::template Elements<int32_t>(backend_, tokens));
    RETURN_IF_ERROR(backend_->Copy(mb.targets.raw(), targets, BytesOf<int32_t>(tokens)));
  }
  RETURN_IF_ERROR(RunForward(mb, output));
  auto [it, inserted] = micro_batches_.emplace(mb_id, std::move(mb));
  if (options_.recompute) {
    NotePeak();  // the whole stash existed until now
    it->second.stashes.clear();
    it->second.outputs.clear();
  } else {
    it->second.targets.Reset();  // the head's stash holds its own copy
    NotePeak();
  }
  return absl::OkStatus();
}

template <typename Real>
absl::Status ModelChunkT<Real>::Evaluate(int B, const void* input, const int32_t* targets,
                                         Real* output) {
  const std::string where = absl::StrCat("evaluation forward on layers [", begin_, ", ", end_, ")");
  if (B <= 0) return absl::InvalidArgumentError(absl::StrCat(where, ": rows ", B, " <= 0"));
  if (input == nullptr || output == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": null input or output"));
  }
  if (has_head() && targets == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the head needs targets"));
  }
  const int64_t x_elements = int64_t{B} * config_.seq_len * config_.d_model;
  const size_t others = ActivationBytes();  // micro-batches of a step in flight, if any
  const int n = static_cast<int>(layers_.size());
  BackendBuffer<Real> in_buffer, out_buffer;  // between layers; the caller owns input
  const void* in = input;
  for (int i = 0; i < n; ++i) {
    Real* out = output;
    if (i + 1 < n) {
      ASSIGN_OR_RETURN(out_buffer, BackendBuffer<Real>::Elements(backend_, x_elements));
      out = out_buffer.data();
    }
    Stash<Real> stash;  // freed at the end of this iteration: no backward will read it
    RETURN_IF_ERROR(layers_[i]->Forward(B, in, targets, out, stash));
    if (i + 1 < n || !has_head()) RETURN_IF_ERROR(AtBoundary(x_elements, out));
    peak_bytes_ = std::max(peak_bytes_,
                           others + in_buffer.bytes() + out_buffer.bytes() + stash.owned_bytes());
    in_buffer = std::move(out_buffer);  // frees this layer's input
    in = in_buffer.raw();
  }
  return absl::OkStatus();
}

template <typename Real>
absl::Status ModelChunkT<Real>::RunBackwardInput(MicroBatch& mb, const Real* grad_output,
                                                 Real* grad_input, Real loss_grad, bool fused) {
  last_recompute_s_ = 0;
  if (options_.recompute) {
    // Rebuild the stashes with exactly the forward's ops, hence bit-identical results.
    ASSIGN_OR_RETURN(auto scratch,
                     BackendBuffer<Real>::Elements(backend_, OutputElements(mb.rows)));
    // Synchronised on both sides so that queued work before it (the gradient's copy
    // in) is not counted and the forward's own device time is.
    RETURN_IF_ERROR(backend_->Synchronize());
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(RunForward(mb, scratch.data()));
    RETURN_IF_ERROR(backend_->Synchronize());
    last_recompute_s_ = absl::ToDoubleSeconds(absl::Now() - start);
    NotePeak();
  }
  if (!has_head() && grad_output == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("backward on layers [", begin_, ", ", end_, "): grad_output is null"));
  }
  if (!has_embedding() && grad_input == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("backward on layers [", begin_, ", ", end_, "): grad_input is null"));
  }
  const int64_t x_elements = int64_t{mb.rows} * config_.seq_len * config_.d_model;
  const Real* g = grad_output;
  BackendBuffer<Real> g_buffer;  // the gradient flowing between two layers
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    BackendBuffer<Real> next;
    Real* gi = grad_input;
    if (i > 0) {
      ASSIGN_OR_RETURN(next, BackendBuffer<Real>::Elements(backend_, x_elements));
      gi = next.data();
    }
    if (fused) {
      RETURN_IF_ERROR(layers_[i]->Backward(mb.stashes[i], g, loss_grad, gi));
      if (on_final_) on_final_(i);
    } else {
      RETURN_IF_ERROR(layers_[i]->BackwardInput(mb.stashes[i], g, loss_grad, gi));
    }
    if (gi != nullptr) RETURN_IF_ERROR(AtBoundary(x_elements, gi));
    g_buffer = std::move(next);  // layers copy what they keep of their grad_output
    g = g_buffer.data();
  }
  return absl::OkStatus();
}

template <typename Real>
absl::Status ModelChunkT<Real>::Backward(int mb_id, const Real* grad_output, Real* grad_input,
                                         Real loss_grad) {
  ASSIGN_OR_RETURN(MicroBatch * mb, Find(mb_id, "backward"));
  if (mb->input_done) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backward of micro-batch ", mb_id, ": its input half already ran; call BackwardWeight"));
  }
  absl::Status s = RunBackwardInput(*mb, grad_output, grad_input, loss_grad, true);
  micro_batches_.erase(mb_id);
  return s;
}

template <typename Real>
absl::Status ModelChunkT<Real>::BackwardInput(int mb_id, const Real* grad_output, Real* grad_input,
                                              Real loss_grad) {
  ASSIGN_OR_RETURN(MicroBatch * mb, Find(mb_id, "backward-input"));
  if (mb->input_done) {
    return absl::FailedPreconditionError(
        absl::StrCat("backward-input of micro-batch ", mb_id, " already ran"));
  }
  RETURN_IF_ERROR(RunBackwardInput(*mb, grad_output, grad_input, loss_grad, false));
  mb->input_done = true;
  NotePeak();
  return absl::OkStatus();
}

template <typename Real>
absl::Status ModelChunkT<Real>::BackwardWeight(int mb_id) {
  ASSIGN_OR_RETURN(MicroBatch * mb, Find(mb_id, "backward-weight"));
  if (!mb->input_done) {
    return absl::FailedPreconditionError(
        absl::StrCat("backward-weight of micro-batch ", mb_id, " before its backward-input"));
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    RETURN_IF_ERROR(layers_[i]->BackwardWeight(mb->stashes[i]));
    if (on_final_) on_final_(static_cast<int>(i));
  }
  micro_batches_.erase(mb_id);
  return absl::OkStatus();
}

// ---- Parameters ---------------------------------------------------------------------

template <typename Real>
std::vector<model::ParamSpec> ModelChunkT<Real>::Params() const {
  return model::RangeParams(config_, begin_, end_);
}

template <typename Real>
int64_t ModelChunkT<Real>::NumParams() const {
  int64_t n = 0;
  for (const auto& layer : layers_) n += layer->num_params();
  return n;
}

template <typename Real>
absl::StatusOr<std::pair<PipelineLayer<Real>*, int>> ModelChunkT<Real>::FindParam(
    absl::string_view name) const {
  for (const auto& layer : layers_) {
    for (size_t i = 0; i < layer->specs().size(); ++i) {
      if (layer->specs()[i].name == name) {
        return std::pair<PipelineLayer<Real>*, int>{layer.get(), static_cast<int>(i)};
      }
    }
  }
  return absl::NotFoundError(
      absl::StrCat("parameter \"", name, "\" is not in layers [", begin_, ", ", end_, ")"));
}

template <typename Real>
Real* ModelChunkT<Real>::Address(const PipelineLayer<Real>& layer, int i, Field field) {
  switch (field) {
    case Field::kParam:
      return layer.param(i);
    case Field::kGrad:
      return layer.grad(i);
    case Field::kAdamM:
    case Field::kAdamV:
      break;  // HeldPart
  }
  return nullptr;
}

template <typename Real>
typename ModelChunkT<Real>::Part ModelChunkT<Real>::HeldPart(const PipelineLayer<Real>& layer,
                                                             int i, Field field) {
  const uint64_t n = layer.specs()[i].num_elements();
  if (field == Field::kParam || field == Field::kGrad) return {Address(layer, i, field), 0, n};
  const uint64_t off = layer.offset(i);
  const uint64_t first = std::max(off, layer.moment_piece().begin);
  const uint64_t end = std::min(off + n, layer.moment_piece().end);
  if (first >= end) return {nullptr, 0, 0};
  Real* at = field == Field::kAdamM ? layer.adam_m_at(first) : layer.adam_v_at(first);
  return {at, first - off, end - first};
}

template <typename Real>
absl::StatusOr<std::vector<Real>> ModelChunkT<Real>::CopyOut(absl::string_view name,
                                                             Field field) const {
  ASSIGN_OR_RETURN(auto found, FindParam(name));
  auto [layer, i] = found;
  std::vector<Real> out(layer->specs()[i].num_elements());
  const bool moment = field == Field::kAdamM || field == Field::kAdamV;
  if (moment && !layer->has_optimizer_state()) return out;  // no step yet: zeros
  // Moments outside this copy's piece are another copy's: zeros here.
  const Part part = HeldPart(*layer, i, field);
  if (part.count == 0) return out;
  RETURN_IF_ERROR(backend_->CopyToHost(out.data() + part.skip, part.device,
                                       BytesOf<Real>(part.count)));
  return out;
}

template <typename Real>
absl::Status ModelChunkT<Real>::CopyIn(absl::string_view name, Field field,
                                       const std::vector<Real>& values) {
  ASSIGN_OR_RETURN(auto found, FindParam(name));
  const model::ParamSpec& spec = found.first->specs()[found.second];
  if (field == Field::kAdamM || field == Field::kAdamV) {
    RETURN_IF_ERROR(found.first->EnsureOptimizerState());
  }
  if (static_cast<int64_t>(values.size()) != spec.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", name, "\" has ", spec.num_elements(), " elements, got ", values.size()));
  }
  // Of the moments, this copy keeps its piece's only.
  const Part part = HeldPart(*found.first, found.second, field);
  if (part.count > 0) {
    RETURN_IF_ERROR(backend_->CopyFromHost(part.device, values.data() + part.skip,
                                           BytesOf<Real>(part.count)));
  }
  if (field == Field::kParam) found.first->ParamsChanged();
  return absl::OkStatus();
}

template <typename Real>
absl::Status ModelChunkT<Real>::ZeroGrads() {
  for (auto& layer : layers_) RETURN_IF_ERROR(layer->ZeroGrads());
  return absl::OkStatus();
}

template <typename Real>
absl::StatusOr<double> ModelChunkT<Real>::GradSquaredNorm() {
  double total = 0;
  for (auto& layer : layers_) {
    const auto& specs = layer->specs();
    const model::CopyRange piece = layer->moment_piece();  // this copy's (Create)
    const bool has_copy = std::any_of(specs.begin(), specs.end(),
                                      [](const model::ParamSpec& p) { return !p.tied_to.empty(); });
    if (!has_copy) {
      ASSIGN_OR_RETURN(double s, backend_->SumOfSquares(piece.size(),
                                                        layer->all_grads() + piece.begin));
      total += s;
      continue;
    }
    for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
      const uint64_t first = std::max(layer->offset(i), piece.begin);
      const uint64_t end = std::min<uint64_t>(layer->offset(i) + specs[i].num_elements(), piece.end);
      if (!specs[i].tied_to.empty() || first >= end) continue;
      ASSIGN_OR_RETURN(double s, backend_->SumOfSquares(end - first, layer->all_grads() + first));
      total += s;
    }
  }
  return total;
}

template <typename Real>
absl::StatusOr<std::vector<Real>> ModelChunkT<Real>::LayerOut(int i, bool params) const {
  if (i < 0 || i >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", i, " of layers [", begin_, ", ", end_,
                                              "): the chunk has ", num_layers()));
  }
  const PipelineLayer<Real>& layer = *layers_[i];
  std::vector<Real> out(static_cast<size_t>(layer.num_params()));
  RETURN_IF_ERROR(backend_->CopyToHost(out.data(), params ? layer.all_params() : layer.all_grads(),
                                       BytesOf<Real>(out.size())));
  return out;
}

template <typename Real>
absl::Status ModelChunkT<Real>::LayerIn(int i, bool params, std::span<const Real> values) {
  if (i < 0 || i >= num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", i, " of layers [", begin_, ", ", end_,
                                              "): the chunk has ", num_layers()));
  }
  PipelineLayer<Real>& layer = *layers_[i];
  if (values.size() != static_cast<size_t>(layer.num_params())) {
    return absl::InvalidArgumentError(absl::StrCat(
        params ? "weights" : "gradients", " of layer ", begin_ + i, ": ", values.size(),
        " values for ", layer.num_params(), " parameters"));
  }
  RETURN_IF_ERROR(backend_->CopyFromHost(params ? layer.all_params() : layer.all_grads(),
                                         values.data(), BytesOf<Real>(values.size())));
  if (params) layer.ParamsChanged();
  return absl::OkStatus();
}

template <typename Real>
std::string ModelChunkT<Real>::TiedParamName(bool embedding_side) const {
  const std::optional<model::TiedParams> tied = model::TiedParamsOf(config_);
  if (!tied) return "";
  return embedding_side ? tied->embedding : tied->head;
}

template <typename Real>
bool ModelChunkT<Real>::LayerHoldsTiedParam(int i) const {
  if (!config_.tie_embeddings || i < 0 || i >= num_layers()) return false;
  const std::string embedding = TiedParamName(true), head = TiedParamName(false);
  for (const model::ParamSpec& spec : layers_[i]->specs()) {
    if (spec.name == embedding || spec.name == head) return true;
  }
  return false;
}

template <typename Real>
absl::Status ModelChunkT<Real>::AddToGrad(absl::string_view name, const std::vector<Real>& other) {
  ASSIGN_OR_RETURN(std::vector<Real> mine, CopyOut(name, Field::kGrad));
  if (mine.size() != other.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient of \"", name, "\" has ", mine.size(),
                                                   " elements, the other holder's ", other.size()));
  }
  for (size_t i = 0; i < mine.size(); ++i) mine[i] += other[i];
  return CopyIn(name, Field::kGrad, mine);
}

template <typename Real>
absl::Status ModelChunkT<Real>::SumTiedGradients() {
  if (!config_.tie_embeddings || !has_embedding() || !has_head()) return absl::OkStatus();
  // In backend memory (the (V, C) gradients are large: host copies cost page faults every
  // step): e += h, then h += e's old value kept aside. Both are e + h bit for bit, and
  // the same bits as AddToGrad's host sums (y += 1 * x is y + x).
  ASSIGN_OR_RETURN(auto embedding, FindParam(TiedParamName(true)));
  ASSIGN_OR_RETURN(auto head, FindParam(TiedParamName(false)));
  Real* e = Address(*embedding.first, embedding.second, Field::kGrad);
  Real* h = Address(*head.first, head.second, Field::kGrad);
  const int64_t n = embedding.first->specs()[embedding.second].num_elements();
  ASSIGN_OR_RETURN(auto old_e, BackendBuffer<Real>::Elements(backend_, n));
  RETURN_IF_ERROR(backend_->Copy(old_e.data(), e, BytesOf<Real>(n)));
  RETURN_IF_ERROR(backend_->Axpy(n, Real{1}, h, e));
  return backend_->Axpy(n, Real{1}, old_e.data(), h);
}

template <typename Real>
absl::StatusOr<double> ModelChunkT<Real>::OptimizerStep(const OptimizerSettings& o,
                                                        std::optional<double> global_norm) {
  const OptimizerSplit& split = options_.split;
  double norm = global_norm.value_or(0.0);
  Real scale = 1;
  if (o.grad_clip_norm > 0) {
    if (!global_norm.has_value() && split.copies > 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "optimizer step ", step_ + 1, " of copy ", split.copy, " of ", split.copies,
          ": clipping needs the global gradient norm (summed over the copies' pieces and "
          "the stages), not given"));
    }
    if (!global_norm.has_value()) {
      ASSIGN_OR_RETURN(double sq, GradSquaredNorm());
      norm = std::sqrt(sq);
    }
    // As torch.nn.utils.clip_grad_norm_: scale by max / (norm + 1e-6) when below 1.
    const double coef = o.grad_clip_norm / (norm + 1e-6);
    if (coef < 1) scale = static_cast<Real>(coef);
  }
  ++step_;
  for (auto& layer : layers_) {
    // On the layer's moment piece: this copy's.
    RETURN_IF_ERROR(layer->AdamWStep(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, step_, scale));
  }
  return norm;
}

template class ModelChunkT<float>;
template class ModelChunkT<double>;

}  // namespace pipetrain::compute
