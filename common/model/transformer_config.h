// The model's shape, its pipeline layers and what each costs, as pure figures shared by
// the compute library (which must match them), the planner (which plans with them) and
// checkpoints (which name parameters by them). Every figure here is the config's model
// family's (model_family.h: GPT-2 or Llama); these functions are how the rest of the code
// asks for them without knowing which family it holds.
//
// Pipeline layers, every family's: index 0 is the embedding, 1..n_layers are the blocks,
// n_layers + 1 is the head (final norm + lm_head + loss). A stage holds a contiguous range.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

// The family of a config that does not name one (as configs written before Llama do not).
inline constexpr char kDefaultFamily[] = "gpt2";

// Llama 3.1's rotary frequency scaling (Hugging Face's rope_scaling, rope_type "llama3");
// factor 0: none.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int original_context = 0;  // original_max_position_embeddings
  bool operator==(const RopeScaling&) const = default;
};

struct TransformerConfig {
  int vocab_size = 256;
  int seq_len = 0;
  int d_model = 0;
  int n_heads = 0;
  int n_layers = 0;
  // The head's lm_head.weight is a copy of the token embedding (see ParamSpec::tied_to).
  bool tie_embeddings = false;
  // The model family (model_family.h) whose architecture the sizes above describe
  // (a job spec's model.architecture).
  std::string family = kDefaultFamily;
  // Llama's fields, resolved (defaults filled in) for a Llama config and zero in any
  // other: grouped-query attention's key/value heads, the SwiGLU width, the rotary
  // embeddings' base and scaling, and RMSNorm's epsilon.
  int n_kv_heads = 0;
  int ffn_dim = 0;
  double rope_theta = 0;
  double norm_eps = 0;
  RopeScaling rope_scaling{};

  int head_dim() const { return d_model / n_heads; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int mlp_dim() const;  // the family's width of a block's MLP (GPT-2: 4 x d_model)
  int num_pipeline_layers() const { return n_layers + 2; }
  bool operator==(const TransformerConfig&) const = default;
};

// Errors name the field as written in a job spec ("model.d_model").
absl::Status ValidateConfig(const TransformerConfig& config);
absl::StatusOr<TransformerConfig> ConfigFromProto(const pipetrain::v1::ModelConfig& proto);
// Sets config.family from proto.architecture and the family's own fields (defaults filled
// in), refusing an unknown architecture and another family's fields. Not validated.
absl::Status FamilyFieldsFromProto(const pipetrain::v1::ModelConfig& proto,
                                   TransformerConfig& config);
pipetrain::v1::ModelConfig ConfigToProto(const TransformerConfig& config);

enum class LayerKind { kEmbedding, kBlock, kHead };
LayerKind KindOfLayer(const TransformerConfig& config, int pipeline_layer);
std::string LayerName(const TransformerConfig& config,
                      int pipeline_layer);  // "embedding", "block 3", "head"

// How a parameter's first values are drawn (init.h): GPT-2's scheme, which other
// families share.
enum class ParamInit {
  kZeros,           // biases
  kOnes,            // norm weights
  kNormal,          // N(0, 0.02)
  kResidualNormal,  // N(0, 0.02 / sqrt(2 n_layers)): projections into the residual stream
};

// One parameter tensor: its name (the family's Hugging Face name, with the global block
// index; checkpoints use it too), its shape, and how it is trained and initialised.
//
// Tied embeddings: the head still holds its output matrix, as a copy of the token
// embedding with tied_to naming it. The copy starts equal to the original, and each step
// the two gradients are summed into both before the same update is applied to both, so
// the copies never drift. It is not counted twice in the gradient norm, and a checkpoint
// that holds the original leaves the copy out (as Hugging Face files do).
struct ParamSpec {
  ParamSpec() = default;
  ParamSpec(std::string name, std::vector<int64_t> shape, bool is_matrix = false,
            std::string tied_to = {}, ParamInit init = ParamInit::kZeros)
      : name(std::move(name)),
        shape(std::move(shape)),
        is_matrix(is_matrix),
        tied_to(std::move(tied_to)),
        init(init) {}

  std::string name;
  std::vector<int64_t> shape;
  bool is_matrix = false;  // receives weight decay
  std::string tied_to;     // the parameter this one copies, or empty
  ParamInit init = ParamInit::kZeros;
  // Its rows are positions, seq_len of them (a learned position embedding): a job with a
  // shorter seq_len keeps the first rows (FitCheckpointToModel).
  bool per_position = false;
  int64_t num_elements() const;
};

// The parameters of one pipeline layer, in a fixed order.
std::vector<ParamSpec> LayerParams(const TransformerConfig& config, int pipeline_layer);
// The parameters of pipeline layers [begin, end), in order.
std::vector<ParamSpec> RangeParams(const TransformerConfig& config, int begin, int end);
// What a checkpoint of layers [begin, end) stores: RangeParams less the tied copies
// whose original is in the range too. A head-only range keeps its copy, so every
// stage's file restores its stage alone.
std::vector<ParamSpec> CheckpointParams(const TransformerConfig& config, int begin, int end);

// With tie_embeddings, the token embedding and the head's copy of it, by name.
struct TiedParams {
  std::string embedding;  // the original, in pipeline layer 0
  std::string head;       // the copy, in the head
};
std::optional<TiedParams> TiedParamsOf(const TransformerConfig& config);  // nullopt when untied

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
// Byte figures count activations as F32 elements, but those kept for the backward only as
// operands of its products, which are kept as product copies in the products' operand
// dtype `products` (training.precision's: bf16 halves them), and token ids as I32, each
// sized by the dtype table (common/tensor.h).
LayerCost CostOfLayer(const TransformerConfig& config, int pipeline_layer,
                      common::DType products = common::DType::kF32);
// The elements of LayerParams(config, pipeline_layer), counted in closed form (cheap).
int64_t ParamsOfLayer(const TransformerConfig& config, int pipeline_layer);

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
ChunkMemory ChunkActivationBytes(const TransformerConfig& config, int begin, int end,
                                 bool recompute, common::DType products = common::DType::kF32);

// Bytes a model chunk, pipeline layers [begin, end), holds once whatever its micro-batches:
// the tables its layers share and only read (ModelFamily::ChunkTableBytes: Llama's rotary
// angles, one pair per chunk that holds a block; GPT-2's none), saturating. The planner
// predicts with it, and a stage counts it at Configure and reports it.
uint64_t ChunkTableBytes(const TransformerConfig& config, int begin, int end);

}  // namespace pipetrain::model
