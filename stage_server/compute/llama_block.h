// Llama's block (llama_layers.h), in its own file: training's forward and backward, and
// generation's one position against a key-value cache of n_kv_heads heads.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/model/transformer_config.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::compute {

// The rotary angles' cos and sin on a backend, (seq_len, hs / 2) each:
// model::MakeRotaryTables's doubles rounded to Real. Made once per chunk and shared by
// its blocks, which only read them; model::ChunkTableBytes counts them (in fp32).
template <typename Real>
struct LlamaRotary {
  BackendBuffer<Real> cos, sin;
  static absl::StatusOr<std::shared_ptr<const LlamaRotary>> Make(
      const model::TransformerConfig& config, BackendT<Real>* backend);
};

// Block `index`, reading `rotary` (not null), which it keeps alive.
template <typename Real>
std::unique_ptr<PipelineLayer<Real>> MakeLlamaBlock(
    const model::TransformerConfig& config, int index, BackendT<Real>* backend,
    std::shared_ptr<const LlamaRotary<Real>> rotary);

}  // namespace pipetrain::compute
