#include "tests/testing/fake_stages.h"

#include <algorithm>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/transformer_config.h"
#include "common/status_macros.h"
#include "coordinator/spec/job_spec.h"

namespace pipetrain::testing {

namespace pb = ::pipetrain::v1;

namespace {

// A tensor of `shape` (its values do not matter to the tests).
absl::StatusOr<model::ParamMap> Tensors(const std::vector<model::ParamSpec>& specs) {
  model::ParamMap out;
  for (const model::ParamSpec& p : specs) {
    ASSIGN_OR_RETURN(common::Tensor t, common::Tensor::Create(common::DType::kF32, p.shape));
    // Zeros: every replica's fake chunk holds the same state, as real replicas do.
    std::fill(t.bytes().begin(), t.bytes().end(), std::byte{0});
    out.emplace(p.name, std::move(t));
  }
  return out;
}

// A fresh chunk of layers [begin, end): weights and AdamW state of 0 updates.
absl::StatusOr<model::Checkpoint> FreshChunk(const model::TransformerConfig& config, int begin,
                                             int end) {
  model::Checkpoint c;
  c.config = config;
  c.layer_begin = begin;
  c.layer_end = end;
  const std::vector<model::ParamSpec> specs = model::CheckpointParams(config, begin, end);
  ASSIGN_OR_RETURN(c.params, Tensors(specs));
  model::AdamWState adam;
  ASSIGN_OR_RETURN(adam.m, Tensors(specs));
  ASSIGN_OR_RETURN(adam.v, Tensors(specs));
  c.optimizer = std::move(adam);
  return c;
}

bool IsCommunication(pb::ActionKind kind) {
  return kind == pb::SEND_ACTIVATION || kind == pb::RECV_ACTIVATION ||
         kind == pb::SEND_GRADIENT || kind == pb::RECV_GRADIENT;
}

// One timing per action of the program, 100 us apart, each 50 us long.
void AddTimings(const pb::StageProgram& program, pb::RunStepResponse& response) {
  int64_t at = 0;
  for (const pb::Action& a : program.actions()) {
    pb::ActionTiming* t = response.add_timings();
    *t->mutable_action() = a;
    t->set_lane(IsCommunication(a.kind()) ? "link" : "compute");
    t->set_start_us(at);
    t->set_end_us(at + 50);
    if (IsCommunication(a.kind())) t->set_bytes(1024);
    at += 100;
  }
}

bool HasOptimizerStep(const pb::StageProgram& program) {
  for (const pb::Action& a : program.actions()) {
    if (a.kind() == pb::OPTIMIZER_STEP) return true;
  }
  return false;
}

}  // namespace

// One connection: every call goes to the fleet, under its lock.
class FakeConnection : public coordinator::StageConnection {
 public:
  FakeConnection(FakeStages* fleet, std::string address)
      : fleet_(fleet), address_(std::move(address)) {}

  const std::string& address() const override { return address_; }

  absl::StatusOr<pb::ConfigureResponse> Configure(const pb::ConfigureRequest& request,
                                                  absl::Duration) override {
    absl::MutexLock lock(&fleet_->mu_);
    ASSIGN_OR_RETURN(FakeStages::Stage * stage,
                     fleet_->Answering(address_, absl::StrCat("Configure ", request.job_id(),
                                                              " stage ", request.stage())));
    RETURN_IF_ERROR(fleet_->Configure(*stage, request));
    pb::ConfigureResponse response;
    response.set_weight_bytes(1 << 20);
    return response;
  }

  absl::StatusOr<pb::RunStepResponse> RunStep(coordinator::CallControl& call,
                                              const pb::RunStepRequest& request) override {
    std::function<bool()> hold;
    {
      absl::MutexLock lock(&fleet_->mu_);
      ASSIGN_OR_RETURN(FakeStages::Stage * stage,
                       fleet_->Answering(address_, absl::StrCat("RunStep ", request.step())));
      stage->steps_run.push_back(request.step());
      RETURN_IF_ERROR(Faults(*stage, request.step()));
      if (stage->hold_at == request.step()) {
        stage->hold_at.reset();
        stage->holding = true;
        hold = std::move(stage->hold_until);
      }
    }
    if (hold) Hold(hold);
    {
      absl::MutexLock lock(&fleet_->mu_);
      ASSIGN_OR_RETURN(FakeStages::Stage * stage, fleet_->Alive(address_, "RunStep"));
      stage->holding = false;
      if (!fleet_->RunBroken(*stage, request.step())) return fleet_->RunStep(*stage, request);
    }
    return WaitForCancel(call);
  }

  absl::StatusOr<pb::ApplyOptimizerResponse> ApplyOptimizer(
      coordinator::CallControl&, const pb::ApplyOptimizerRequest& request) override {
    absl::MutexLock lock(&fleet_->mu_);
    ASSIGN_OR_RETURN(FakeStages::Stage * stage,
                     fleet_->Answering(address_, absl::StrCat("ApplyOptimizer ", request.step())));
    if (!stage->deferred) {
      return absl::FailedPreconditionError(
          absl::StrCat("ApplyOptimizer on ", address_, ": no step waits for it"));
    }
    stage->deferred = false;
    fleet_->Update(*stage, request.step(), stage->snapshot_deferred);
    pb::ApplyOptimizerResponse response;
    response.set_job_id(request.job_id());
    response.set_step(request.step());
    response.mutable_timing()->mutable_action()->set_kind(pb::OPTIMIZER_STEP);
    response.mutable_timing()->set_lane("compute");
    return response;
  }

  absl::StatusOr<std::string> ExportChunk(const std::string& job_id, int chunk,
                                          absl::Duration) override {
    absl::MutexLock lock(&fleet_->mu_);
    ASSIGN_OR_RETURN(FakeStages::Stage * stage,
                     fleet_->Answering(address_, absl::StrCat("ExportChunk ", chunk)));
    RETURN_IF_ERROR(HasChunk(*stage, job_id, chunk));
    return model::SerializeCheckpoint(stage->chunks[chunk]);
  }

  absl::Status ImportChunk(const std::string& job_id, int chunk, const std::string& bytes,
                           absl::Duration) override {
    absl::MutexLock lock(&fleet_->mu_);
    ASSIGN_OR_RETURN(FakeStages::Stage * stage,
                     fleet_->Answering(address_, absl::StrCat("ImportChunk ", chunk)));
    RETURN_IF_ERROR(HasChunk(*stage, job_id, chunk));
    return fleet_->Import(*stage, chunk, bytes);
  }

  absl::StatusOr<std::vector<pb::SnapshotInfo>> ListSnapshots(const std::string& job_id,
                                                              absl::Duration) override {
    absl::MutexLock lock(&fleet_->mu_);
    ASSIGN_OR_RETURN(FakeStages::Stage * stage, fleet_->Answering(address_, "ListSnapshots"));
    std::vector<pb::SnapshotInfo> out;
    if (stage->config.job_id() != job_id) return out;
    for (const auto& [key, snapshot] : stage->snapshots) out.push_back(snapshot.info);
    return out;
  }

  absl::StatusOr<std::string> FetchSnapshot(const std::string& job_id, int owner_stage, int chunk,
                                            int64_t step, std::optional<bool> which,
                                            absl::Duration) override {
    absl::MutexLock lock(&fleet_->mu_);
    ASSIGN_OR_RETURN(FakeStages::Stage * stage,
                     fleet_->Answering(address_, absl::StrCat("FetchSnapshot ", owner_stage, "/",
                                                              chunk, " step ", step)));
    if (stage->config.job_id() == job_id) {
      for (bool held : {false, true}) {
        if (which && *which != held) continue;
        auto it = stage->snapshots.find({owner_stage, chunk, held});
        if (it != stage->snapshots.end() && it->second.info.step() == step) return it->second.bytes;
      }
    }
    return absl::NotFoundError(absl::StrCat("FetchSnapshot on ", address_, ": no snapshot of stage ",
                                            owner_stage, " chunk ", chunk, " step ", step));
  }

  absl::Status Ping(absl::Duration) override {
    absl::MutexLock lock(&fleet_->mu_);
    auto it = fleet_->stages_.find(address_);
    if (it == fleet_->stages_.end() || !it->second.alive) {
      return absl::UnavailableError(absl::StrCat("health check on ", address_, ": no answer"));
    }
    return absl::OkStatus();
  }

 private:
  // Dies or fails at this step when told to.
  absl::Status Faults(FakeStages::Stage& stage, int64_t step) {
    if (stage.die_at == step) {
      stage.alive = false;
      return absl::UnavailableError(absl::StrCat("RunStep on ", address_, ": the stage died"));
    }
    if (auto f = stage.fail_at.find(step); f != stage.fail_at.end()) return f->second;
    return absl::OkStatus();
  }

  static void Hold(const std::function<bool()>& until) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!until() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  }

  absl::Status HasChunk(const FakeStages::Stage& stage, const std::string& job_id, int chunk) {
    if (stage.config.job_id() != job_id || chunk < 0 ||
        chunk >= static_cast<int>(stage.chunks.size())) {
      return absl::NotFoundError(
          absl::StrCat(address_, ": no chunk ", chunk, " of job '", job_id, "'"));
    }
    return absl::OkStatus();
  }

  // A neighbour is gone: the frame this stage waits for never comes. As a real stage,
  // it waits until the coordinator cancels the call (or its deadline passes).
  absl::Status WaitForCancel(coordinator::CallControl& call) {
    while (!call.cancelled() && absl::Now() < call.deadline()) absl::SleepFor(absl::Milliseconds(1));
    if (call.cancelled()) return absl::CancelledError(absl::StrCat("RunStep on ", address_, ": cancelled"));
    return absl::DeadlineExceededError(
        absl::StrCat("RunStep on ", address_, ": no frame from a neighbour"));
  }

  FakeStages* const fleet_;
  const std::string address_;
};

void FakeStages::Add(const std::string& address) {
  absl::MutexLock lock(&mu_);
  stages_[address] = Stage();
}

void FakeStages::DieAtStep(const std::string& address, int64_t step) {
  absl::MutexLock lock(&mu_);
  stages_.at(address).die_at = step;
}

void FakeStages::FailAtStep(const std::string& address, int64_t step, absl::Status error) {
  absl::MutexLock lock(&mu_);
  stages_.at(address).fail_at[step] = std::move(error);
}

void FakeStages::FailNext(const std::string& address, const std::string& method,
                          absl::Status error) {
  absl::MutexLock lock(&mu_);
  stages_.at(address).fail_next[method] = std::move(error);
}

void FakeStages::HoldAtStep(const std::string& address, int64_t step,
                            std::function<bool()> until) {
  absl::MutexLock lock(&mu_);
  Stage& stage = stages_.at(address);
  stage.hold_at = step;
  stage.hold_until = std::move(until);
}

bool FakeStages::Holding(const std::string& address) {
  absl::MutexLock lock(&mu_);
  return stages_.at(address).holding;
}

void FakeStages::Kill(const std::string& address) {
  absl::MutexLock lock(&mu_);
  stages_.at(address).alive = false;
}

void FakeStages::Revive(const std::string& address) {
  absl::MutexLock lock(&mu_);
  Stage& stage = stages_.at(address);
  stage.alive = true;
  stage.die_at.reset();
}

std::vector<std::string> FakeStages::Calls(const std::string& address) {
  absl::MutexLock lock(&mu_);
  return stages_.at(address).calls;
}

std::vector<int64_t> FakeStages::StepsRun(const std::string& address) {
  absl::MutexLock lock(&mu_);
  return stages_.at(address).steps_run;
}

std::vector<int64_t> FakeStages::Updates(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  for (const model::Checkpoint& c : stages_.at(address).chunks) out.push_back(c.optimizer->step);
  return out;
}

pb::ConfigureRequest FakeStages::Configured(const std::string& address) {
  absl::MutexLock lock(&mu_);
  return stages_.at(address).config;
}

std::unique_ptr<coordinator::StageConnection> FakeStages::Connect(const std::string& address) {
  return std::make_unique<FakeConnection>(this, address);
}

absl::StatusOr<FakeStages::Stage*> FakeStages::Alive(const std::string& address,
                                                     const std::string& call) {
  auto it = stages_.find(address);
  if (it == stages_.end() || !it->second.alive) {
    return absl::UnavailableError(absl::StrCat(call, " on ", address, ": connection refused"));
  }
  return &it->second;
}

absl::StatusOr<FakeStages::Stage*> FakeStages::Answering(const std::string& address,
                                                         const std::string& call) {
  ASSIGN_OR_RETURN(Stage * found, Alive(address, call));
  Stage& stage = *found;
  stage.calls.push_back(call);
  const std::string method = call.substr(0, call.find(' '));
  if (auto f = stage.fail_next.find(method); f != stage.fail_next.end()) {
    absl::Status error = f->second;
    stage.fail_next.erase(f);
    return error;
  }
  return &stage;
}

bool FakeStages::RunBroken(const Stage& stage, int64_t step) const {
  for (const auto& [address, other] : stages_) {
    if (other.config.job_id() != stage.config.job_id() ||
        other.config.peer_secret() != stage.config.peer_secret()) {
      continue;
    }
    if (!other.alive || other.die_at == step || other.fail_at.contains(step)) return true;
  }
  return false;
}

absl::Status FakeStages::Configure(Stage& stage, const pb::ConfigureRequest& request) {
  ASSIGN_OR_RETURN(model::TransformerConfig config, model::ConfigFromProto(request.model()));
  std::vector<model::Checkpoint> chunks;
  for (const pb::LayerRange& r : request.chunks()) {
    ASSIGN_OR_RETURN(model::Checkpoint c, FreshChunk(config, r.begin_layer(), r.end_layer()));
    chunks.push_back(std::move(c));
  }
  stage.config = request;
  stage.chunks = std::move(chunks);
  stage.deferred = false;
  stage.snapshots.clear();  // a new run of the job keeps no snapshot of an old one
  return absl::OkStatus();
}

absl::StatusOr<pb::RunStepResponse> FakeStages::RunStep(Stage& stage,
                                                        const pb::RunStepRequest& request) {
  if (request.job_id() != stage.config.job_id() || stage.chunks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("RunStep: job '", request.job_id(), "' is not configured here"));
  }
  pb::RunStepResponse response;
  response.set_job_id(request.job_id());
  response.set_step(request.step());
  const int64_t updates = stage.chunks.back().optimizer->step;
  for (int mb = 0; mb < request.targets_size(); ++mb) response.add_losses(LossAfter(updates));
  AddTimings(request.program(), response);
  response.set_peak_memory_bytes(1 << 20);
  if (HasOptimizerStep(request.program())) {
    response.set_grad_norm_sq(0.25);
    if (request.defer_optimizer()) {
      stage.deferred = true;
      stage.snapshot_deferred = request.snapshot();
    } else {
      Update(stage, request.step(), request.snapshot());
    }
  }
  return response;
}

void FakeStages::Update(Stage& stage, int64_t step, bool snapshot) {
  for (model::Checkpoint& c : stage.chunks) ++c.optimizer->step;
  if (snapshot) TakeSnapshot(stage, step);
}

void FakeStages::TakeSnapshot(Stage& stage, int64_t step) {
  auto peer = stages_.find(stage.config.snapshot_peer_address());
  for (int c = 0; c < static_cast<int>(stage.chunks.size()); ++c) {
    Snapshot s;
    s.bytes = model::SerializeCheckpoint(stage.chunks[c]).value();
    s.info.set_owner_stage(stage.config.stage());
    s.info.set_chunk(c);
    s.info.set_step(step);
    s.info.set_bytes(s.bytes.size());
    s.info.set_begin_layer(stage.chunks[c].layer_begin);
    s.info.set_end_layer(stage.chunks[c].layer_end);
    s.info.set_num_stages(stage.config.num_stages());
    if (peer != stages_.end() && peer->second.alive) {
      Snapshot held = s;
      held.info.set_held(true);
      peer->second.snapshots[{stage.config.stage(), c, true}] = std::move(held);
    }
    stage.snapshots[{stage.config.stage(), c, false}] = std::move(s);
  }
}

absl::Status FakeStages::Import(Stage& stage, int chunk, const std::string& bytes) {
  ASSIGN_OR_RETURN(model::Checkpoint c, model::ParseCheckpoint(bytes, "ImportChunk"));
  model::Checkpoint& mine = stage.chunks[chunk];
  if (c.layer_begin != mine.layer_begin || c.layer_end != mine.layer_end) {
    return absl::InvalidArgumentError(absl::StrCat("ImportChunk: layers [", c.layer_begin, ", ",
                                                   c.layer_end, ") for a chunk of [",
                                                   mine.layer_begin, ", ", mine.layer_end, ")"));
  }
  if (!c.optimizer) c.optimizer = std::move(mine.optimizer);  // weights only: fresh AdamW
  stage.calls.back() += absl::StrCat(" step ", c.optimizer ? c.optimizer->step : 0);
  mine = std::move(c);
  return absl::OkStatus();
}

absl::StatusOr<pb::JobSpec> FakeJobSpec(const std::string& corpus,
                                        const std::vector<std::string>& overrides) {
  const std::string base = absl::StrCat(R"({
    "name": "fake",
    "model": {"vocab_size": 256, "seq_len": 8, "d_model": 8, "n_heads": 2, "n_layers": 2},
    "pipeline": {"stages": 2, "micro_batches": 2, "schedule": "gpipe"},
    "training": {"steps": 6, "batch_size": 4, "seed": 7, "lr": 0.01},
    "data": {"corpus": ")", corpus, R"("},
    "checkpoint": {"every_steps": 2, "snapshot_every_steps": 1},
    "fault_tolerance": {"max_restarts": 1, "wait_for_stages_s": 1}})");
  ASSIGN_OR_RETURN(std::string json, coordinator::ApplyOverrides(base, overrides));
  ASSIGN_OR_RETURN(pb::JobSpec spec, coordinator::ParseJobSpec(json));
  spec = coordinator::WithDefaults(std::move(spec));
  RETURN_IF_ERROR(coordinator::ValidateJobSpec(spec));
  return spec;
}

}  // namespace pipetrain::testing
