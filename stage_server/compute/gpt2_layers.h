// GPT-2's pipeline layers (the GPT-2 family of common/model/gpt2_family.h) on the backend
// interface: the embedding (x = wte[token] + wpe[t]), the block (x2 = x + attn(ln_1(x));
// y = x2 + mlp(ln_2(x2))) and the head (loss = cross-entropy(ln_f(x) lm_head^T)). The
// block's forward is written once, for training's micro-batches and for generation's
// one position against the key-value cache; only the attention differs.
#pragma once

#include <memory>

#include "common/model/transformer_config.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::compute {

// Pipeline layer `index` of a GPT-2 config, of its kind; parameters not yet allocated.
template <typename Real>
std::unique_ptr<PipelineLayer<Real>> MakeGpt2Layer(const model::TransformerConfig& config,
                                                   int index, BackendT<Real>* backend);

}  // namespace pipetrain::compute
