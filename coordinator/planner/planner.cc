#include "coordinator/planner/planner.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/precision.h"
#include "common/model/state_bytes.h"
#include "common/schedule/validator.h"
#include "common/status_macros.h"
#include "coordinator/planner/lowering.h"
#include "coordinator/planner/schedule_file.h"

namespace pipetrain::planner {

double StateBytesPerParam(const PlanOptions& o) {
  const double whole = static_cast<double>(PrecisionBytesOf(o).per_parameter);
  if (!o.splits()) return whole;
  // Only the moments divide (model::SplitStateBytesPerParam says why).
  const auto moments = static_cast<double>(model::OptimizerBytesPerParam());
  return whole - moments + moments / o.replicas;
}
double SnapshotBytesPerParam() { return static_cast<double>(model::CheckpointBytesPerParam()); }
double GradientBytesPerParam() { return static_cast<double>(model::GradientBytesPerParam()); }

model::PrecisionBytes PrecisionBytesOf(const PlanOptions& o) {
  const absl::StatusOr<model::Precision> p = model::PrecisionNamed(o.precision);
  return model::BytesOf(p.ok() ? *p : model::PrecisionTable().front());
}

namespace {
// The products' operand dtype of the options' precision (fp32's for an unknown name).
common::DType ProductsOf(const PlanOptions& o) {
  const absl::StatusOr<model::Precision> p = model::PrecisionNamed(o.precision);
  return (p.ok() ? *p : model::PrecisionTable().front()).products;
}
}  // namespace

namespace {

namespace pb = ::pipetrain::v1;

// Per-layer partition weights for the chosen mode.
std::vector<double> LayerWeights(const PlanOptions& o) {
  std::vector<double> w;
  for (int l = 0; l < o.model.num_pipeline_layers(); ++l) {
    const model::LayerCost c = model::CostOfLayer(o.model, l);
    switch (o.partition) {
      case PartitionMode::kCount:
        w.push_back(1);
        break;
      case PartitionMode::kParams:
        w.push_back(static_cast<double>(c.params));
        break;
      case PartitionMode::kCost:
        w.push_back(c.forward_flops + c.backward_input_flops + c.backward_weight_flops);
        break;
    }
  }
  return w;
}

absl::Status CheckBatchSize(int batch_size) {
  if (batch_size >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("training.batch_size must be >= 1 (got ", batch_size, ")"));
}

// pipeline.replicas in [1, kMaxReplicas], and the batch cut into R shares of M
// micro-batches each.
absl::Status CheckReplicaSplit(const PlanOptions& o) {
  if (o.replicas < 1 || o.replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.replicas: must be in [1, ", kMaxReplicas, "] (got ", o.replicas,
        "); it is the number of data-parallel copies of the pipeline, 1 for none"));
  }
  if (o.replicas == 1 && o.batch_size % o.micro_batches != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.batch_size: ", o.batch_size, " is not divisible by pipeline.micro_batches ",
        o.micro_batches, "; each micro-batch takes batch_size / micro_batches sequences"));
  }
  const int64_t split = int64_t{o.replicas} * o.micro_batches;
  if (o.batch_size % split != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.batch_size: ", o.batch_size, " is not divisible by pipeline.replicas ",
        o.replicas, " x pipeline.micro_batches ", o.micro_batches, " = ", split,
        "; each replica takes batch_size / replicas sequences in micro_batches micro-batches"));
  }
  return absl::OkStatus();
}

// A schedule file's shape is the job's (a flag of `pipetrain plan` may have changed the
// job's since the file was read), or the table's rules for (K, M, v).
absl::Status CheckScheduleShape(const PlanOptions& o) {
  if (!o.schedule_program) return CheckShape(o.schedule, o.stages, o.micro_batches, o.chunks);
  const schedule::StageProgram& header = o.schedule_program->front();
  if (header.num_stages == o.stages && header.num_micro_batches == o.micro_batches &&
      header.num_chunks == o.chunks && static_cast<int>(o.schedule_program->size()) == o.stages) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "pipeline.schedule_file: the file is for K=", header.num_stages, " M=",
      header.num_micro_batches, " v=", header.num_chunks, ", the job has K=", o.stages, " M=",
      o.micro_batches, " v=", o.chunks));
}

// The stage's in-flight bound: the file's declaration, or its row's.
int BoundOf(const PlanOptions& o, int s) {
  if (o.schedule_program) return (*o.schedule_program)[s].max_in_flight;
  return InFlightBound(o.schedule, o.stages, o.micro_batches, o.chunks, s);
}

// Everything MakePlan needs of its options before it plans.
absl::Status CheckPlanOptions(const PlanOptions& o) {
  RETURN_IF_ERROR(model::ValidateConfig(o.model));
  RETURN_IF_ERROR(CheckScheduleShape(o));
  RETURN_IF_ERROR(CheckBatchSize(o.batch_size));
  RETURN_IF_ERROR(CheckReplicaSplit(o));
  RETURN_IF_ERROR(CheckSharedDevices(o.devices));
  for (size_t i = 0; i < o.server_speed.size(); ++i) {
    if (!(o.server_speed[i] > 0 && std::isfinite(o.server_speed[i]))) {
      return absl::InvalidArgumentError(absl::StrCat("stage server ", i, " has speed ",
                                                     o.server_speed[i], "; it must be > 0"));
    }
  }
  if (absl::Status p = model::PrecisionNamed(o.precision).status(); !p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("training.precision: ", p.message()));
  }
  const int parts = o.stages * o.chunks, layers = o.model.num_pipeline_layers();
  if (parts > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.stages", o.chunks > 1 ? " x pipeline.chunks" : "", " (", parts,
                     ") is more than the model's ", layers, " pipeline layers (embedding, ",
                     o.model.n_layers, " blocks, head): every stage needs at least one layer"));
  }
  return absl::OkStatus();
}

// Whether every chunk of every stage recomputes.
bool Everywhere(const std::vector<std::vector<bool>>& recompute) {
  for (const std::vector<bool>& stage : recompute) {
    for (bool chunk : stage) {
      if (!chunk) return false;
    }
  }
  return true;
}

// The layers split over the K x v virtual stages. The memory cap is enforced inside the
// split for plain pipelines (one part per stage) and checked on the simulated figures
// afterwards.
absl::StatusOr<Partition> PartitionLayers(const PlanOptions& o,
                                          const std::vector<model::LayerCost>& cost, double tokens,
                                          bool recompute_everywhere) {
  const int parts = o.stages * o.chunks, layers = o.model.num_pipeline_layers();
  if (o.partition == PartitionMode::kCount) return PartitionByCount(layers, parts);
  // The time a part takes on its stage: layers by cost over the stage's speed.
  std::vector<double> part_speed;
  const std::vector<double> stage_speed = StageSpeeds(o);
  const Placement placement = PlacementOf(o);
  for (int j = 0; j < parts; ++j) {
    part_speed.push_back(stage_speed[Place(placement, j, o.stages).stage]);
  }
  const std::vector<double>* speed = o.partition == PartitionMode::kCost ? &part_speed : nullptr;
  if (o.memory_cap_bytes <= 0 || o.chunks != 1) {
    return PartitionByCost(LayerWeights(o), parts, nullptr, speed);
  }
  MemoryLimit limit;
  // A stage's own snapshots count here; its predecessor's copy depends on the other
  // part's split, so it is checked on the whole plan.
  const double per_param =
      StateBytesPerParam(o) + (o.snapshots ? kSnapshotSteps * SnapshotBytesPerParam() : 0);
  for (const model::LayerCost& c : cost) {
    limit.weight_bytes.push_back(per_param * c.params);
    limit.activation_bytes.push_back(
        (recompute_everywhere ? c.activation_bytes_recompute : c.activation_bytes) * tokens);
  }
  for (int s = 0; s < o.stages; ++s)
    limit.in_flight.push_back(BoundOf(o, s));
  limit.cap_bytes = o.memory_cap_bytes;
  limit.chunk_bytes = [&o](int begin, int end) {
    return static_cast<double>(model::ChunkTableBytes(o.model, begin, end));
  };
  absl::StatusOr<Partition> capped = PartitionByCost(LayerWeights(o), parts, &limit, speed);
  if (!capped.ok() && o.snapshots) {
    return absl::Status(capped.status().code(),
                        absl::StrCat(capped.status().message(), " (with in-memory snapshots, ",
                                     kSnapshotSteps * SnapshotBytesPerParam(),
                                     " bytes per parameter more; "
                                     "checkpoint.snapshot_every_steps 0 turns them off)"));
  }
  return capped;
}

// Where a plan's compute and link times come from: the FLOP and link rates of the
// options (the analytic guess), rates measured on a job's steps, or one unit a forward
// and two a backward (the textbook formulas' setting, equal_stage_cost).
enum class TimeSource { kFlopRates, kMeasuredRates, kEqualUnits };

TimeSource TimeSourceOf(const PlanOptions& o) {
  if (o.equal_stage_cost) return TimeSource::kEqualUnits;
  return o.rates ? TimeSource::kMeasuredRates : TimeSource::kFlopRates;
}

// What layers [b, e) do per micro-batch of `tokens` tokens: FLOPs per kind of action, and
// the bytes its output and its input gradient put on the wire in the plan's precision
// (the layer costs' output_bytes are fp32's).
struct ChunkWork {
  double forward_flops = 0, backward_input_flops = 0, backward_weight_flops = 0;
  double activation_bytes = 0;  // sent downstream
  double gradient_bytes = 0;    // sent upstream
  bool upstream = false;        // the chunk has a layer before it (b > 0)
};

ChunkWork WorkOf(const PlanOptions& o, const std::vector<model::LayerCost>& cost, int b, int e,
                 double tokens) {
  const double wire = static_cast<double>(PrecisionBytesOf(o).activation_wire) /
                      static_cast<double>(common::DTypeSize(common::DType::kF32));
  ChunkWork w;
  for (int l = b; l < e; ++l) {
    w.forward_flops += cost[l].forward_flops * tokens;
    w.backward_input_flops += cost[l].backward_input_flops * tokens;
    w.backward_weight_flops += cost[l].backward_weight_flops * tokens;
  }
  w.activation_bytes = cost[e - 1].output_bytes * wire * tokens;
  w.upstream = b > 0;
  if (w.upstream) w.gradient_bytes = cost[b - 1].output_bytes * wire * tokens;
  return w;
}

// Times from the options' device FLOP rate and link bandwidth, layer by layer.
void TimesFromFlopRates(const PlanOptions& o, const std::vector<model::LayerCost>& cost, int b,
                        int e, double tokens, const ChunkWork& w, ChunkCost& cc) {
  for (int l = b; l < e; ++l) {
    cc.forward_s += cost[l].forward_flops * tokens / o.device_flops;
    cc.backward_input_s += cost[l].backward_input_flops * tokens / o.device_flops;
    cc.backward_weight_s += cost[l].backward_weight_flops * tokens / o.device_flops;
  }
  cc.send_activation_s = w.activation_bytes / o.link_bytes_per_s;
  cc.send_gradient_s = w.upstream ? w.gradient_bytes / o.link_bytes_per_s : 0;
}

// Times from the rates measured on a job's steps, with what a send and a receive cost
// the stage itself.
void TimesFromMeasuredRates(const CostRates& r, const ChunkWork& w, ChunkCost& cc) {
  cc.forward_s = w.forward_flops * r.forward_s_per_flop;
  cc.backward_input_s = w.backward_input_flops * r.backward_input_s_per_flop;
  cc.backward_weight_s = w.backward_weight_flops * r.backward_weight_s_per_flop;
  cc.send_activation_s = w.activation_bytes * r.transfer_s_per_byte;
  cc.send_gradient_s = w.upstream ? w.gradient_bytes * r.transfer_s_per_byte : 0;
  cc.send_busy_s = r.send_busy_s;
  cc.recv_busy_s = r.recv_busy_s;
}

// What layers [b, e) cost one replica's stage per micro-batch of `tokens` tokens, under
// the plan's source of times; the memory figures are the same under each.
ChunkCost CostOfChunk(const PlanOptions& o, const std::vector<model::LayerCost>& cost, int b,
                      int e, bool recompute, double tokens) {
  ChunkCost cc;
  const model::ChunkMemory memory =
      model::ChunkActivationBytes(o.model, b, e, recompute, ProductsOf(o));
  cc.stored_bytes = memory.stored * tokens;
  cc.backward_extra_bytes = memory.backward_extra * tokens;
  cc.weight_grad_bytes = memory.weight_grad * tokens;
  switch (TimeSourceOf(o)) {
    case TimeSource::kFlopRates:
      TimesFromFlopRates(o, cost, b, e, tokens, WorkOf(o, cost, b, e, tokens), cc);
      break;
    case TimeSource::kMeasuredRates:
      TimesFromMeasuredRates(*o.rates, WorkOf(o, cost, b, e, tokens), cc);
      break;
    case TimeSource::kEqualUnits: {
      // Free transfer and no recompute in the formulas' setting.
      const ChunkCost unit = EqualStageCost(1, o.chunks).chunks[0][0];
      cc.forward_s = unit.forward_s;
      cc.backward_input_s = unit.backward_input_s;
      cc.backward_weight_s = unit.backward_weight_s;
      return cc;
    }
  }
  if (recompute) cc.recompute_s = cc.forward_s;
  return cc;
}

// Every stage's layers, parameters, bound and per-chunk recomputation, and each chunk's
// costs, from the partition placed by the schedule's placement.
void PlaceChunks(const PlanOptions& o, const Partition& partition,
                 const std::vector<model::LayerCost>& cost, double tokens,
                 const std::vector<std::vector<bool>>& recompute, Plan& plan) {
  const int k = o.stages, v = o.chunks;
  const Placement placement = PlacementOf(o);
  plan.costs.chunks.assign(k, std::vector<ChunkCost>(v));
  plan.stages.resize(k);
  for (int j = 0; j < k * v; ++j) {
    const auto [s, c] = Place(placement, j, k);
    const int b = partition.begin(j), e = partition.end(j);
    StagePlan& sp = plan.stages[s];
    sp.stage = s;
    sp.chunks.push_back({b, e});
    sp.chunk_recompute.push_back(recompute[s][c]);
    sp.max_in_flight = BoundOf(o, s);
    for (int l = b; l < e; ++l) sp.params += cost[l].params;
    sp.table_bytes += static_cast<double>(model::ChunkTableBytes(o.model, b, e));
    plan.costs.chunks[s][c] = CostOfChunk(o, cost, b, e, recompute[s][c], tokens);
  }
}

// State, all-reduce, snapshot and optimizer figures of every stage, from its parameters.
void AddStageFigures(const PlanOptions& o, Plan& plan) {
  const int k = o.stages;
  for (StagePlan& sp : plan.stages) {
    sp.state_bytes = StateBytesPerParam(o) * sp.params;
    // Free transfer in the formulas' setting, as for the stage links: the bytes stay real.
    if (o.replicas > 1) {
      sp.allreduce_bytes = GradientBytesPerParam() * static_cast<double>(sp.params);
    }
    if (o.replicas > 1 && TimeSourceOf(o) != TimeSource::kEqualUnits) {
      sp.allreduce_s = RingAllReduceSeconds(sp.allreduce_bytes, o.replicas, o.collective_rate());
      plan.costs.allreduce_stage_s.resize(k, 0);
      plan.costs.allreduce_stage_s[sp.stage] = sp.allreduce_s;
    }
  }
  if (o.snapshots) {
    for (int s = 0; s < k; ++s) {
      // The ring predecessor's copy; one stage whose copies split the optimizer holds
      // the previous copy's instead (the same stage's parameters).
      const int64_t held = k > 1 || o.splits() ? plan.stages[(s + k - 1) % k].params : 0;
      plan.stages[s].snapshot_bytes =
          kSnapshotSteps * SnapshotBytesPerParam() * static_cast<double>(plan.stages[s].params + held);
    }
  }
  if (TimeSourceOf(o) == TimeSource::kMeasuredRates) {
    for (const StagePlan& sp : plan.stages) {
      plan.costs.optimizer_stage_s.push_back(static_cast<double>(sp.params) *
                                             o.rates->optimizer_s_per_param);
    }
  }
}

// A stage's compute times (forward, backward, recompute, optimizer step) times `factor`.
void ScaleCompute(Plan& plan, int s, double factor) {
  if (factor == 1) return;
  for (ChunkCost& c : plan.costs.chunks[s]) {
    c.forward_s *= factor;
    c.backward_input_s *= factor;
    c.backward_weight_s *= factor;
    c.recompute_s *= factor;
  }
  if (plan.costs.optimizer_stage_s.empty() && plan.costs.optimizer_s > 0) {
    plan.costs.optimizer_stage_s.assign(plan.stages.size(), plan.costs.optimizer_s);
  }
  if (!plan.costs.optimizer_stage_s.empty()) plan.costs.optimizer_stage_s[s] *= factor;
}

// Stages that share a device take turns on it, and the replicas' stages on one device
// slow each other: the simulator's devices, and the stages' compute times scaled.
void ShareDevices(const PlanOptions& o, Plan& plan) {
  if (o.devices.empty()) return;
  const ReplicaDevices rd = ForReplica(o.devices, o.stages, o.replicas);
  plan.costs.device_of_stage = rd.device_of_stage;
  plan.costs.device_slots = rd.slots;
  plan.sharing = DescribeSharing(o.devices, o.stages, o.replicas);
  for (int s = 0; s < o.stages; ++s) {
    const double slow = rd.slowdown[s];
    StagePlan& sp = plan.stages[s];
    sp.shared_device = rd.shared_name[rd.device_of_stage[s]];
    sp.device_slowdown = slow;
    ScaleCompute(plan, s, slow);
  }
}

// Each stage computes at its speed (PlanOptions::server_speed).
void ApplySpeeds(const PlanOptions& o, Plan& plan) {
  if (o.server_speed.empty()) return;
  const std::vector<double> speed = StageSpeeds(o);
  for (int s = 0; s < o.stages; ++s) {
    plan.stages[s].speed = speed[s];
    ScaleCompute(plan, s, 1.0 / speed[s]);
  }
}

// The simulated peak activations into each stage, refused when a stage passes the cap.
absl::Status AddPeaksWithinCap(const PlanOptions& o, Plan& plan) {
  for (int s = 0; s < o.stages; ++s) {
    StagePlan& sp = plan.stages[s];
    sp.peak_activation_bytes = plan.simulation.peak_activation_bytes[s];
    const double total = sp.peak_memory_bytes();
    if (o.memory_cap_bytes > 0 && total > o.memory_cap_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the model does not fit: stage %d needs %.2f GiB (%.2f GiB weights and optimizer "
          "state, %s%.2f GiB activations%s) but has %.2f GiB",
          s, total / (1 << 30), sp.state_bytes / (1 << 30),
          sp.table_bytes > 0
              ? absl::StrFormat("%.2f GiB shared tables, ", sp.table_bytes / (1 << 30))
              : "",
          sp.peak_activation_bytes / (1 << 30),
          o.snapshots ? absl::StrFormat(", %.2f GiB in-memory snapshots (turn them off with "
                                        "checkpoint.snapshot_every_steps 0)",
                                        sp.snapshot_bytes / (1 << 30))
                      : "",
          o.memory_cap_bytes / (1 << 30)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool StagePlan::recomputes_any() const {
  for (bool chunk : chunk_recompute) {
    if (chunk) return true;
  }
  return false;
}

double RingAllReduceSeconds(double bytes, int replicas, double bytes_per_s) {
  if (replicas <= 1) return 0;
  return kAllReduceCallLatencyS + 2.0 * (replicas - 1) / replicas * bytes / bytes_per_s;
}

absl::StatusOr<PartitionMode> ParsePartitionMode(absl::string_view name) {
  if (name == "count") return PartitionMode::kCount;
  if (name == "params") return PartitionMode::kParams;
  if (name == "cost") return PartitionMode::kCost;
  return absl::InvalidArgumentError(
      absl::StrCat("partition: unknown mode '", name, "' (expected count, params or cost)"));
}

namespace {

// pipeline.schedule's row, or pipeline.schedule_file's programs (one of the two), and
// the pipeline's shape checked against it.
absl::Status ReadSchedule(const pb::PipelineSpec& p, PlanOptions& o) {
  const bool file = !p.schedule_file().empty() || !p.schedule_program().empty();
  if (file && !p.schedule().empty()) {
    return absl::InvalidArgumentError(
        "pipeline.schedule and pipeline.schedule_file: give one (the file's programs are the "
        "schedule)");
  }
  if (!file) {
    if (p.schedule().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline.schedule: missing (expected ", ScheduleNameList(), ")"));
    }
    ASSIGN_OR_RETURN(o.schedule, ParseScheduleKind(p.schedule()));
    return CheckShape(o.schedule, o.stages, o.micro_batches, o.chunks);
  }
  if (p.schedule_program().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.schedule_file: '", p.schedule_file(),
        "' was not read: `pipetrain submit` and `pipetrain plan` read it into "
        "pipeline.schedule_program, which the coordinator plans (it reads no such path)"));
  }
  ASSIGN_OR_RETURN(const schedule::StageProgram header, ScheduleFileHeader(p.schedule_program()));
  if (p.chunks() == 0) o.chunks = header.num_chunks;
  ASSIGN_OR_RETURN(schedule::Schedule programs,
                   ParseScheduleFile(p.schedule_program(), o.stages, o.micro_batches, o.chunks));
  o.schedule_program = std::make_shared<const schedule::Schedule>(std::move(programs));
  return absl::OkStatus();
}

}  // namespace

schedule::Placement PlacementOf(const PlanOptions& o) {
  return o.schedule_program ? o.schedule_program->front().placement : EntryOf(o.schedule).placement;
}

std::string ScheduleLabel(const PlanOptions& o) {
  if (!o.schedule_program) return ScheduleName(o.schedule);
  const std::string& name = o.schedule_program->front().schedule;
  return absl::StrCat(name.empty() ? "-" : name, " (pipeline.schedule_file)");
}

absl::StatusOr<PlanOptions> OptionsFromJobSpec(const pb::JobSpec& spec) {
  PlanOptions o;
  if (!spec.has_model()) return absl::InvalidArgumentError("model: missing");
  ASSIGN_OR_RETURN(o.model, model::ConfigFromProto(spec.model()));
  const pb::PipelineSpec& p = spec.pipeline();
  o.stages = p.stages();
  o.micro_batches = p.micro_batches();
  o.chunks = p.chunks() == 0 ? 1 : p.chunks();
  RETURN_IF_ERROR(ReadSchedule(p, o));
  ASSIGN_OR_RETURN(o.recompute, ParseRecompute(p.recompute()));
  o.batch_size = spec.training().batch_size();
  RETURN_IF_ERROR(CheckBatchSize(o.batch_size));
  o.replicas = p.replicas() == 0 ? 1 : p.replicas();
  o.shard_optimizer = !p.has_shard_optimizer() || p.shard_optimizer();
  RETURN_IF_ERROR(CheckReplicaSplit(o));
  o.snapshots = spec.checkpoint().snapshot_every_steps() > 0;
  absl::StatusOr<model::Precision> precision = model::PrecisionNamed(spec.training().precision());
  if (!precision.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.precision: ", precision.status().message()));
  }
  o.precision = std::string(precision->name);
  return o;
}

std::vector<double> StageSpeeds(const PlanOptions& o) {
  std::vector<double> speed(o.stages, 1.0);
  if (o.server_speed.empty()) return speed;
  for (int s = 0; s < o.stages; ++s) {
    for (int r = 0; r < o.replicas; ++r) {
      const size_t i = static_cast<size_t>(r) * o.stages + s;
      const double v = i < o.server_speed.size() ? o.server_speed[i] : 1.0;
      speed[s] = r == 0 ? v : std::min(speed[s], v);
    }
  }
  return speed;
}

absl::StatusOr<Plan> MakePlan(const PlanOptions& o) {
  RETURN_IF_ERROR(CheckPlanOptions(o));
  const int k = o.stages, v = o.chunks;
  // What one replica's stage computes per micro-batch: its share of the global batch.
  const double tokens =
      static_cast<double>(o.replica_batch_size() / o.micro_batches) * o.model.seq_len;
  std::vector<model::LayerCost> cost(o.model.num_pipeline_layers());
  for (int l = 0; l < static_cast<int>(cost.size()); ++l) {
    cost[l] = model::CostOfLayer(o.model, l, ProductsOf(o));
  }
  const std::vector<std::vector<bool>> recompute = ResolveRecompute(o.recompute, k, v);
  ASSIGN_OR_RETURN(const Partition partition,
                   PartitionLayers(o, cost, tokens, Everywhere(recompute)));

  Plan plan;
  plan.options = o;
  PlaceChunks(o, partition, cost, tokens, recompute, plan);
  AddStageFigures(o, plan);
  ApplySpeeds(o, plan);
  ShareDevices(o, plan);
  if (o.schedule_program) {
    // ParseScheduleFile validated the file's programs, before and after lowering.
    plan.programs = Lower(*o.schedule_program);
  } else {
    ASSIGN_OR_RETURN(const schedule::Schedule compute_only,
                     Generate(o.schedule, k, o.micro_batches, v));
    RETURN_IF_ERROR(schedule::Validate(compute_only, {.lowered = false}));
    plan.programs = Lower(compute_only);
    RETURN_IF_ERROR(schedule::Validate(plan.programs));
  }
  ASSIGN_OR_RETURN(plan.simulation, Simulate(plan.programs, plan.costs));
  RETURN_IF_ERROR(AddPeaksWithinCap(o, plan));
  // A file's schedule has no formula.
  plan.textbook_bubble = o.schedule_program ? 0 : TextbookBubble(o.schedule, k, o.micro_batches, v);
  return plan;
}

}  // namespace pipetrain::planner
