// The Llama family's half of Hugging Face folders (hf_folder.h reads and writes the
// folders): LlamaForCausalLM's config.json both ways, and its tensor names, which are
// already the family's parameter names.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/transformer_config.h"

namespace pipetrain::model {

// The TransformerConfig a config.json of model_type "llama" describes: hidden_size,
// intermediate_size, num_attention_heads, num_key_value_heads (default: the heads),
// num_hidden_layers, rms_norm_eps, rope_theta (default 10000, Hugging Face's),
// rope_scaling (null or rope_type "llama3"), vocab_size, max_position_embeddings (the
// seq_len) and tie_word_embeddings (default false). What this model does not compute is
// refused naming the field: biases (attention_bias, mlp_bias), another activation than
// silu, a head_dim other than hidden_size / num_attention_heads, a sliding window,
// pretraining_tp > 1, experts, another model_type (mistral, qwen2, ...). Errors
// (InvalidArgument) start with `source`.
absl::StatusOr<TransformerConfig> ParseHfLlamaConfig(absl::string_view json,
                                                     const std::string& source);

// The config.json of an exported Llama folder (pretty-printed, ends in a newline); with
// Llama 3's 128,256-token vocabulary, its bos_token_id 128000 and eos_token_id 128001.
std::string HfLlamaConfigJson(const TransformerConfig& config);

// The parameter a Llama file's tensor holds: its name; nullopt for the rotary buffer
// (model.layers.N.self_attn.rotary_emb.inv_freq) some older files carry.
std::optional<std::string> LlamaParamOfHfTensor(absl::string_view file_name,
                                                const std::set<std::string>& expected);

}  // namespace pipetrain::model
