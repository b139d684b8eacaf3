// What a job's share takes on one stage, part by part (MemoryBreakdown), the limits a
// stage checks it against before it allocates anything (--memory-limit, its host's
// memory), and the byte sizes derived from a chunk's parameters. Pure; every size
// saturates at UINT64_MAX instead of wrapping, a size no limit admits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/state_bytes.h"
#include "stage_server/runtime/device_spec.h"
#include "stage_server/runtime/job_config.h"

namespace pipetrain::stage_server {

struct MemoryBreakdown {
  uint64_t state = 0;        // weights, gradients and AdamW's two moments
  uint64_t tables = 0;       // each chunk's shared tables (model::ChunkTableBytes)
  uint64_t buffers = 0;      // each chunk's micro-batch buffers (BackendChunk's scratch)
  uint64_t activations = 0;  // one micro-batch's activations, every chunk's
  uint64_t reserve = 0;      // in-memory snapshots (field snapshot_reserve_bytes)
  uint64_t links = 0;        // host memory of the peer links (LinkBytes)
  uint64_t Total() const;
};

// Bytes per parameter (weight, moments, state, checkpoint) come from
// common/model/state_bytes.h, which the planner predicts with too.
using model::CheckpointBytesPerParam;
using model::OptimizerBytesPerParam;
using model::StateBytesPerParam;
using model::WeightBytesPerParam;

// The parameters of the config's chunks, in closed form per range (every block has the
// same parameters), clamped to the model's layers: a range of 2^31 layers, unvalidated,
// costs no more to size than one of two (tests/fuzz/configure_fuzz timed out looping).
uint64_t ParamsOf(const JobConfig& config);
// The parameters whose AdamW moments the stage keeps: all of ParamsOf, or with a split
// optimizer (JobConfig::split) at most this copy's piece of every layer.
uint64_t MomentParamsOf(const JobConfig& config);
// ParamsOf x StateBytesPerParam of the job's precision (bf16 adds the products' copy),
// the moments' bytes for MomentParamsOf only.
uint64_t StateBytes(const JobConfig& config);
// The tables the config's chunks' layers share (Llama's rotary angles), each chunk's
// model::ChunkTableBytes, as the planner predicts them.
uint64_t TableBytes(const JobConfig& config);

// What the stage's peer links may hold in host memory, per neighbour: warm buffers for
// received tensors (LinkShm::WarmBufferBytes) and, where the same-host path is on
// (--same-host-transport auto), the shared-memory region for what it sends
// (LinkShm::OwnLayout). The neighbour's region is its memory, counted there.
uint64_t LinkBytes(const JobConfig& config, bool same_host_transport);

// The breakdown of `config` on a stage of this device kind: an emulated one allocates
// no micro-batch buffers (it computes nothing), but sizes the state and the tables it
// emulates.
MemoryBreakdown MemoryOf(const JobConfig& config, DeviceSpec::Kind device,
                         bool same_host_transport);

// A limit and the parts of a breakdown it bounds (the others are 0 in `counted`).
struct MemoryLimit {
  std::string name;  // how messages name it: "--memory-limit", "host memory"
  uint64_t bytes = 0;
  MemoryBreakdown counted;
};

// The limits a stage checks `need` against. --memory-limit (when set) bounds what
// Configure allocates and the snapshot reserve; the planner fits the schedule's
// activations within it. A CPU or emulated stage's host memory (when known) bounds all
// the host allocates, one micro-batch's activations at least; an emulated stage holds
// no state or tables there. A CUDA stage's backend refuses what its GPU cannot hold;
// its --memory-limit (the GPU's) does not count the links' host memory.
std::vector<MemoryLimit> MemoryLimitsOf(const MemoryBreakdown& need, DeviceSpec::Kind device,
                                        uint64_t memory_limit_bytes, uint64_t host_memory_bytes);

// OK, or RESOURCE_EXHAUSTED "configure of job 'ID' stage S: needs N bytes (each counted
// part, naming its field) but this stage has L (NAME); ..." when the parts exceed it.
absl::Status CheckFits(const JobConfig& config, const MemoryLimit& limit);

// The largest a checkpoint of a chunk of `params` parameters can be: its 8-byte length
// prefix, a safetensors header of at most common::kMaxSafetensorsHeaderBytes (what
// every reader refuses beyond), and the parameters' CheckpointBytesPerParam; a file's
// tensors tile its data section, and a chunk's are no more than its parameters.
uint64_t MaxChunkCheckpointBytes(uint64_t params);

}  // namespace pipetrain::stage_server
