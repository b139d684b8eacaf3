// Hugging Face GPT-2 folders in and out: config.json with model.safetensors (or a sharded
// model.safetensors.index.json) read into a whole-model Checkpoint, and a Checkpoint
// written as a folder GPT2LMHeadModel.from_pretrained loads.
//
// The parameter names and layouts of gpt_config.h already are GPT-2's (Conv1D weights [in,
// out]), so reading is renaming and checking: real files name tensors with or without the
// "transformer." prefix, leave lm_head.weight out when it is tied to wte, may carry the
// attention-mask buffers h.N.attn.bias and h.N.attn.masked_bias (not weights; ignored), and
// may store F16 or BF16 (converted to F32).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/checkpoint.h"
#include "common/model/gpt_config.h"

namespace pipetrain::model {

inline constexpr char kHfConfigFileName[] = "config.json";
inline constexpr char kHfWeightsFileName[] = "model.safetensors";
// What from_pretrained and our config.json call the GELU we compute (the tanh form).
inline constexpr char kHfActivation[] = "gelu_new";

// The GptConfig a GPT-2 config.json describes: vocab_size, n_embd, n_layer, n_head,
// n_positions (or n_ctx when it is absent) become vocab_size, d_model, n_layers, n_heads
// and seq_len; tie_word_embeddings (default true) becomes tie_embeddings. Fields that would
// change the function (activation_function, layer_norm_epsilon, n_inner,
// scale_attn_weights, scale_attn_by_inverse_layer_idx, add_cross_attention, model_type)
// must say what this model computes. Errors (InvalidArgument) start with `source` and name
// the field.
absl::StatusOr<GptConfig> ParseHfGpt2Config(absl::string_view json, const std::string& source);

// The config.json of ExportHfGpt2Folder for `config` (pretty-printed, ends in a newline).
std::string HfGpt2ConfigJson(const GptConfig& config);

// Whether `dir` is a Hugging Face folder rather than a pipetrain checkpoint folder: it has
// a config.json, and no model.safetensors.index.json whose shards are pipetrain checkpoints
// (the coordinator never writes config.json; a folder holding both is read as the pipetrain
// checkpoint, which keeps the optimizer state).
bool IsHfFolder(const std::string& dir);

// Reads a Hugging Face GPT-2 folder: config.json, then model.safetensors if present, else
// the shards model.safetensors.index.json names. The result is a whole-model checkpoint
// (layers [0, n_layer + 2), no optimizer state) with seq_len = n_positions. lm_head.weight:
// with tie_word_embeddings (the default) it may be absent or equal to wte, and is dropped;
// a different one is an error naming both tensors; untied, it is required. Missing,
// unexpected, mis-shaped and mis-typed tensors give one InvalidArgument error that names
// the file and lists them.
absl::StatusOr<Checkpoint> LoadHfGpt2Folder(const std::string& dir);

// Writes `checkpoint` (the whole model; its optimizer state is left out) into `dir`
// (created if needed) as DIR/model.safetensors (F32, transformer.* names, lm_head.weight
// only when untied, __metadata__ {"format": "pt"}) and then DIR/config.json, each
// atomically, config.json last so that a folder IsHfFolder recognises is complete.
absl::Status ExportHfGpt2Folder(const Checkpoint& checkpoint, const std::string& dir);

}  // namespace pipetrain::model
