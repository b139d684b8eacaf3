// A model family: one architecture of decoder-only Transformer, as what the planner,
// checkpoints, Hugging Face folders and the compute library need to know of it. Its
// pipeline layers' parameters (names, shapes, how they start), FLOPs and activation bytes
// per layer, the checks of its config and its Hugging Face config.json all come from one
// ModelFamily, found by the name a config gives (TransformerConfig::family). GPT-2
// (gpt2_family.h) and Llama (llama_family.h) are the families; another is one more
// implementation and one entry in the table of model_family.cc (and its layers' entry in
// the compute library's table, stage_server/compute/gpt_layers.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/transformer_config.h"
#include "common/tensor.h"

namespace pipetrain::model {

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  // TransformerConfig::family, and the model_type of the family's Hugging Face config.json.
  virtual absl::string_view name() const = 0;

  // ---- The config -----------------------------------------------------------------
  // What this family constrains, once the fields every family has are valid (sizes
  // > 0, n_layers bounded). Errors name the field as a job spec writes it
  // ("model.d_model").
  virtual absl::Status Validate(const TransformerConfig& config) const = 0;
  // The width of a block's MLP.
  virtual int MlpDim(const TransformerConfig& config) const = 0;
  // Sets the family's own fields of `config` from a ModelConfig (their defaults where it
  // leaves them out), refusing the fields of other families, naming them.
  virtual absl::Status FieldsFromProto(const pipetrain::v1::ModelConfig& proto,
                                       TransformerConfig& config) const = 0;
  // Writes the family's own fields of `config` into `proto`.
  virtual void FieldsToProto(const TransformerConfig& config,
                             pipetrain::v1::ModelConfig& proto) const = 0;
  // The family's own fields for a one-line description after the common ones
  // (", llama: n_kv_heads 2, ffn_dim 48"); empty for the default family.
  virtual std::string DescribeFields(const TransformerConfig& config) const = 0;

  // ---- Parameters -----------------------------------------------------------------
  // One pipeline layer's parameters in the fixed order the compute library lays them
  // out, named as the family's Hugging Face checkpoints name them.
  virtual std::vector<ParamSpec> LayerParams(const TransformerConfig& config,
                                             int pipeline_layer) const = 0;
  // Their elements, counted in closed form: a check of a model of a million layers
  // costs arithmetic, not a million lists of strings.
  virtual int64_t ParamsOfLayer(const TransformerConfig& config, int pipeline_layer) const = 0;

  // ---- Costs ----------------------------------------------------------------------
  // FLOPs and bytes per token of one pipeline layer (transformer_config.h: LayerCost), with the
  // activations kept only as product operands held as product copies of `products`.
  virtual LayerCost CostOfLayer(const TransformerConfig& config, int pipeline_layer,
                                common::DType products) const = 0;
  // Bytes a model chunk, pipeline layers [begin, end), holds once on its backend for
  // tables its layers share and only read (Llama: one pair of rotary tables when it holds
  // a block; GPT-2: none), in fp32 as a stage holds them, saturating at UINT64_MAX; the
  // compute library's layers of one chunk allocate exactly this.
  virtual uint64_t ChunkTableBytes(const TransformerConfig& config, int begin, int end) const = 0;

  // ---- Hugging Face folders -------------------------------------------------------
  // The config a config.json of this family's model_type describes; errors
  // (InvalidArgument) start with `source` and name the field.
  virtual absl::StatusOr<TransformerConfig> ParseHfConfig(absl::string_view json,
                                                          const std::string& source) const = 0;
  // The config.json of an exported folder (pretty-printed, ends in a newline); its
  // torch_dtype is the exporter's to set (hf_folder.h: the weights' dtype).
  virtual std::string HfConfigJson(const TransformerConfig& config) const = 0;
  // The parameter a tensor of a Hugging Face weights file holds: its name, or the one
  // of its spellings that `expected` holds; nullopt for a tensor that is no parameter
  // (a buffer some files carry), which is skipped.
  virtual std::optional<std::string> ParamOfHfTensor(
      absl::string_view file_name, const std::set<std::string>& expected) const = 0;
  // Said after the names in an error when some were spelt otherwise in the file.
  virtual absl::string_view hf_renamed_note() const = 0;
};

// The family of that name, or nullptr.
const ModelFamily* FindFamily(absl::string_view name);
// The family of a config that ValidateConfig accepts. An unknown family here is a bug
// (every config that comes in is validated first): it aborts, naming the family.
const ModelFamily& FamilyOf(const TransformerConfig& config);
// The families' names, for errors: "gpt2, llama".
std::string FamilyNames();
// A validated config in one line, as the CLI's banners print it: "vocab_size 256,
// seq_len 64, d_model 32, n_heads 4, n_layers 2" and the family's own fields.
std::string DescribeModel(const TransformerConfig& config);

}  // namespace pipetrain::model
