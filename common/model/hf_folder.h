// Hugging Face folders in and out, for every model family: config.json with
// model.safetensors (or the shards a model.safetensors.index.json names) read into a
// whole-model Checkpoint, and a Checkpoint written as a folder from_pretrained loads.
// config.json's model_type picks the family (model_family.h; a file without one is read
// as GPT-2, as older GPT-2 files are), which reads the rest of config.json and says how
// the file's tensor names map onto its parameters'. Weights may be F32, F16 or BF16
// (widened to F32 on reading).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/checkpoint.h"
#include "common/tensor.h"

namespace pipetrain::model {

inline constexpr char kHfConfigFileName[] = "config.json";
inline constexpr char kHfWeightsFileName[] = "model.safetensors";

// Whether `dir` is a Hugging Face folder rather than a pipetrain checkpoint folder: it has
// a config.json, and no model.safetensors.index.json whose shards are pipetrain checkpoints
// (the coordinator never writes config.json; a folder holding both is read as the pipetrain
// checkpoint, which keeps the optimizer state).
bool IsHfFolder(const std::string& dir);

// Reads a Hugging Face folder: config.json, then model.safetensors if present, else the
// shards model.safetensors.index.json names. The result is a whole-model checkpoint
// (layers [0, n_layer + 2), no optimizer state) whose seq_len is the family's position
// count (GPT-2: n_positions). With tied embeddings the head's copy may be absent or equal
// to the token embedding, and is dropped; a different one is an error naming both
// tensors; untied, it is required. Missing, unexpected, mis-shaped and mis-typed tensors
// give one InvalidArgument error that names the file and lists them.
absl::StatusOr<Checkpoint> LoadHfFolder(const std::string& dir);

// What an exported folder's weights may be written in (`pipetrain export-hf --dtype`).
struct HfWeightsDType {
  absl::string_view name;         // "fp32", "bf16"
  common::DType dtype;            // of every tensor of model.safetensors
  absl::string_view torch_dtype;  // what config.json's torch_dtype says
};
// fp32 (F32, "float32"; the default, first) and bf16 (BF16, "bfloat16": each weight
// rounded to the nearest bf16, ties to even, as common/bf16.h rounds).
const std::vector<HfWeightsDType>& HfWeightsDTypes();
// The row named `name`; InvalidArgument naming the accepted names otherwise.
absl::StatusOr<HfWeightsDType> HfWeightsDTypeNamed(absl::string_view name);

// Writes `checkpoint` (the whole model; its optimizer state is left out) into `dir`
// (created if needed) as DIR/model.safetensors (every tensor in `weights`' dtype, the
// family's names, a tied copy left out, __metadata__ {"format": "pt"}) and then
// DIR/config.json (the family's, torch_dtype `weights`'), each atomically, config.json
// last so that a folder IsHfFolder recognises is complete.
absl::Status ExportHfFolder(const Checkpoint& checkpoint, const std::string& dir,
                            const HfWeightsDType& weights = HfWeightsDTypes().front());

}  // namespace pipetrain::model
