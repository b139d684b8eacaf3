// A checkpoint as a folder: one safetensors file per stage (per
// model chunk when a stage holds several) and model.safetensors.index.json in Hugging
// Face form, each written atomically and the index last, so a folder with an index is
// complete. And the way back: a checkpoint folder (or one file) cut into the layer
// ranges of a new job's stages for `submit --init-from`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"

namespace pipetrain::model {

struct ChunkFile {
  int stage = 0;
  int chunk = 0;
  std::string bytes;  // a safetensors checkpoint file, as ExportChunk streams it
};

// "stage-S.safetensors", or "stage-S-chunk-C.safetensors" when stages hold several chunks.
std::string ChunkFileName(int stage, int chunk, int num_chunks);

// Writes `files` and then the index into `dir` (created if needed).
absl::Status WriteCheckpointFolder(const std::string& dir, const std::vector<ChunkFile>& files,
                                   int num_chunks);

// A whole-model checkpoint from a folder with model.safetensors.index.json (every
// file it names, merged) or from one safetensors file. Errors name `field` (the spec
// field the path came from) and the file.
absl::StatusOr<model::Checkpoint> LoadWholeCheckpoint(const std::string& path,
                                                      const std::string& field);

// Layers [begin, end) of a whole-model checkpoint, optimizer state included when present.
absl::StatusOr<model::Checkpoint> SliceCheckpoint(const model::Checkpoint& whole, int begin,
                                                  int end);

}  // namespace pipetrain::model
