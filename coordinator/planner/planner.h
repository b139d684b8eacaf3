// The whole plan of a job: partition the model's layers over the stages, generate and
// lower the schedule, validate it, and predict the step with the simulator from the
// model's analytic costs. The coordinator and `pipetrain plan` both start here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/transformer_config.h"
#include "common/model/precision.h"
#include "common/schedule/stage_program.h"
#include "coordinator/planner/generators.h"
#include "coordinator/planner/partitioner.h"
#include "coordinator/planner/recompute_policy.h"
#include "coordinator/planner/schedule_registry.h"
#include "coordinator/planner/shared_devices.h"
#include "coordinator/planner/simulator.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/schedule.pb.h"

namespace pipetrain::planner {

enum class PartitionMode { kCount, kParams, kCost };
absl::StatusOr<PartitionMode> ParsePartitionMode(absl::string_view name);  // count|params|cost

// Bytes of training state per parameter in the options' precision
// (model::StateBytesPerParam: weight, gradient, AdamW's two moments, the products' bf16
// copy in bf16) and of its in-memory snapshot (model::CheckpointBytesPerParam: no
// gradient, no copy), from common/model/state_bytes.h, as the stages count them.
// With a split optimizer (PlanOptions::splits) the moments count 1/R.
struct PlanOptions;
double StateBytesPerParam(const PlanOptions& o);
double SnapshotBytesPerParam();
// A stage keeps the two newest steps' snapshots (stage_server/snapshots/snapshot_store.h).
inline constexpr int kSnapshotSteps = 2;

// Data-parallel replicas: at most this many copies of the pipeline (pipeline.replicas).
inline constexpr int kMaxReplicas = 1024;
// Bytes of one parameter's gradient as the R copies of a stage all-reduce it.
double GradientBytesPerParam();
struct PlanOptions;
// The bytes figures of the options' precision (fp32's for a name the table lacks, which
// MakePlan refuses).
model::PrecisionBytes PrecisionBytesOf(const PlanOptions& o);
// The fixed cost of one all-reduce call on top of its bytes: the 2(R - 1) hops of a ring
// each pay a TCP round of a few tens of microseconds on a LAN; 100 us in all is gloo's
// order of magnitude for one call, a guess until `pipetrain-bench allreduce` measures it.
inline constexpr double kAllReduceCallLatencyS = 100e-6;

// Seconds a ring all-reduce of `bytes` takes between `replicas` copies at
// `bytes_per_s`: each copy sends and receives 2(R - 1)/R of the bytes (reduce-scatter
// then all-gather), plus kAllReduceCallLatencyS. 0 for one replica (nothing to reduce).
double RingAllReduceSeconds(double bytes, int replicas, double bytes_per_s);

// Seconds a unit of work takes on measured hardware (planner/cost_fit.h fits them from
// a job's timelines): they replace the FLOP and link rates' guess when a plan has them.
struct CostRates {
  double forward_s_per_flop = 0;
  double backward_input_s_per_flop = 0;
  double backward_weight_s_per_flop = 0;
  double optimizer_s_per_param = 0;
  double send_busy_s = 0;  // per send, on the sender
  double recv_busy_s = 0;  // per receive whose tensor was there
  double transfer_s_per_byte = 0;
  int steps = 0;  // how many steps they were measured on
};

struct PlanOptions {
  model::TransformerConfig model;
  int stages = 1;
  int micro_batches = 1;
  int chunks = 1;
  ScheduleKind schedule = kDefaultSchedule;
  pipetrain::v1::RecomputeMode recompute = pipetrain::v1::RECOMPUTE_NEVER;
  int batch_size = 1;  // sequences per mini-batch, all micro-batches of all replicas together
  // R, data-parallel copies of the pipeline; each takes batch_size / R sequences and the
  // R copies of every stage all-reduce its gradients before the optimizer step.
  int replicas = 1;
  // pipeline.shard_optimizer (unset: true): with replicas > 1 the R copies of each stage
  // split AdamW's moments between them (common/model/optimizer_split.h). splits() says
  // whether they do.
  bool shard_optimizer = true;
  // Forward 1, backward 2 time units per stage and free transfer (memory stays real).
  bool equal_stage_cost = false;
  double device_flops = 100e12;    // achieved FLOP/s of one device
  double link_bytes_per_s = 10e9;  // stage-to-stage bandwidth
  // Between the R copies of a stage, for the gradient all-reduce; 0 = link_bytes_per_s.
  double collective_bytes_per_s = 0;
  PartitionMode partition = PartitionMode::kCost;
  double memory_cap_bytes = 0;  // per stage; 0 = unlimited
  std::optional<CostRates> rates;  // measured costs in place of device_flops and the link's
  // In-memory snapshots (checkpoint.snapshot_every_steps > 0): each stage keeps its own
  // and its ring predecessor's, counted in its memory.
  bool snapshots = false;
  // training.precision, a row of common/model/precision.h ("fp32" when not given).
  std::string precision = "fp32";
  // pipeline.schedule_file's compute-only programs (schedule_file.h), checked: MakePlan
  // trusts ParseScheduleFile's validation and does not repeat it. When set they replace
  // the table's generator and `schedule` is not used.
  std::shared_ptr<const schedule::Schedule> schedule_program;
  // The devices the stage servers compute on, where some share one (shared_devices.h);
  // empty: each has a device of its own.
  SharedDevices devices;
  // Per stage server, in the order the runner gives them places (position s of replica
  // r takes server r x K + s), how fast it computes against the rates above (2: twice
  // as fast); empty, or past its end: 1. With partition "cost" the layers are split by
  // each stage's speed (the slowest of its replicas'), and its compute times follow it.
  std::vector<double> server_speed;

  // Sequences one replica takes per step (the whole batch with one replica).
  int replica_batch_size() const { return batch_size / replicas; }
  bool splits() const { return replicas > 1 && shard_optimizer; }
  double collective_rate() const {
    return collective_bytes_per_s > 0 ? collective_bytes_per_s : link_bytes_per_s;
  }
};

// Reads model, pipeline (replicas 0/unset = 1) and training.batch_size from a job spec;
// every error names the field (model.d_model, pipeline.micro_batches,
// pipeline.replicas, training.batch_size, ...). The batch must divide into R x M.
absl::StatusOr<PlanOptions> OptionsFromJobSpec(const pipetrain::v1::JobSpec& spec);

struct StagePlan {
  int stage = 0;
  std::vector<std::pair<int, int>> chunks;  // per chunk: pipeline layers [first, end)
  int64_t params = 0;
  double state_bytes = 0;            // weights, gradients, optimizer state
  // The tables each chunk's layers share (model::ChunkTableBytes: Llama's rotary angles,
  // a pair per chunk holding a block; 0 for GPT-2). Part of its peak memory.
  double table_bytes = 0;
  // With snapshots: 2 steps x 12 bytes/param x (its own params + its ring predecessor's;
  // only its own with one stage). Part of its peak memory.
  double snapshot_bytes = 0;
  double peak_activation_bytes = 0;  // simulated
  int max_in_flight = 0;             // the schedule's bound
  // Per chunk (as `layers`): whether it re-runs its forward before its backward, from
  // recompute_policy.h's rule. Its memory and time here, and the stage's Configure
  // request, follow this list.
  std::vector<bool> chunk_recompute;
  // With R > 1 replicas: the gradient bytes the R copies of this stage all-reduce each
  // step, and the ring all-reduce's predicted time (0 with one replica). The reduction is
  // in place: it adds no memory.
  double allreduce_bytes = 0;
  double allreduce_s = 0;
  // On a device other stage servers of the job share: its name (SharedDevices::names),
  // and how much slower its compute is planned for the other replicas' stages there.
  std::string shared_device;
  double device_slowdown = 1;
  // How fast it computes against the plan's rates (PlanOptions::server_speed).
  double speed = 1;
  double peak_memory_bytes() const {
    return state_bytes + table_bytes + snapshot_bytes + peak_activation_bytes;
  }
  bool recomputes_any() const;
};

// The schedule's placement: the file's, or its row's in the table.
schedule::Placement PlacementOf(const PlanOptions& options);
// "zb-v", or "NAME (pipeline.schedule_file)" for a file whose header names NAME.
std::string ScheduleLabel(const PlanOptions& options);

struct Plan {
  PlanOptions options;
  std::vector<StagePlan> stages;
  schedule::Schedule programs;  // lowered and validated
  CostModel costs;
  SimulationResult simulation;
  double textbook_bubble = 0;
  // Which stage servers share a device (DescribeSharing); "" when none do.
  std::string sharing;

  // Where the schedule put each virtual stage (which stage holds the head, ...).
  schedule::Topology topology() const {
    return {options.stages, options.chunks, PlacementOf(options)};
  }
};

absl::StatusOr<Plan> MakePlan(const PlanOptions& options);

// Per stage position, the speed the plan gives it: the slowest of its R servers'
// (PlanOptions::server_speed), 1 without speeds.
std::vector<double> StageSpeeds(const PlanOptions& options);

}  // namespace pipetrain::planner
