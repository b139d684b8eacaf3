// The GPT model's shape, its pipeline layers and what each costs, as pure figures
// shared by the compute library (which must match them), the planner (which plans
// with them) and checkpoints (which name parameters by them).
//
// Pipeline layers: index 0 is the embedding (wte + wpe), 1..n_layers are the blocks,
// n_layers + 1 is the head (ln_f + lm_head + loss). A stage holds a contiguous range.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

// The math every backend computes, as figures that files describing the model (Hugging
// Face's config.json) are checked against: LayerNorm's epsilon (the compute library's
// reference::kLayerNormEps; a test holds them equal). GELU is the tanh form and attention
// scores are scaled by 1 / sqrt(head_dim).
inline constexpr double kLayerNormEpsilon = 1e-5;

struct GptConfig {
  int vocab_size = 256;
  int seq_len = 0;
  int d_model = 0;
  int n_heads = 0;
  int n_layers = 0;
  // The head's lm_head.weight is a copy of transformer.wte.weight (see ParamSpec::tied_to).
  bool tie_embeddings = false;

  int head_dim() const { return d_model / n_heads; }
  int mlp_dim() const { return 4 * d_model; }
  int num_pipeline_layers() const { return n_layers + 2; }
  bool operator==(const GptConfig&) const = default;
};

// Errors name the field as written in a job spec ("model.d_model").
absl::Status ValidateConfig(const GptConfig& config);
absl::StatusOr<GptConfig> ConfigFromProto(const pipetrain::v1::ModelConfig& proto);
pipetrain::v1::ModelConfig ConfigToProto(const GptConfig& config);

enum class LayerKind { kEmbedding, kBlock, kHead };
LayerKind KindOfLayer(const GptConfig& config, int pipeline_layer);
std::string LayerName(const GptConfig& config,
                      int pipeline_layer);  // "embedding", "block 3", "head"

// One parameter tensor: its Hugging Face GPT-2 name (global block index) and shape.
// Linear weights are stored [in, out] (GPT-2's Conv1D layout, y = x W + b);
// lm_head.weight is [vocab, d_model] (y = x W^T); wte [vocab, d_model]; wpe
// [seq_len, d_model]; LayerNorm weight and bias [d_model].
//
// Tied embeddings: the head still holds lm_head.weight, as a copy of wte with
// tied_to = "transformer.wte.weight". The copy starts equal to wte, and each step the
// two gradients are summed into both before the same update is applied to both, so
// the copies never drift. It is not counted twice in the gradient norm, and a
// checkpoint that holds wte leaves the copy out (as Hugging Face files do).
inline constexpr char kTokenEmbeddingName[] = "transformer.wte.weight";
inline constexpr char kPositionEmbeddingName[] = "transformer.wpe.weight";
inline constexpr char kOutputHeadName[] = "lm_head.weight";

struct ParamSpec {
  ParamSpec() = default;
  ParamSpec(std::string name, std::vector<int64_t> shape, bool is_matrix = false,
            std::string tied_to = {})
      : name(std::move(name)),
        shape(std::move(shape)),
        is_matrix(is_matrix),
        tied_to(std::move(tied_to)) {}

  std::string name;
  std::vector<int64_t> shape;
  bool is_matrix = false;  // receives weight decay
  std::string tied_to;     // the parameter this one copies, or empty
  int64_t num_elements() const;
};

// The parameters of one pipeline layer, in a fixed order.
std::vector<ParamSpec> LayerParams(const GptConfig& config, int pipeline_layer);
// The parameters of pipeline layers [begin, end), in order.
std::vector<ParamSpec> RangeParams(const GptConfig& config, int begin, int end);
// What a checkpoint of layers [begin, end) stores: RangeParams less the tied copies
// whose original is in the range too. A head-only range keeps its copy, so every
// stage's file restores its stage alone.
std::vector<ParamSpec> CheckpointParams(const GptConfig& config, int begin, int end);

// Analytic costs of one pipeline layer, per token of a micro-batch.
struct LayerCost {
  int64_t params = 0;
  double forward_flops = 0;          // per token
  double backward_input_flops = 0;   // per token: gradient w.r.t. the layer input
  double backward_weight_flops = 0;  // per token: gradients w.r.t. the parameters
  // Bytes kept from forward to backward per token, without recomputation. The compute
  // library's layers must store exactly this much (tests hold them to it).
  double activation_bytes = 0;
  // Bytes kept per token with recomputation: only the layer's input.
  double activation_bytes_recompute = 0;
  // Bytes of the layer's output per token (what crosses a stage boundary after it).
  double output_bytes = 0;
  // Bytes per token a split backward's input half (I) keeps until its weight half (W)
  // on top of the forward's activations: the output gradients W needs, less what I
  // frees (negative when it frees more).
  double weight_grad_bytes = 0;
};
LayerCost CostOfLayer(const GptConfig& config, int pipeline_layer);
// The elements of LayerParams(config, pipeline_layer), counted in closed form (cheap).
int64_t ParamsOfLayer(const GptConfig& config, int pipeline_layer);

// Activation memory of a model chunk, pipeline layers [begin, end) run as one
// compute::ModelChunk, in bytes per token of a micro-batch, exactly as it holds them. The
// planner predicts with it and the emulated device holds it.
struct ChunkMemory {
  double stored = 0;  // kept from a micro-batch's forward until its backward ends
  // With recomputation: the activations rebuilt for the micro-batch whose backward
  // runs, on top of `stored` (also held for a moment during its forward).
  double backward_extra = 0;
  // A split backward keeps this from its input half until its weight half.
  double weight_grad = 0;
};
ChunkMemory ChunkActivationBytes(const GptConfig& config, int begin, int end, bool recompute);

}  // namespace pipetrain::model
