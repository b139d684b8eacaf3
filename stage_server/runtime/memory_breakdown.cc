#include "stage_server/runtime/memory_breakdown.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/error_context.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/link/link_shm.h"

namespace pipetrain::stage_server {
namespace {

using common::SaturatingAdd;
using common::SaturatingMul;

// A non-negative double as bytes, rounded up, UINT64_MAX past it.
uint64_t SaturatingBytes(double bytes) {
  if (!(bytes < 18446744073709551616.0)) return UINT64_MAX;  // 2^64; NaN too
  return static_cast<uint64_t>(std::ceil(std::max(bytes, 0.0)));
}

// One micro-batch's activations over every chunk (stored and what a backward adds).
uint64_t ActivationsOfOneMicroBatch(const JobConfig& config) {
  // In double: micro_batch_size x seq_len x bytes per token cannot wrap.
  double bytes = 0;
  for (size_t c = 0; c < config.chunks.size(); ++c) {
    const auto [begin, end] = config.chunks[c];
    const model::ChunkMemory m =
        model::ChunkActivationBytes(config.model, begin, end, config.recomputes(c),
                                    config.precision.products);
    bytes += (m.stored + m.backward_extra) * config.micro_batch_size * config.model.seq_len;
  }
  return SaturatingBytes(bytes);
}

// "N for WHAT" for each part of `counted` that is not 0.
std::vector<std::string> PartsText(const JobConfig& c, const MemoryBreakdown& counted) {
  std::vector<std::string> parts;
  if (counted.state > 0) {
    parts.push_back(absl::StrCat(counted.state, " for weights, gradients and optimizer state"));
  }
  if (counted.tables > 0) {
    parts.push_back(absl::StrCat(counted.tables,
                                 " for the layers' shared tables (rotary angles, field "
                                 "model.seq_len ",
                                 c.model.seq_len, ")"));
  }
  if (counted.buffers > 0) {
    parts.push_back(absl::StrCat(counted.buffers,
                                 " for micro-batch buffers (field micro_batch_size ",
                                 c.micro_batch_size, ")"));
  }
  if (counted.activations > 0) {
    parts.push_back(absl::StrCat(counted.activations,
                                 " for the activations of one micro-batch (field "
                                 "micro_batch_size ",
                                 c.micro_batch_size, ", rows of ", c.model.seq_len, " tokens)"));
  }
  if (counted.reserve > 0) {
    parts.push_back(absl::StrCat(counted.reserve,
                                 " for in-memory snapshots (field snapshot_reserve_bytes)"));
  }
  if (counted.links > 0) {
    parts.push_back(absl::StrCat(counted.links,
                                 " for the peer links' buffers and shared memory (field "
                                 "micro_batch_size ",
                                 c.micro_batch_size, "; pipetrain-stage --same-host-transport)"));
  }
  return parts;
}

}  // namespace

uint64_t MemoryBreakdown::Total() const {
  return SaturatingAdd(SaturatingAdd(SaturatingAdd(state, tables), buffers),
                       SaturatingAdd(SaturatingAdd(activations, reserve), links));
}

uint64_t ParamsOf(const JobConfig& config) {
  const model::TransformerConfig& m = config.model;
  const int64_t head = m.num_pipeline_layers() - 1;  // embedding 0, blocks 1 .. head-1
  if (head < 1) return 0;
  const uint64_t block = head > 1 ? static_cast<uint64_t>(model::ParamsOfLayer(m, 1)) : 0;
  uint64_t params = 0;
  for (const auto& [begin, end] : config.chunks) {
    const int64_t b = std::max<int64_t>(begin, 0), e = std::min<int64_t>(end, head + 1);
    if (b >= e) continue;
    if (b == 0) params = SaturatingAdd(params, static_cast<uint64_t>(model::ParamsOfLayer(m, 0)));
    if (e == head + 1) {
      params = SaturatingAdd(params, static_cast<uint64_t>(model::ParamsOfLayer(m, head)));
    }
    const int64_t blocks = std::min<int64_t>(e, head) - std::max<int64_t>(b, 1);
    if (blocks > 0) {
      params = SaturatingAdd(params, SaturatingMul(static_cast<uint64_t>(blocks), block));
    }
  }
  return params;
}

uint64_t MomentParamsOf(const JobConfig& config) {
  const uint64_t params = ParamsOf(config);
  const compute::OptimizerSplit split = config.split();
  if (split.copies <= 1) return params;
  // Each layer's piece is at most one more than its share (RangeOfCopy): a bound of one
  // per layer held, clamped as ParamsOf clamps the ranges.
  uint64_t layers = 0;
  const int64_t count = config.model.num_pipeline_layers();
  for (const auto& [begin, end] : config.chunks) {
    const int64_t b = std::max<int64_t>(begin, 0), e = std::min<int64_t>(end, count);
    if (b < e) layers = SaturatingAdd(layers, static_cast<uint64_t>(e - b));
  }
  return std::min(params, SaturatingAdd(params / static_cast<uint64_t>(split.copies), layers));
}

uint64_t StateBytes(const JobConfig& config) {
  const uint64_t params = ParamsOf(config);
  const uint64_t moments = MomentParamsOf(config);
  const uint64_t per_param = StateBytesPerParam(config.precision.products) - OptimizerBytesPerParam();
  return SaturatingAdd(SaturatingMul(params, per_param),
                       SaturatingMul(moments, OptimizerBytesPerParam()));
}

uint64_t TableBytes(const JobConfig& config) {
  uint64_t bytes = 0;
  for (const auto& [begin, end] : config.chunks) {
    bytes = SaturatingAdd(bytes, model::ChunkTableBytes(config.model, begin, end));
  }
  return bytes;
}

uint64_t LinkBytes(const JobConfig& config, bool same_host_transport) {
  const StageLinks links = LinksOf(config);
  const int neighbours = (links.prev ? 1 : 0) + (links.next ? 1 : 0);
  const uint64_t largest = DownstreamLinkOptions(config).limits.max_tensor_bytes;
  uint64_t per_link = LinkShm::WarmBufferBytes(largest);
  if (same_host_transport) {
    per_link = SaturatingAdd(per_link, LinkShm::OwnLayout(largest).payload_bytes());
  }
  return SaturatingMul(static_cast<uint64_t>(neighbours), per_link);
}

MemoryBreakdown MemoryOf(const JobConfig& config, DeviceSpec::Kind device,
                         bool same_host_transport) {
  MemoryBreakdown need;
  need.state = StateBytes(config);
  need.tables = TableBytes(config);
  // A real backend allocates each chunk's micro-batch buffers at configure; they grow
  // with micro_batch_size, which the request sets (found by tests/fuzz/configure_fuzz:
  // a 16 MiB stage allocated 6 GB).
  if (device != DeviceSpec::Kind::kEmulated) {
    for (const auto& [begin, end] : config.chunks) {
      need.buffers = SaturatingAdd(
          need.buffers,
          BackendChunk::BufferBytes(config.model, begin, end, config.micro_batch_size));
    }
  }
  need.activations = ActivationsOfOneMicroBatch(config);
  need.reserve = config.snapshot_reserve_bytes;
  need.links = LinkBytes(config, same_host_transport);
  return need;
}

std::vector<MemoryLimit> MemoryLimitsOf(const MemoryBreakdown& need, DeviceSpec::Kind device,
                                        uint64_t memory_limit_bytes, uint64_t host_memory_bytes) {
  std::vector<MemoryLimit> limits;
  if (memory_limit_bytes > 0) {
    MemoryBreakdown counted = need;
    counted.activations = 0;
    if (device == DeviceSpec::Kind::kCuda) counted.links = 0;  // host memory, not the GPU's
    limits.push_back({"--memory-limit", memory_limit_bytes, counted});
  }
  if (device != DeviceSpec::Kind::kCuda && host_memory_bytes > 0) {
    MemoryBreakdown counted = need;
    if (device == DeviceSpec::Kind::kEmulated) counted.state = counted.tables = 0;
    limits.push_back({"the host's memory", host_memory_bytes, counted});
  }
  return limits;
}

absl::Status CheckFits(const JobConfig& config, const MemoryLimit& limit) {
  const uint64_t total = limit.counted.Total();
  if (total <= limit.bytes) return absl::OkStatus();
  return common::ErrorContext("configure")
      .Job(config.job_id)
      .Stage(config.stage)
      .Error(absl::StatusCode::kResourceExhausted,
             absl::StrCat("needs ", total, " bytes (",
                          absl::StrJoin(PartsText(config, limit.counted), ", "),
                          ") but this stage has ", limit.bytes, " (", limit.name,
                          "); use more stages, smaller micro-batches or a smaller model",
                          limit.counted.reserve > 0
                              ? ", or turn snapshots off (checkpoint.snapshot_every_steps 0)"
                              : ""));
}

uint64_t MaxChunkCheckpointBytes(uint64_t params) {
  constexpr uint64_t kLengthPrefixBytes = sizeof(uint64_t);
  return SaturatingAdd(kLengthPrefixBytes + common::kMaxSafetensorsHeaderBytes,
                       SaturatingMul(params, CheckpointBytesPerParam()));
}

}  // namespace pipetrain::stage_server
