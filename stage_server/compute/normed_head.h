// The head both families share: loss = mean cross-entropy(norm(x) lm_head^T, targets),
// its logits for generation and its backward, written once around a final norm that each
// family's head supplies (GPT-2: the LayerNorm ln_f; Llama: an RMSNorm). A family's head
// derives from NormedHeadLayer, names its lm_head parameter and how many statistics per
// row its norm keeps, and runs the norm's forward and backward; the rest is the same call
// for call: the stash keeps the targets, the norm's statistics, the probabilities (dlogits
// in their place after the backward) and the norm's output, read again only by the
// lm_head weight gradient's product (kept as its product copy when the products read
// copies, bf16). Tied embeddings need nothing here: the head holds its own copy of the
// matrix, and ModelChunk sums the two gradients.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/transformer_config.h"
#include "stage_server/compute/backend.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::compute {

template <typename Real>
class NormedHeadLayer : public HeadLayer<Real> {
 public:
  absl::Status Forward(int B, const void* input, const int32_t* targets, Real* output,
                       Stash<Real>& s) override;
  absl::Status Logits(int rows, const Real* x, Real* logits) override;
  absl::Status BackwardInput(Stash<Real>& s, const Real* grad_output, Real loss_grad,
                             Real* grad_input) override;
  absl::Status BackwardWeight(Stash<Real>& s) override;

 protected:
  // `lm_head`: the index of the (V, C) output weight among the head's parameters;
  // `stats_per_row`: the statistics the norm keeps per row (LayerNorm: mean and rstd).
  NormedHeadLayer(const model::TransformerConfig& c, int index, BackendT<Real>* b, int lm_head,
                  int stats_per_row)
      : HeadLayer<Real>(c, index, b), lm_head_(lm_head), stats_per_row_(stats_per_row) {}

  // The final norm. `stats` holds stats_per_row blocks of `rows` values each, written by
  // the forward and read by the backward.
  //   h (rows, C) = norm(x (rows, C)).
  virtual absl::Status NormForward(int rows, const Real* x, Real* h, Real* stats) = 0;
  //   dx (rows, C) += dL/dx of dh (rows, C), the gradient of h.
  virtual absl::Status NormBackwardInput(int rows, const Real* dh, const Real* x,
                                         const Real* stats, Real* dx) = 0;
  //   The norm's parameter gradients += theirs of dh.
  virtual absl::Status NormBackwardWeight(int rows, const Real* dh, const Real* x,
                                          const Real* stats) = 0;

 private:
  enum Slot { kTargets, kH, kStats, kProbs, kDh };

  // h (rows, C) = norm(x) with its stats, and h's product copy in h_copy when given;
  // out (rows, V) = h lm_head^T.
  absl::Status LogitsRows(int rows, const Real* x, Real* h, Real* stats, Real* out,
                          void* h_copy = nullptr);

  int lm_head_;
  int stats_per_row_;
};

}  // namespace pipetrain::compute
