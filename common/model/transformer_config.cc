#include "common/model/transformer_config.h"

#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/model_family.h"

namespace pipetrain::model {
namespace {

// Past this many blocks, n_layers + 2 pipeline layers and the per-layer loops of every
// module would run close to int's range; no model has more than a few hundred.
constexpr int kMaxLayers = 1 << 20;

// What every family's config must hold before its family looks at it.
absl::Status ValidateCommonFields(const TransformerConfig& c) {
  auto positive = [](int v, const char* field) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model.", field, " must be > 0 (got ", v, ")"));
  };
  for (auto [v, f] : {std::pair{c.vocab_size, "vocab_size"},
                      {c.seq_len, "seq_len"},
                      {c.d_model, "d_model"},
                      {c.n_heads, "n_heads"},
                      {c.n_layers, "n_layers"}}) {
    if (absl::Status s = positive(v, f); !s.ok()) return s;
  }
  if (FindFamily(c.family) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model.architecture '", c.family,
                                                   "' is not a model family (accepted: ",
                                                   FamilyNames(), ")"));
  }
  if (c.n_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_layers must be <= ", kMaxLayers, " (got ", c.n_layers, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

int TransformerConfig::mlp_dim() const { return FamilyOf(*this).MlpDim(*this); }

absl::Status ValidateConfig(const TransformerConfig& c) {
  if (absl::Status s = ValidateCommonFields(c); !s.ok()) return s;
  return FamilyOf(c).Validate(c);
}

absl::Status FamilyFieldsFromProto(const pipetrain::v1::ModelConfig& p, TransformerConfig& c) {
  c.family = p.architecture().empty() ? kDefaultFamily : p.architecture();
  const ModelFamily* family = FindFamily(c.family);
  if (family == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model.architecture '", c.family,
                                                   "' is not a model family (accepted: ",
                                                   FamilyNames(), ")"));
  }
  return family->FieldsFromProto(p, c);
}

absl::StatusOr<TransformerConfig> ConfigFromProto(const pipetrain::v1::ModelConfig& p) {
  TransformerConfig c{p.vocab_size(), p.seq_len(), p.d_model(), p.n_heads(), p.n_layers(),
                      p.tie_embeddings()};
  if (absl::Status s = FamilyFieldsFromProto(p, c); !s.ok()) return s;
  if (absl::Status s = ValidateConfig(c); !s.ok()) return s;
  return c;
}

pipetrain::v1::ModelConfig ConfigToProto(const TransformerConfig& c) {
  pipetrain::v1::ModelConfig p;
  p.set_vocab_size(c.vocab_size);
  p.set_seq_len(c.seq_len);
  p.set_d_model(c.d_model);
  p.set_n_heads(c.n_heads);
  p.set_n_layers(c.n_layers);
  p.set_tie_embeddings(c.tie_embeddings);
  if (c.family != kDefaultFamily) p.set_architecture(c.family);
  FamilyOf(c).FieldsToProto(c, p);
  return p;
}

LayerKind KindOfLayer(const TransformerConfig& c, int layer) {
  if (layer == 0) return LayerKind::kEmbedding;
  if (layer == c.n_layers + 1) return LayerKind::kHead;
  return LayerKind::kBlock;
}

std::string LayerName(const TransformerConfig& c, int layer) {
  switch (KindOfLayer(c, layer)) {
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kHead:
      return "head";
    case LayerKind::kBlock:
      return absl::StrCat("block ", layer - 1);
  }
  return "?";
}

int64_t ParamSpec::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamSpec> LayerParams(const TransformerConfig& c, int layer) {
  return FamilyOf(c).LayerParams(c, layer);
}

std::vector<ParamSpec> RangeParams(const TransformerConfig& c, int begin, int end) {
  std::vector<ParamSpec> out;
  for (int l = begin; l < end; ++l) {
    for (ParamSpec& p : LayerParams(c, l)) out.push_back(std::move(p));
  }
  return out;
}

std::vector<ParamSpec> CheckpointParams(const TransformerConfig& c, int begin, int end) {
  std::vector<ParamSpec> all = RangeParams(c, begin, end);
  // The names first: the loop below moves the specs out of `all`.
  std::set<std::string> names;
  for (const ParamSpec& p : all) names.insert(p.name);
  std::vector<ParamSpec> out;
  for (ParamSpec& p : all) {
    if (p.tied_to.empty() || !names.count(p.tied_to)) out.push_back(std::move(p));
  }
  return out;
}

std::optional<TiedParams> TiedParamsOf(const TransformerConfig& c) {
  if (!c.tie_embeddings) return std::nullopt;
  for (ParamSpec& p : LayerParams(c, c.num_pipeline_layers() - 1)) {
    if (!p.tied_to.empty()) return TiedParams{std::move(p.tied_to), std::move(p.name)};
  }
  return std::nullopt;
}

int64_t ParamsOfLayer(const TransformerConfig& c, int layer) {
  return FamilyOf(c).ParamsOfLayer(c, layer);
}

LayerCost CostOfLayer(const TransformerConfig& c, int layer, common::DType products) {
  return FamilyOf(c).CostOfLayer(c, layer, products);
}

uint64_t ChunkTableBytes(const TransformerConfig& c, int begin, int end) {
  return FamilyOf(c).ChunkTableBytes(c, begin, end);
}

ChunkMemory ChunkActivationBytes(const TransformerConfig& config, int begin, int end,
                                 bool recompute, common::DType products) {
  ChunkMemory m;
  double full = 0;
  for (int l = begin; l < end; ++l) {
    const LayerCost c = CostOfLayer(config, l, products);
    full += c.activation_bytes;  // each layer's stash and its input
    m.weight_grad += c.weight_grad_bytes;
  }
  if (!recompute) {
    m.stored = full;
    return m;
  }
  // Recomputing, the chunk keeps its input, and the targets (a token id each) when it
  // holds the head.
  const bool holds_head = end == config.num_pipeline_layers();
  const double input = CostOfLayer(config, begin, products).activation_bytes_recompute;
  const double targets = static_cast<double>(common::DTypeSize(common::DType::kI32));
  m.stored = input + (holds_head ? targets : 0);
  m.backward_extra = full - input;
  return m;
}

}  // namespace pipetrain::model
