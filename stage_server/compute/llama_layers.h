// Llama's pipeline layers (the Llama family of common/model/llama_family.h) on the
// backend interface: the embedding (x = embed_tokens[token]), the block (x2 = x +
// o(attn(rope(q|k|v(rmsnorm(x))))); y = x2 + down(swiglu(gate|up(rmsnorm(x2))))) and the
// head (loss = cross-entropy(rmsnorm(x) lm_head^T)). q, k and v are one product, and so
// are gate and up (their weights are adjacent). With fewer key/value heads than query
// heads, the attention runs on heads repeated to the query heads' count (RepeatKv) and
// their gradients are summed back (SumKvGroups). As GPT-2's, the block's forward is
// written once for training and for generation against a key-value cache, which holds
// only the n_kv_heads heads. A chunk's blocks read one pair of rotary tables.
#pragma once

#include <memory>

#include "common/model/transformer_config.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::compute {

// Pipeline layers [begin, end) of a Llama config, each of its kind; parameters not yet
// allocated. The blocks among them share one pair of rotary tables (LlamaRotary, made
// here when the range holds a block: model::ChunkTableBytes).
template <typename Real>
absl::StatusOr<Layers<Real>> MakeLlamaLayers(const model::TransformerConfig& config, int begin,
                                             int end, BackendT<Real>* backend);

}  // namespace pipetrain::compute
