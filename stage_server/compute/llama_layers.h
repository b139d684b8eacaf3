// Llama's pipeline layers (the Llama family of common/model/llama_family.h) on the
// backend interface: the embedding (x = embed_tokens[token]), the block (x2 = x +
// o(attn(rope(q|k|v(rmsnorm(x))))); y = x2 + down(swiglu(gate|up(rmsnorm(x2))))) and the
// head (loss = cross-entropy(rmsnorm(x) lm_head^T)). q, k and v are one product, and so
// are gate and up (their weights are adjacent). With fewer key/value heads than query
// heads, the attention runs on heads repeated to the query heads' count (RepeatKv) and
// their gradients are summed back (SumKvGroups). As GPT-2's, the block's forward is
// written once for training and for generation against a key-value cache, which holds
// only the n_kv_heads heads.
#pragma once

#include <memory>

#include "common/model/gpt_config.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::compute {

// Pipeline layer `index` of a Llama config, of its kind; parameters not yet allocated.
template <typename Real>
std::unique_ptr<PipelineLayer<Real>> MakeLlamaLayer(const model::GptConfig& config, int index,
                                                    BackendT<Real>* backend);

}  // namespace pipetrain::compute
