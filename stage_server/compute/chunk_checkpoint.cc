#include "stage_server/compute/chunk_checkpoint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::compute {
namespace {

absl::StatusOr<common::Tensor> ToTensor(const model::ParamSpec& spec, const std::vector<float>& v) {
  ASSIGN_OR_RETURN(common::Tensor t, common::Tensor::Create(common::DType::kF32, spec.shape));
  std::copy(v.begin(), v.end(), t.data<float>().begin());
  return t;
}

std::vector<float> Values(const common::Tensor& t) {
  auto d = t.data<float>();
  return {d.begin(), d.end()};
}

// What the chunk's checkpoint holds: its parameters less a tied copy held with its
// original (model::CheckpointParams).
std::vector<model::ParamSpec> StoredParams(const ModelChunk& chunk) {
  return model::CheckpointParams(chunk.config(), chunk.begin(), chunk.end());
}

// A tensor of `map` for parameter `p`: its own, or for a tied copy the file left out,
// its original's.
const common::Tensor& TensorFor(const model::ParamMap& map, const model::ParamSpec& p) {
  auto it = map.find(p.name);
  return it != map.end() ? it->second : map.at(p.tied_to);
}

model::Checkpoint EmptyCheckpointOf(const ModelChunk& chunk) {
  model::Checkpoint c;
  c.config = chunk.config();
  c.layer_begin = chunk.begin();
  c.layer_end = chunk.end();
  return c;
}

}  // namespace

absl::StatusOr<model::Checkpoint> GradientsOfChunk(const ModelChunk& chunk) {
  model::Checkpoint c = EmptyCheckpointOf(chunk);
  for (const model::ParamSpec& p : StoredParams(chunk)) {
    ASSIGN_OR_RETURN(std::vector<float> g, chunk.GetGrad(p.name));
    ASSIGN_OR_RETURN(c.params[p.name], ToTensor(p, g));
  }
  return c;
}

absl::StatusOr<model::Checkpoint> CheckpointOfChunk(const ModelChunk& chunk, bool with_optimizer) {
  model::Checkpoint c = EmptyCheckpointOf(chunk);
  if (with_optimizer) c.optimizer.emplace().step = chunk.step();
  for (const model::ParamSpec& p : StoredParams(chunk)) {
    ASSIGN_OR_RETURN(std::vector<float> v, chunk.GetParam(p.name));
    ASSIGN_OR_RETURN(c.params[p.name], ToTensor(p, v));
    if (!with_optimizer) continue;
    ASSIGN_OR_RETURN(std::vector<float> m, chunk.GetOptimizerMoment(p.name, false));
    ASSIGN_OR_RETURN(c.optimizer->m[p.name], ToTensor(p, m));
    ASSIGN_OR_RETURN(std::vector<float> s, chunk.GetOptimizerMoment(p.name, true));
    ASSIGN_OR_RETURN(c.optimizer->v[p.name], ToTensor(p, s));
  }
  return c;
}

absl::Status RestoreChunk(const model::Checkpoint& c, ModelChunk& chunk) {
  if (!(c.config == chunk.config()) || c.layer_begin != chunk.begin() ||
      c.layer_end != chunk.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint holds pipeline layers [", c.layer_begin, ", ", c.layer_end,
        ") of its model, this stage layers [", chunk.begin(), ", ", chunk.end(),
        ") of the configured one"));
  }
  RETURN_IF_ERROR(model::ValidateParams(c.config, c.layer_begin, c.layer_end, c.params, "checkpoint"));
  for (const model::ParamSpec& p : chunk.Params()) {
    RETURN_IF_ERROR(chunk.SetParam(p.name, Values(TensorFor(c.params, p))));
    if (!c.optimizer) continue;
    RETURN_IF_ERROR(chunk.SetOptimizerMoment(p.name, false, Values(TensorFor(c.optimizer->m, p))));
    RETURN_IF_ERROR(chunk.SetOptimizerMoment(p.name, true, Values(TensorFor(c.optimizer->v, p))));
  }
  if (c.optimizer) chunk.set_step(static_cast<int>(c.optimizer->step));
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
