// Checkpoints of a model, whole or the pipeline-layer range [begin, end) that one stage
// holds, as safetensors files with the Hugging Face names and layouts of its family
// (model_family.h), so that per-stage files merge by concatenation and others can read
// them.
//
// File layout. Tensors: the parameters of the range, named and shaped as RangeParams
// gives them, all F32, in that order. With optimizer state, then the AdamW first
// moments as "optimizer.m.<param name>" and the second moments as
// "optimizer.v.<param name>" (same shapes, same order). __metadata__ (all strings):
//   format            "pt" (what Hugging Face loaders expect of a PyTorch checkpoint)
//   pipetrain_format  kCheckpointFormatVersion
//   vocab_size, seq_len, d_model, n_heads, n_layers   the TransformerConfig
//   pipetrain_layers  "begin:end" (absent: the whole model)
//   pipetrain_optimizer_step   present only with optimizer state: AdamW's update count
//   pipetrain_precision        the training.precision the state was trained in (a name
//                              of precision.h's table); absent (every file written before
//                              it existed): "fp32". The tensors are F32 in every precision:
//                              bf16 training keeps fp32 master weights and moments.
// A file meant for other tools should be saved without optimizer state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/transformer_config.h"
#include "common/tensor.h"

namespace pipetrain::model {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kOptimizerFirstMomentPrefix[] = "optimizer.m.";
inline constexpr char kOptimizerSecondMomentPrefix[] = "optimizer.v.";
inline constexpr char kCheckpointIndexFileName[] = "model.safetensors.index.json";
// What a checkpoint without pipetrain_precision was trained in.
inline constexpr char kCheckpointDefaultPrecision[] = "fp32";

// F32 tensors by parameter name (ParamSpec::name). The compute library copies its
// parameters in and out of such a map by name.
using ParamMap = std::map<std::string, common::Tensor>;

// AdamW state: both moment maps hold exactly the parameters' names and shapes.
struct AdamWState {
  ParamMap m;
  ParamMap v;
  int64_t step = 0;  // updates applied so far (the t of the bias correction)
};

struct Checkpoint {
  TransformerConfig config;
  int layer_begin = 0;  // pipeline layers [layer_begin, layer_end)
  int layer_end = 0;
  ParamMap params;
  // Saved and loaded only when present; a file without it loads with std::nullopt.
  std::optional<AdamWState> optimizer;
  // The training.precision the state was trained in; its tensors are F32 in each.
  std::string precision = kCheckpointDefaultPrecision;
};

// What a file's header says, read without its data.
struct CheckpointInfo {
  TransformerConfig config;
  int layer_begin = 0;
  int layer_end = 0;
  bool has_optimizer = false;
  int64_t optimizer_step = 0;
  uint64_t tensor_bytes = 0;  // sum of all tensors' sizes
  std::string precision = kCheckpointDefaultPrecision;
};

// A tensor as far as validation is concerned: a header entry or a loaded tensor.
struct TensorDescription {
  std::string name;
  common::DType dtype = common::DType::kUnspecified;
  std::vector<int64_t> shape;
};

inline constexpr common::DType kF32Only[] = {common::DType::kF32};

// Compares the tensors present with those expected: every expected name present with
// one of `dtypes` and the exact shape, nothing else. One InvalidArgument error, starting
// with `what`, lists every missing, unexpected, mis-typed and mis-shaped tensor by name.
absl::Status CheckTensorSet(const std::vector<ParamSpec>& expected,
                            const std::vector<TensorDescription>& actual, absl::string_view what,
                            std::span<const common::DType> dtypes = kF32Only);

// Every field of `file` (a checkpoint's config) equals `want`'s; the error starts with
// `source` and names the first model.* field that differs, with both values.
absl::Status ConfigsMatch(const TransformerConfig& file, const TransformerConfig& want,
                          absl::string_view source);

// Checks that `params` holds exactly the parameters of layers [begin, end) of `config`
// (RangeParams): every name present, F32, the exact shape, nothing else. The error
// (InvalidArgument) starts with `what` and lists the missing, unexpected, mis-typed and
// mis-shaped tensors by name.
absl::Status ValidateParams(const TransformerConfig& config, int begin, int end,
                            const ParamMap& params, absl::string_view what);

// The __metadata__ of a checkpoint of `checkpoint`'s config and range.
std::map<std::string, std::string> CheckpointMetadata(const Checkpoint& checkpoint);

// Writing: validates the checkpoint (config, range, every tensor) before writing
// anything. SaveCheckpoint is atomic (common/atomic_file.h).
absl::Status SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint);
absl::StatusOr<std::string> SerializeCheckpoint(const Checkpoint& checkpoint);

// Reading: the config and range come from the metadata, and the tensors must be
// exactly those they imply (see ValidateParams). Errors name the file (or `source`).
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path);
absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view bytes,
                                           const std::string& source = "<memory>");
// The header alone, validated as LoadCheckpoint validates it, without reading data.
absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& path);

// `bytes` (a checkpoint file, as a stage's ExportChunk streams it) with its
// pipetrain_precision set to `precision` and everything else as it was: the coordinator
// records the job's precision, which a stage's export leaves at the default. The bytes
// themselves when they already say so. Errors (InvalidArgument) start with `source`.
absl::StatusOr<std::string> WithPrecision(std::string bytes, absl::string_view precision,
                                          const std::string& source);

// Merging per-stage checkpoints: they must share the config and the precision, their
// ranges must join into one contiguous range without overlap (in any order given), and
// either all or none carry optimizer state (at the same step).
absl::StatusOr<Checkpoint> MergeCheckpoints(std::vector<Checkpoint> parts);

// The Hugging Face index of a checkpoint kept as several shard files:
// {"metadata": {"total_size": N}, "weight_map": {tensor name: shard file}}, N the sum
// of all tensors' bytes, shard paths written relative to the index's folder. The shards
// must be valid checkpoints of one config with disjoint tensor names. Atomic.
absl::Status WriteCheckpointIndex(const std::string& index_path,
                                  const std::vector<std::string>& shard_paths);

// The shard files the index of folder `dir` (DIR/model.safetensors.index.json, ours or
// Hugging Face's) names in its weight_map, each once, in name order, as paths in `dir`.
// An entry must be the name of a file of the folder itself: one that climbs out of it
// (../x, /etc/x, sub/../../x) would let a job read outside the folder it was allowed to
// name, so no entry may hold a '/' or be "." or "..". Errors (InvalidArgument) start
// with the index's path and name the entry.
absl::StatusOr<std::vector<std::string>> IndexShardFiles(const std::string& dir);

}  // namespace pipetrain::model
