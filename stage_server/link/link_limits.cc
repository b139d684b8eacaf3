#include "stage_server/link/link_limits.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "stage_server/link/host_tensor.h"

namespace pipetrain::stage_server {
namespace {

// Bytes of a tensor of these dimensions (0 when one is not positive).
uint64_t Bytes(common::DType dtype, std::initializer_list<int64_t> dims) {
  return SaturatingTensorBytes(dtype, {dims.begin(), dims.size()});
}

}  // namespace

common::ReassemblerOptions LinkLimits(const model::TransformerConfig& model, int micro_batch_size,
                                      common::DType activations) {
  common::ReassemblerOptions o;
  uint64_t largest = Bytes(activations, {micro_batch_size, model.seq_len, model.d_model});
  if (model.tie_embeddings) {
    largest = std::max(largest, Bytes(common::DType::kF32, {model.vocab_size, model.d_model}));
  }
  // Never above the general bound; a config too broken to size keeps it (Configure
  // refuses such a config before any link is made).
  if (largest > 0) o.max_tensor_bytes = std::min(o.max_tensor_bytes, largest);
  return o;
}

}  // namespace pipetrain::stage_server
