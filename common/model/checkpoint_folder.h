// A checkpoint as a folder: one safetensors file per stage (per
// model chunk when a stage holds several) and model.safetensors.index.json in Hugging
// Face form. The folder appears complete or not at all: it is written as a sibling
// DIR.tmp-XXXXXX and renamed into place. And the way back: a checkpoint folder (or one
// file) cut into the layer ranges of a new job's stages for `submit --init-from`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/checkpoint.h"

namespace pipetrain::model {

struct ChunkFile {
  int stage = 0;
  int chunk = 0;
  std::string bytes;  // a safetensors checkpoint file, as ExportChunk streams it
};

// "stage-S.safetensors", or "stage-S-chunk-C.safetensors" when stages hold several chunks.
std::string ChunkFileName(int stage, int chunk, int num_chunks);

// Writes `files` and then the index into a temporary folder next to `dir`, fsyncs
// them, and renames it to `dir` (its parent is created if needed). An older `dir` is
// renamed away first and removed after, so `dir` is always either the old folder or
// the whole new one. On any error the temporary folder is removed, `dir` is as it was,
// and the error names the file (and says "disk full" for ENOSPC or EFBIG).
absl::Status WriteCheckpointFolder(const std::string& dir, const std::vector<ChunkFile>& files,
                                   int num_chunks);

// Whether a folder name is one of WriteCheckpointFolder's temporary folders
// ("step-7.tmp-Ab12Cd"): a folder being written, or left by a crash. Whoever scans a
// checkpoints folder for step-N folders must skip these.
bool IsTemporaryCheckpointFolder(absl::string_view name);

// N of a checkpoint folder the coordinator named DIR/step-N (N the training run's step,
// >= 0); nullopt for any other name.
std::optional<int64_t> CheckpointFolderStep(absl::string_view dir);

// A whole-model checkpoint from a folder with model.safetensors.index.json (every
// file it names, merged), from a Hugging Face folder (hf_folder.h: IsHfFolder,
// LoadHfFolder) or from one safetensors file. Errors name `field` (the spec field or
// flag the path came from) and the file.
absl::StatusOr<model::Checkpoint> LoadWholeCheckpoint(const std::string& path,
                                                      const std::string& field);

// LoadWholeCheckpoint that also refuses a checkpoint of some pipeline layers only (one
// stage's file): INVALID_ARGUMENT naming `field`, the path, the layers it holds, and
// that `needed_by` (e.g. "generate") needs the whole model.
absl::StatusOr<model::Checkpoint> LoadWholeModel(const std::string& path, const std::string& field,
                                                 absl::string_view needed_by);

// A whole-model checkpoint made fit to start a job whose model is `model`. Every model.*
// field must match (the error starts with `source` and names the field, with both
// values) except seq_len, which may be smaller than the checkpoint's: the job takes the
// first model.seq_len rows of each position table (ParamSpec::per_position: GPT-2's
// transformer.wpe.weight) and of its AdamW moments, as a GPT-2 with n_positions 1024
// trained on shorter sequences would.
absl::StatusOr<Checkpoint> FitCheckpointToModel(Checkpoint whole, const TransformerConfig& model,
                                                absl::string_view source);

// Layers [begin, end) of a whole-model checkpoint, optimizer state included when present.
absl::StatusOr<model::Checkpoint> SliceCheckpoint(const model::Checkpoint& whole, int begin,
                                                  int end);

}  // namespace pipetrain::model
