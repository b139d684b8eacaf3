// What the in-process verbs (init, eval, train-local) share: the --model argument (a
// JSON file or inline JSON of pipetrain.v1.ModelConfig) and reading a file. Chunks go
// to and from checkpoints through stage_server/compute/chunk_checkpoint.h.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flags.h"
#include "common/model/checkpoint.h"
#include "common/model/transformer_config.h"
#include "stage_server/compute/model_chunk.h"

namespace pipetrain::client {

// The vocabulary a --model JSON gets when it has no vocab_size: byte-level text.
inline constexpr int kDefaultVocabSize = 256;

// Adds --model JSON (required) to a verb's flags; ParseModelArg reads its value.
void AddModelFlag(common::FlagSet& flags, std::string* target);

// Parses --model: inline JSON when the argument starts with '{' or '[' (after blanks),
// else the path of a JSON file. Fields are the proto names (vocab_size, seq_len, d_model, n_heads,
// n_layers); vocab_size defaults to kDefaultVocabSize, the others are required. Errors
// (InvalidArgument, or the read error) start with "--model" and the file, and name the
// field at fault: unknown, missing, not an integer, or out of range.
absl::StatusOr<model::TransformerConfig> ParseModelArg(const std::string& arg);

// The file's first max_bytes bytes (all of it when max_bytes < 0); errors name the path.
absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes = -1);

}  // namespace pipetrain::client
