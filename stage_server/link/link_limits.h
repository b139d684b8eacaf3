// The largest tensor a job's peer link may carry, from the job's model, micro-batch and
// precision: an activation or its gradient is (micro_batch_size, seq_len, d_model) in
// the precision's activation dtype (fp32 or bf16), a tied embedding's gradient
// (vocab_size, d_model) fp32. A peer that announces more (even one
// holding the job's peer secret) is refused before anything is allocated, rather than
// at the reassembler's general 2 GiB bound.
#pragma once

#include "common/model/transformer_config.h"
#include "common/tensor_codec.h"

namespace pipetrain::stage_server {

common::ReassemblerOptions LinkLimits(const model::TransformerConfig& model, int micro_batch_size,
                                      common::DType activations = common::DType::kF32);

}  // namespace pipetrain::stage_server
