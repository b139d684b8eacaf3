// Llama's block (llama_layers.h), in its own file: training's forward and backward, and
// generation's one position against a key-value cache of n_kv_heads heads.
#pragma once

#include <memory>

#include "common/model/gpt_config.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::compute {

template <typename Real>
std::unique_ptr<PipelineLayer<Real>> MakeLlamaBlock(const model::GptConfig& config, int index,
                                                    BackendT<Real>* backend);

}  // namespace pipetrain::compute
