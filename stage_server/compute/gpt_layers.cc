#include "stage_server/compute/gpt_layers.h"

#include <algorithm>
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "common/model/init.h"
#include "common/status_macros.h"
#include "stage_server/compute/gpt2_layers.h"
#include "stage_server/compute/llama_layers.h"

namespace pipetrain::compute {

template <typename Real>
size_t Stash<Real>::owned_bytes() const {
  size_t total = 0;
  for (const BackendBuffer<Real>& b : slots_) total += b.bytes();
  return total;
}

// ---- PipelineLayer ------------------------------------------------------------------

template <typename Real>
absl::Status PipelineLayer<Real>::AllocateParams() {
  specs_ = model::LayerParams(config_, index_);
  for (const model::ParamSpec& s : specs_) {
    offsets_.push_back(num_params_);
    num_params_ += s.num_elements();
  }
  ASSIGN_OR_RETURN(params_, BackendBuffer<Real>::Zeros(backend_, num_params_));
  ASSIGN_OR_RETURN(grads_, BackendBuffer<Real>::Zeros(backend_, num_params_));
  moment_piece_ = {0, static_cast<uint64_t>(num_params_)};
  return absl::OkStatus();
}

template <typename Real>
absl::Status PipelineLayer<Real>::SetMomentPiece(model::CopyRange piece) {
  if (piece.begin > piece.end || piece.end > static_cast<uint64_t>(num_params_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", index_, ": moment piece [", piece.begin, ", ", piece.end,
        ") is not within its ", num_params_, " parameters"));
  }
  if (has_optimizer_state()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layer ", index_, ": its optimizer state exists; the moment piece is set before"));
  }
  moment_piece_ = piece;
  return absl::OkStatus();
}

template <typename Real>
absl::Status PipelineLayer<Real>::Initialize(uint64_t seed) {
  std::vector<std::vector<float>> values = model::InitLayerParams(config_, index_, seed);
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::vector<Real> v(values[i].begin(), values[i].end());
    RETURN_IF_ERROR(backend_->CopyFromHost(param(i), v.data(), BytesOf<Real>(v.size())));
  }
  ParamsChanged();
  adam_m_.Reset();  // fresh optimizer state
  adam_v_.Reset();
  return ZeroGrads();
}

template <typename Real>
absl::StatusOr<const void*> PipelineLayer<Real>::ProductCopy(int i) {
  const int64_t bytes = backend_->ProductCopyBytes(num_params_);
  if (bytes == 0) return nullptr;
  // Remade from scratch when the products' dtype changed since (the backend is shared).
  if (product_copy_.bytes() != static_cast<size_t>(bytes) ||
      product_copy_dtype_ != backend_->product_operands()) {
    product_copy_.Reset();
    ASSIGN_OR_RETURN(product_copy_, BackendBuffer<Real>::Allocate(backend_, bytes));
    product_copy_dtype_ = backend_->product_operands();
    product_copy_fresh_ = false;
  }
  if (!product_copy_fresh_) {
    RETURN_IF_ERROR(backend_->MakeProductCopy(num_params_, params_.data(), product_copy_.raw()));
    product_copy_fresh_ = true;
  }
  // Offsets scale with the copy's bytes per element.
  return static_cast<const std::byte*>(product_copy_.raw()) + offsets_[i] * (bytes / num_params_);
}

template <typename Real>
absl::Status PipelineLayer<Real>::MatmulByParam(int m, int n, int k, const Real* a, int i,
                                                bool trans_w, Real* c, const void* a_copy) {
  ASSIGN_OR_RETURN(const void* copy, ProductCopy(i));
  if (copy == nullptr) return backend_->Matmul(false, trans_w, m, n, k, 1, a, param(i), 0, c);
  const ProductOperand<Real> left = a_copy != nullptr ? CopyOf<Real>(a_copy) : Values(a);
  return backend_->MatmulByCopy(false, trans_w, m, n, k, 1, left, CopyOf<Real>(copy), 0, c);
}

template <typename Real>
absl::Status PipelineLayer<Real>::ZeroGrads() {
  return backend_->Zero(grads_.raw(), grads_.bytes());
}

template <typename Real>
absl::Status PipelineLayer<Real>::Backward(Stash<Real>& stash, const Real* grad_output,
                                           Real loss_grad, Real* grad_input) {
  RETURN_IF_ERROR(BackwardInput(stash, grad_output, loss_grad, grad_input));
  return BackwardWeight(stash);
}

template <typename Real>
absl::Status PipelineLayer<Real>::EnsureOptimizerState() {
  if (!adam_m_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(adam_m_, BackendBuffer<Real>::Zeros(backend_, moment_piece_.size()));
  ASSIGN_OR_RETURN(adam_v_, BackendBuffer<Real>::Zeros(backend_, moment_piece_.size()));
  return absl::OkStatus();
}

template <typename Real>
absl::Status PipelineLayer<Real>::AdamWStep(float lr, float beta1, float beta2, float eps,
                                            float weight_decay, int step, Real grad_scale,
                                            model::CopyRange range) {
  if (range.begin > range.end || range.begin < moment_piece_.begin ||
      range.end > moment_piece_.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer step of layer ", index_, ": range [", range.begin, ", ", range.end,
        ") is not within the piece [", moment_piece_.begin, ", ", moment_piece_.end,
        ") of its ", num_params_, " parameters whose moments it keeps"));
  }
  RETURN_IF_ERROR(EnsureOptimizerState());
  if (grad_scale != Real{1}) {
    RETURN_IF_ERROR(backend_->Scale(range.size(), grad_scale, grads_.data() + range.begin));
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const uint64_t first = std::max<uint64_t>(offsets_[i], range.begin);
    const uint64_t end = std::min<uint64_t>(offsets_[i] + specs_[i].num_elements(), range.end);
    if (first >= end) continue;
    RETURN_IF_ERROR(backend_->AdamW(end - first, params_.data() + first, grads_.data() + first,
                                    adam_m_at(first), adam_v_at(first), lr, beta1, beta2, eps,
                                    specs_[i].is_matrix ? weight_decay : 0.0f, step));
  }
  ParamsChanged();
  return absl::OkStatus();
}

template <typename Real>
int64_t PipelineLayer<Real>::OutputElementsPerRow() const {
  return kind() == model::LayerKind::kHead ? 1 : int64_t{config_.seq_len} * config_.d_model;
}

namespace {

// The compute side of every model family (common/model/model_family.h): the function
// that makes a chunk's layers. Adding a family is adding its entry here.
template <typename Real>
using LayersMaker = absl::StatusOr<Layers<Real>> (*)(const model::TransformerConfig&, int, int,
                                                     BackendT<Real>*);

// A family whose layers share nothing: each made on its own by `make`.
template <typename Real, std::unique_ptr<PipelineLayer<Real>> (*make)(
                             const model::TransformerConfig&, int, BackendT<Real>*)>
absl::StatusOr<Layers<Real>> OneByOne(const model::TransformerConfig& config, int begin, int end,
                                      BackendT<Real>* backend) {
  Layers<Real> layers;
  for (int index = begin; index < end; ++index) layers.push_back(make(config, index, backend));
  return layers;
}

template <typename Real>
LayersMaker<Real> LayersMakerOf(absl::string_view family) {
  if (family == "gpt2") return &OneByOne<Real, &MakeGpt2Layer<Real>>;
  if (family == "llama") return &MakeLlamaLayers<Real>;
  return nullptr;
}

}  // namespace

template <typename Real>
absl::StatusOr<Layers<Real>> MakeLayers(const model::TransformerConfig& config, int begin, int end,
                                        BackendT<Real>* backend) {
  RETURN_IF_ERROR(model::ValidateConfig(config));
  if (begin < 0 || end > config.num_pipeline_layers() || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline layers [", begin, ", ", end,
                                                   ") are empty or outside [0, ",
                                                   config.num_pipeline_layers(), ")"));
  }
  const LayersMaker<Real> make = LayersMakerOf<Real>(config.family);
  if (make == nullptr) {
    return absl::UnimplementedError(absl::StrCat("model family '", config.family,
                                                 "' has no layers in the compute library"));
  }
  ASSIGN_OR_RETURN(Layers<Real> layers, make(config, begin, end, backend));
  for (auto& layer : layers) RETURN_IF_ERROR(layer->AllocateParams());
  return layers;
}

template <typename Real>
absl::StatusOr<std::unique_ptr<PipelineLayer<Real>>> MakeLayer(
    const model::TransformerConfig& config, int index, BackendT<Real>* backend) {
  if (index < 0 || index >= config.num_pipeline_layers()) {
    RETURN_IF_ERROR(model::ValidateConfig(config));
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline layer ", index, " is outside [0, ", config.num_pipeline_layers(), ")"));
  }
  ASSIGN_OR_RETURN(Layers<Real> layers, MakeLayers(config, index, index + 1, backend));
  return std::move(layers.front());
}

template class Stash<float>;
template class Stash<double>;
template class PipelineLayer<float>;
template class PipelineLayer<double>;
template absl::StatusOr<Layers<float>> MakeLayers(const model::TransformerConfig&, int, int,
                                                  BackendT<float>*);
template absl::StatusOr<Layers<double>> MakeLayers(const model::TransformerConfig&, int, int,
                                                   BackendT<double>*);
template absl::StatusOr<std::unique_ptr<PipelineLayer<float>>> MakeLayer(
    const model::TransformerConfig&, int, BackendT<float>*);
template absl::StatusOr<std::unique_ptr<PipelineLayer<double>>> MakeLayer(
    const model::TransformerConfig&, int, BackendT<double>*);

}  // namespace pipetrain::compute
