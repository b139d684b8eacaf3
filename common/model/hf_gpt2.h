// The GPT-2 family's half of Hugging Face folders (hf_folder.h reads and writes the
// folders): its config.json both ways, and its tensor names. The parameter names and
// layouts of the GPT-2 family already are Hugging Face's (Conv1D weights [in, out]), so
// reading is renaming and checking: real files name tensors with or without the
// "transformer." prefix, leave lm_head.weight out when it is tied to wte, and may carry
// the attention-mask buffers h.N.attn.bias and h.N.attn.masked_bias (not weights; skipped).
#pragma once

#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/transformer_config.h"

namespace pipetrain::model {

// What from_pretrained and our config.json call the GELU we compute (the tanh form).
inline constexpr char kHfActivation[] = "gelu_new";

// The TransformerConfig a GPT-2 config.json describes: vocab_size, n_embd, n_layer, n_head,
// n_positions (or n_ctx when it is absent) become vocab_size, d_model, n_layers, n_heads
// and seq_len; tie_word_embeddings (default true) becomes tie_embeddings. Fields that would
// change the function (activation_function, layer_norm_epsilon, n_inner,
// scale_attn_weights, scale_attn_by_inverse_layer_idx, add_cross_attention, model_type)
// must say what this model computes. Errors (InvalidArgument) start with `source` and name
// the field.
absl::StatusOr<TransformerConfig> ParseHfGpt2Config(absl::string_view json,
                                                    const std::string& source);

// The config.json of an exported GPT-2 folder (pretty-printed, ends in a newline).
std::string HfGpt2ConfigJson(const TransformerConfig& config);

// The parameter a GPT-2 file's tensor holds: its name, or with the "transformer." prefix
// when `expected` has that; nullopt for an attention-mask buffer.
std::optional<std::string> Gpt2ParamOfHfTensor(absl::string_view file_name,
                                               const std::set<std::string>& expected);

}  // namespace pipetrain::model
