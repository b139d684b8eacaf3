#include "common/model/model_family.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/model/gpt2_family.h"
#include "common/model/llama_family.h"

namespace pipetrain::model {
namespace {

// Every model family: adding one is adding its entry here.
const std::vector<const ModelFamily*>& Families() {
  static const auto* families = new std::vector<const ModelFamily*>{&Gpt2Family(), &LlamaFamily()};
  return *families;
}

}  // namespace

const ModelFamily* FindFamily(absl::string_view name) {
  for (const ModelFamily* f : Families()) {
    if (f->name() == name) return f;
  }
  return nullptr;
}

const ModelFamily& FamilyOf(const TransformerConfig& config) {
  const ModelFamily* f = FindFamily(config.family);
  if (f == nullptr) {
    common::LogError("model", absl::StrCat("model family '", config.family,
                                           "' is unknown (accepted: ", FamilyNames(),
                                           "): a config was used without ValidateConfig"));
    std::abort();
  }
  return *f;
}

std::string DescribeModel(const TransformerConfig& c) {
  return absl::StrCat("vocab_size ", c.vocab_size, ", seq_len ", c.seq_len, ", d_model ",
                      c.d_model, ", n_heads ", c.n_heads, ", n_layers ", c.n_layers,
                      FamilyOf(c).DescribeFields(c));
}

std::string FamilyNames() {
  std::vector<std::string> names;
  for (const ModelFamily* f : Families()) names.emplace_back(f->name());
  return absl::StrJoin(names, ", ");
}

}  // namespace pipetrain::model
