// AdamW's settings, the one type every path uses (ModelChunk::OptimizerStep, the
// trainer and `pipetrain train-local`, a stage's executor), with its defaults here and
// nowhere else. The job spec's user-facing defaults stay with the job spec
// (coordinator/spec/job_spec_validate.cc); a stage takes the ones below for a field its
// ConfigureRequest leaves 0.
#pragma once

namespace pipetrain::compute {

// OptimizerSettings{} is torch.optim.AdamW's defaults, as the single-process trainer
// (`pipetrain train-local`, the reference the tests build on it) uses them.
struct OptimizerSettings {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  // Decoupled weight decay, applied to matrices only (model::ParamSpec::is_matrix).
  float weight_decay = 0.0f;
  // Clip the gradients to this global L2 norm (as torch.nn.utils.clip_grad_norm_);
  // 0 = off.
  float grad_clip_norm = 0.0f;
};

// A stage's: beta2 0.95 as GPT-2/3 were trained, and as the job spec's default. What a
// configured stage uses before its ConfigureRequest sets anything, and for each of
// beta1, beta2 and eps the request leaves 0 (proto3 has no unset; 0 is no sensible
// value for them).
inline constexpr OptimizerSettings kStageOptimizerDefaults{.beta2 = 0.95f};

// Which piece of every layer's parameters this copy of a stage steps when the R copies
// of the stage split the optimizer (model::RangeOfCopy of the layer's parameters);
// the default, one copy, steps all of them.
struct OptimizerSplit {
  int copies = 1;
  int copy = 0;
};

}  // namespace pipetrain::compute
