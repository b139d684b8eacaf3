#include "coordinator/runner/job_runner.h"

#include <cmath>
#include <optional>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/frame_proto.h"
#include "common/model/batch.h"
#include "common/error_context.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/split_checkpoint.h"
#include "common/status_macros.h"
#include "coordinator/runner/job_data.h"
#include "coordinator/runner/job_paths.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/spec/lr_schedule.h"
#include "coordinator/stages/grpc_stage_connector.h"
#include "coordinator/planner/cost_fit.h"
#include "coordinator/planner/forward_only.h"
#include "coordinator/planner/planner.h"
#include "coordinator/runner/stage_configure.h"
#include "coordinator/stages/stage_costs.h"
#include "coordinator/metrics/step_metrics.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

class Runner {
 public:
  Runner(std::string job_id, const pb::JobSpec& spec, const std::vector<RunnerStage>& stages,
         const RunnerOptions& options, RunnerHooks& hooks, const RunStart& start)
      : job_id_(std::move(job_id)),
        spec_(spec),
        options_(options),
        hooks_(hooks),
        start_(start),
        connector_(ConnectorOrGrpc(options.connector, options.security)),
        group_(stages, *connector_) {}

  RunOutcome Run() {
    if (absl::Status s = Prepare(); !s.ok()) return Fail(s);
    // Steps are the training run's: a job continued from step N runs N+1 .. last_.
    for (int64_t step = first_; step <= last_; ++step) {
      if (hooks_.Cancelled()) return Cancelled(step);
      if (absl::Status s = TrainStep(step); !s.ok()) return Fail(s);
      if (absl::Status s = PeriodicCheckpoint(step); !s.ok()) return Fail(s);
    }
    // Also when a restart restored the last step itself: the job ends with its checkpoint.
    if (absl::Status s = Checkpoint(last_); !s.ok()) return Fail(s);
    return Succeeded();
  }

 private:
  // A job of R data-parallel replicas runs on R x K stages: stage s of replica r is
  // group index r * K + s; every replica runs the plan's K programs on its share of the
  // batch, and the stages of one position average their gradients (stage runtime).
  int K() const { return group_.size() / R(); }
  int R() const { return std::max(1, spec_.pipeline().replicas()); }
  int N() const { return group_.size(); }
  int StageOf(int i) const { return i % K(); }
  int ReplicaOf(int i) const { return i / K(); }
  // The copies of each stage split the optimizer (pipeline.shard_optimizer).
  bool Split() const { return SplitsOptimizer(spec_); }
  bool Emulated() const {
    for (int s = 0; s < N(); ++s) {
      if (group_.stage(s).device.kind() == "emulated") return true;
    }
    return false;
  }
  std::string StageName(int s) const { return group_.StageName(s); }

  // Everything before the first step, in order: plan, data, stages configured, the
  // starting state loaded, the steps this run takes.
  absl::Status Prepare() {
    RETURN_IF_ERROR(MakeRunPlan());
    RETURN_IF_ERROR(LoadData());
    RETURN_IF_ERROR(ConfigureAll());
    configured_ = true;
    RETURN_IF_ERROR(LoadStartingState());
    SetStepRange();
    return absl::OkStatus();
  }

  // The plan on these stages (the least memory caps it), and the costs to measure.
  absl::Status MakeRunPlan() {
    ASSIGN_OR_RETURN(planner::PlanOptions po, planner::OptionsFromJobSpec(spec_));
    if (N() != R() * spec_.pipeline().stages()) {
      return common::ErrorContext().Job(job_id_).Error(
          absl::StatusCode::kInternal,
          absl::StrCat(N(), " stages for ", R(), " replicas of ", spec_.pipeline().stages()));
    }
    std::vector<pb::DeviceInfo> devices;  // every stage's: the cap is the least memory
    for (int s = 0; s < N(); ++s) devices.push_back(group_.stage(s).device);
    SetCostsFromDevices(devices, po);
    ASSIGN_OR_RETURN(plan_, planner::MakePlan(po));
    // A short window follows a machine whose load changes (CPU stages sharing cores).
    measured_.emplace(K(), po.chunks, /*window=*/5, plan_.topology().placement);
    LogPlan();
    return absl::OkStatus();
  }

  void LogPlan() {
    const planner::PlanOptions& po = plan_.options;
    hooks_.Log(absl::StrFormat(
        "planned %d stages, schedule %s, %d micro-batches of %d sequences; predicted bubble %.3f",
        K(), spec_.pipeline().schedule(), po.micro_batches,
        po.replica_batch_size() / po.micro_batches, plan_.simulation.bubble_fraction));
    if (R() > 1) {
      hooks_.Log(absl::StrFormat(
          "%d data-parallel replicas of the %d stages (%d stage servers; replica r's stage s "
          "is stage r x %d + s), each on %d of the %d sequences a step",
          R(), K(), N(), K(), po.replica_batch_size(), po.batch_size));
      hooks_.Log(Split() ? absl::StrFormat(
                               "the %d copies of each stage split the optimizer "
                               "(pipeline.shard_optimizer): each keeps AdamW's moments for 1/%d "
                               "of every layer; gradients are reduce-scattered and the updated "
                               "weights gathered",
                               R(), R())
                         : std::string("each replica keeps the whole optimizer "
                                       "(pipeline.shard_optimizer false)"));
    } else if (spec_.pipeline().has_shard_optimizer() && spec_.pipeline().shard_optimizer()) {
      hooks_.Log("pipeline.shard_optimizer changes nothing with one replica: there is no "
                 "other copy to split with");
    }
    if (!plan_.sharing.empty()) {
      hooks_.Log(absl::StrCat("devices shared: ", plan_.sharing,
                              "; the plan has their stages take turns computing"));
    }
    for (int s = 0; s < K(); ++s) {
      std::string ranges;
      for (auto [b, e] : plan_.stages[s].chunks) absl::StrAppend(&ranges, " [", b, ", ", e, ")");
      hooks_.Log(absl::StrCat(StageName(s), " holds pipeline layers", ranges));
    }
  }

  // The job's files, checked against --data-root again (a symlink may have changed)
  // and read; the validation programs when the job validates.
  absl::Status LoadData() {
    // A restored run reads no init_from (the state comes from a snapshot or checkpoint).
    pb::JobSpec read = spec_;
    if (start_.restored != nullptr) read.clear_init_from();
    RETURN_IF_ERROR(CheckJobPaths(read, options_.data_roots));
    ASSIGN_OR_RETURN(data_, LoadJobData(spec_));
    if (spec_.data().validate_every_steps() > 0) {
      ASSIGN_OR_RETURN(eval_programs_, planner::ForwardOnlySchedule(
                                         K(), plan_.options.micro_batches, plan_.options.chunks,
                                         plan_.topology().placement));
    }
    return absl::OkStatus();
  }

  // The restored state of a restart, else init_from; first_ follows from it.
  absl::Status LoadStartingState() {
    if (start_.restored != nullptr) {
      const RestoredState& r = *start_.restored;
      RETURN_IF_ERROR(ImportWhole(r.whole, absl::StrCat("restoring ", r.source, " on")));
      first_ = r.step + 1;
      hooks_.Log(absl::StrCat("restored the state after step ", r.step, " from ", r.source,
                              " on ", K(), K() == 1 ? " stage" : " stages"));
      LogPrecisionChange(r.whole, r.source);
      return absl::OkStatus();
    }
    if (!spec_.init_from().empty()) RETURN_IF_ERROR(LoadInitCheckpoint());
    first_ = init_step_ + 1;
    return absl::OkStatus();
  }

  // The job's steps keep the numbers its first run gave them.
  void SetStepRange() {
    const int64_t job_first = start_.job_first_step != 0 ? start_.job_first_step : first_;
    last_ = job_first - 1 + spec_.training().steps();
    hooks_.FirstStep(job_first);
    steps_done_ = first_ - 1;
  }

  // Cuts a whole-model checkpoint into this plan's stages and chunks and loads each part.
  absl::Status ImportWhole(const model::Checkpoint& whole, const std::string& what) {
    return group_.Run(0, what.c_str(), [&](int i) -> absl::Status {
      const int s = StageOf(i);  // every replica starts from the same state
      for (size_t c = 0; c < plan_.stages[s].chunks.size(); ++c) {
        auto [b, e] = plan_.stages[s].chunks[c];
        ASSIGN_OR_RETURN(model::Checkpoint part, model::SliceCheckpoint(whole, b, e));
        ASSIGN_OR_RETURN(std::string bytes, model::SerializeCheckpoint(part));
        RETURN_IF_ERROR(group_.client(i).ImportChunk(job_id_, static_cast<int>(c), bytes,
                                                     options_.rpc_deadline));
      }
      return absl::OkStatus();
    });
  }

  absl::Status ConfigureAll() {
    absl::BitGen gen;
    const std::string secret =
        absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
    // Each replica is a pipeline of its own (its links and snapshot ring); the replicas
    // of a stage position meet under a prefix no other run of the job uses.
    std::vector<StageWiring> wiring(R(), StageWiring{job_id_, {}, secret, options_.recv_deadline_ms});
    for (int i = 0; i < N(); ++i) wiring[ReplicaOf(i)].addresses.push_back(group_.stage(i).address);
    const std::string prefix = absl::StrCat(job_id_, "/run-", secret.substr(0, 16));
    const pb::OptimizerConfig optimizer = OptimizerFromSpec(spec_.training());
    return group_.Run(0, "configuring", [&](int i) -> absl::Status {
      pb::ConfigureRequest request = BuildConfigureRequest(
          plan_, StageOf(i), spec_.training().seed(), optimizer, wiring[ReplicaOf(i)]);
      if (R() > 1) {
        request.set_replica(ReplicaOf(i));
        request.set_replicas(R());
        request.set_rendezvous_prefix(prefix);
        request.set_shard_optimizer(Split());
        // One stage: no ring successor holds its snapshots, so the next copy does (each
        // copy's moments exist nowhere else).
        if (Split() && K() == 1 && plan_.options.snapshots) {
          request.set_snapshot_peer_address(group_.stage((i + 1) % N()).address);
        }
      }
      absl::StatusOr<pb::ConfigureResponse> r =
          group_.client(i).Configure(request, options_.rpc_deadline);
      if (!r.ok()) return r.status();
      hooks_.Log(absl::StrFormat("%s configured: %.1f MiB of weights, %.1f MiB of optimizer state",
                                 StageName(i), r->weight_bytes() / 1048576.0,
                                 r->optimizer_bytes() / 1048576.0));
      return absl::OkStatus();
    });
  }

  absl::Status LoadInitCheckpoint() {
    ASSIGN_OR_RETURN(model::Checkpoint loaded,
                     model::LoadWholeCheckpoint(spec_.init_from(), "init_from"));
    const int file_positions = loaded.config.seq_len;
    // A job may run shorter sequences than the checkpoint was made for (a Hugging Face
    // GPT-2 has n_positions 1024): it takes the first model.seq_len rows of wpe.
    ASSIGN_OR_RETURN(
        model::Checkpoint whole,
        model::FitCheckpointToModel(std::move(loaded), plan_.options.model,
                                    absl::StrCat("init_from: '", spec_.init_from(), "'")));
    if (file_positions != whole.config.seq_len) {
      hooks_.Log(absl::StrFormat("init_from holds %d positions; the job uses the first %d",
                                 file_positions, whole.config.seq_len));
    }
    if (whole.optimizer) init_step_ = whole.optimizer->step;
    RETURN_IF_ERROR(ImportWhole(whole, "loading init_from on"));
    hooks_.Log(absl::StrCat("started from ", spec_.init_from(),
                            whole.optimizer ? absl::StrCat(" (AdamW state at update ",
                                                           whole.optimizer->step,
                                                           "; batches continue from there)")
                                            : " (weights only)"));
    LogPrecisionChange(whole, absl::StrCat("init_from '", spec_.init_from(), "'"));
    return absl::OkStatus();
  }

  // Says so when the state a run starts from was trained in another precision: both keep
  // fp32 master weights and moments, so they load as they are.
  void LogPrecisionChange(const model::Checkpoint& from, const std::string& what) {
    const std::string& precision = plan_.options.precision;
    if (from.precision == precision) return;
    hooks_.Log(absl::StrCat("job ", job_id_, " trains in ", precision, " from ", what,
                            ", which was trained in ", from.precision, ": its fp32 master weights",
                            from.optimizer ? " and AdamW moments are" : " are",
                            " carried over unchanged"));
  }

  // Runs one program set on every stage at once (`lr`: its optimizer steps' rate, none
  // for a program without). With defer_optimizer the stages only report their
  // grad_norm_sq at OPTIMIZER_STEP and wait for ApplyOnAll.
  absl::StatusOr<std::vector<pb::RunStepResponse>> RunOnAll(int64_t step,
                                                            const schedule::Schedule& programs,
                                                            const model::TokenBatch& batch,
                                                            std::optional<float> lr,
                                                            const char* what,
                                                            bool defer_optimizer = false,
                                                            bool snapshot = false) {
    // Each replica's share of the batch (the whole batch with one).
    std::vector<model::TokenBatch> shares;
    for (int r = 0; r < R(); ++r) {
      ASSIGN_OR_RETURN(model::TokenBatch share, model::ReplicaRows(batch, r, R()));
      shares.push_back(std::move(share));
    }
    std::vector<pb::RunStepResponse> out(N());
    std::vector<absl::Status> st = group_.OnEveryStageCancellingOnError(
        options_.step_deadline, [&](int i, CallControl& call) -> absl::Status {
          pb::RunStepRequest req =
              StepRequest(step, programs[StageOf(i)], StageOf(i), shares[ReplicaOf(i)], lr);
          req.set_defer_optimizer(defer_optimizer);
          req.set_snapshot(snapshot);
          ASSIGN_OR_RETURN(out[i], group_.client(i).RunStep(call, req));
          return absl::OkStatus();
        });
    RETURN_IF_ERROR(group_.FirstError(st, step, what));
    return out;
  }

  // Stage position s's request: its program, with the token micro-batches of its
  // replica's share on the first stage and the targets on the one holding the head.
  pb::RunStepRequest StepRequest(int64_t step, const schedule::StageProgram& program, int s,
                                 const model::TokenBatch& share,
                                 std::optional<float> lr) const {
    const int M = plan_.options.micro_batches, T = plan_.options.model.seq_len;
    const int rows = share.rows / M;
    pb::RunStepRequest req;
    req.set_job_id(job_id_);
    req.set_step(step);
    *req.mutable_program() = schedule::ToProto(program);
    for (int mb = 0; mb < M; ++mb) {
      if (s == 0) {
        common::TensorToProto(model::MicroBatchRows(share.inputs, mb, rows, T), req.add_tokens());
      }
      if (s == plan_.topology().HeadStage()) {
        common::TensorToProto(model::MicroBatchRows(share.targets, mb, rows, T),
                              req.add_targets());
      }
    }
    if (lr) req.set_lr(*lr);  // 0 included: a schedule may end at min_lr 0
    return req;
  }

  // The norm over the whole model, before clipping, from every stage's share (each
  // reports it at its optimizer step, deferred or not). After the replicas' averaging
  // every replica holds the same gradients: one replica's stages make the whole model;
  // copies that split the optimizer report their pieces' only, so all of them do.
  double GlobalGradNorm(const std::vector<pb::RunStepResponse>& responses) const {
    double sum_sq = 0;
    for (int i = 0; i < (Split() ? N() : K()); ++i) sum_sq += responses[i].grad_norm_sq();
    return std::sqrt(sum_sq);
  }

  // Phase 2 of a step whose optimizer was deferred: the norm over the whole model from
  // every stage's share, then every stage's optimizer step clipped by it (as
  // torch.nn.utils.clip_grad_norm_ on one device). Each optimizer action's timing joins
  // its stage's response, so the step's record and timeline show it.
  absl::Status ApplyOnAll(int64_t step, float lr, std::vector<pb::RunStepResponse>& responses) {
    const double global_norm = GlobalGradNorm(responses);
    std::vector<absl::Status> st = group_.OnEveryStageCancellingOnError(
        options_.step_deadline, [&](int s, CallControl& call) -> absl::Status {
          pb::ApplyOptimizerRequest req;
          req.set_job_id(job_id_);
          req.set_step(step);
          req.set_global_grad_norm(global_norm);
          req.set_lr(lr);
          ASSIGN_OR_RETURN(pb::ApplyOptimizerResponse r, group_.client(s).ApplyOptimizer(call, req));
          *responses[s].add_timings() = r.timing();
          return absl::OkStatus();
        });
    return group_.FirstError(st, step, "applying the optimizer on");
  }

  // The rate of the training run's step `step`. A job started from a checkpoint
  // (init_from) continues its schedule: the warm-up counts the steps the checkpoint
  // already took, as the data order and AdamW's step do, and a decay ends at the run's
  // last step (last_), so a resumed run equals an unbroken one.
  absl::StatusOr<float> LearningRate(int64_t step) const {
    ASSIGN_OR_RETURN(const LrSchedule schedule, LrScheduleOf(spec_.training(), last_));
    return coordinator::LearningRate(schedule, step);
  }

  // Whether the stages keep (and copy to their ring neighbour) an in-memory snapshot of
  // their state after this step: what a lost stage is restored from.
  bool SnapshotAfter(int64_t step) const {
    const int every = spec_.checkpoint().snapshot_every_steps();
    return every > 0 && step % every == 0;
  }

  // One training step on every stage, measured, predicted and recorded.
  absl::StatusOr<pb::StepRecord> Step(int64_t step) {
    const pb::TrainingSpec& t = spec_.training();
    ASSIGN_OR_RETURN(
        model::TokenBatch batch,
        TrainingBatch(data_, plan_.options.model, t.batch_size(), t.seed(), step));
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(const float lr, LearningRate(step));
    ASSIGN_OR_RETURN(std::vector<pb::RunStepResponse> responses, RunTraining(step, batch, lr));
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    timeline_ = TimelineOf(step, responses);
    const Prediction predicted = Predict();
    ReportPredictedTimeline(step);
    AddMeasuredStep(step, responses);
    ASSIGN_OR_RETURN(pb::StepRecord record,
                     MakeStepRecord(step, responses, wall,
                                    static_cast<int64_t>(t.batch_size()) *
                                        plan_.options.model.seq_len,
                                    predicted.bubble));
    record.set_step_time_predicted_s(predicted.step_time_s);
    record.set_predicted_fitted(predicted.fitted);
    record.set_lr(lr);
    record.set_grad_norm(GlobalGradNorm(responses));  // what clip_grad_norm_ returns
    return record;
  }

  // The training programs on every stage; clipping needs the norm over the whole model,
  // which no stage has alone, so with clipping over several stages (or the copies of a
  // split optimizer) it takes two phases.
  absl::StatusOr<std::vector<pb::RunStepResponse>> RunTraining(int64_t step,
                                                               const model::TokenBatch& batch,
                                                               float lr) {
    const bool two_phase = spec_.training().grad_clip_norm() > 0 && (K() > 1 || Split());
    ASSIGN_OR_RETURN(std::vector<pb::RunStepResponse> responses,
                     RunOnAll(step, plan_.programs, batch, lr, "running", two_phase,
                              SnapshotAfter(step)));
    if (two_phase) RETURN_IF_ERROR(ApplyOnAll(step, lr, responses));
    return responses;
  }

  // With each action's mean: one picture of the step, where Predict's figures average
  // draws from each action's spread.
  void ReportPredictedTimeline(int64_t step) {
    absl::StatusOr<planner::SimulationResult> sim =
        planner::Simulate(plan_.programs, measured_->Fit(plan_.costs));
    if (sim.ok()) hooks_.PredictedTimeline(PredictedTimelineOf(step, *sim));
  }

  // The step's timeline joins the measured costs, except the first step's: it warms
  // links and buffer pools up and would skew them.
  void AddMeasuredStep(int64_t step, const std::vector<pb::RunStepResponse>& responses) {
    if (step <= first_) return;
    // The costs are a pipeline's: replica 0's stages (the others run the same).
    const std::vector<pb::RunStepResponse> one(responses.begin(), responses.begin() + K());
    if (absl::Status s = measured_->AddStep(R() == 1 ? timeline_ : TimelineOf(step, one));
        !s.ok()) {
      hooks_.Log(absl::StrCat("step ", step, ": its timeline is not used for the fitted "
                              "prediction: ", s.message()));
    }
  }

  // The latest steps' costs as rates, for `pipetrain plan --costs-from` after the job.
  void ReportMeasured(int64_t step) {
    if (measured_->steps() == 0) return;
    absl::StatusOr<planner::CostRates> r = planner::RatesFromMeasured(plan_, *measured_);
    if (!r.ok()) return;
    pb::MeasuredCostRates m;
    m.set_forward_s_per_flop(r->forward_s_per_flop);
    m.set_backward_input_s_per_flop(r->backward_input_s_per_flop);
    m.set_backward_weight_s_per_flop(r->backward_weight_s_per_flop);
    m.set_optimizer_s_per_param(r->optimizer_s_per_param);
    m.set_send_busy_s(r->send_busy_s);
    m.set_recv_busy_s(r->recv_busy_s);
    m.set_transfer_s_per_byte(r->transfer_s_per_byte);
    m.set_steps(r->steps);
    m.set_first_step(step - r->steps + 1);
    m.set_last_step(step);
    hooks_.Measured(m);
  }

  struct Prediction {
    double bubble = 0;
    double step_time_s = 0;
    bool fitted = false;
  };

  // The step as the simulator sees it with the costs measured on the earlier steps (so a
  // step is predicted before it runs); the planner's cost model until one is measured.
  Prediction Predict() {
    Prediction p{plan_.simulation.bubble_fraction, plan_.simulation.step_time_s, false};
    if (measured_->steps() == 0) return p;
    absl::StatusOr<planner::MeasuredCosts::Prediction> sim =
        measured_->Predict(plan_.programs, plan_.costs, /*draws=*/16);
    if (!sim.ok()) return p;
    if (!fitted_logged_) {
      fitted_logged_ = true;
      hooks_.Log(absl::StrFormat(
          "predicted bubble %.3f from the costs measured so far (the cost model said %.3f); "
          "the difference to the measured one is the runtime's own overhead",
          sim->bubble_fraction, plan_.simulation.bubble_fraction));
    }
    return {sim->bubble_fraction, sim->step_time_s, true};
  }

  absl::StatusOr<double> Validate(int64_t step) {
    ASSIGN_OR_RETURN(model::TokenBatch batch,
                     ValidationBatch(data_, plan_.options.model, spec_.training().batch_size(),
                                     spec_.training().seed()));
    ASSIGN_OR_RETURN(std::vector<pb::RunStepResponse> responses,
                     RunOnAll(step, eval_programs_, batch, std::nullopt, "validating"));
    return MeanLoss(responses, step);
  }

  // The whole model after `step` into ROOT/step-N (none on emulated stages).
  absl::Status Checkpoint(int64_t step) {
    if (Emulated()) {
      // Their weights are not there to save: an emulated device runs no arithmetic.
      if (!emulated_logged_) {
        emulated_logged_ = true;
        hooks_.Log(absl::StrCat("step ", step, ": no checkpoint: the job runs on emulated "
                                "stages, which hold no weights"));
      }
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<model::ChunkFile> files, ExportAll(step));
    const std::string dir = absl::StrCat(options_.checkpoint_root, "/step-", step);
    if (absl::Status s = model::WriteCheckpointFolder(dir, files, plan_.options.chunks); !s.ok()) {
      return common::ErrorContext().Step(step).Error(
          s.code(), absl::StrCat("writing the checkpoint: ", s.message()));
    }
    hooks_.Checkpoint(dir, step);
    return absl::OkStatus();
  }

  // Every chunk of one pipeline's stages: the replicas hold the same state, except
  // where they split the optimizer: then every copy's export, joined.
  absl::StatusOr<std::vector<model::ChunkFile>> ExportAll(int64_t step) {
    const int exporters = Split() ? N() : K();
    std::vector<std::vector<std::string>> files(exporters);  // per group index, per chunk
    RETURN_IF_ERROR(group_.Run(step, "checkpointing", [&](int i) -> absl::Status {
      if (i >= exporters) return absl::OkStatus();
      for (int c = 0; c < static_cast<int>(plan_.stages[StageOf(i)].chunks.size()); ++c) {
        ASSIGN_OR_RETURN(std::string bytes,
                         group_.client(i).ExportChunk(job_id_, c, options_.rpc_deadline));
        // The checkpoint records the job's precision; a stage's export says the default.
        ASSIGN_OR_RETURN(bytes, model::WithPrecision(std::move(bytes), plan_.options.precision,
                                                     absl::StrCat("the export of chunk ", c)));
        files[i].push_back(std::move(bytes));
      }
      return absl::OkStatus();
    }));
    std::vector<model::ChunkFile> all;
    for (int s = 0; s < K(); ++s) {
      for (size_t c = 0; c < files[s].size(); ++c) {
        if (!Split()) {
          all.push_back({s, static_cast<int>(c), std::move(files[s][c])});
          continue;
        }
        std::vector<std::string> copies;
        for (int r = 0; r < R(); ++r) copies.push_back(std::move(files[r * K() + s][c]));
        ASSIGN_OR_RETURN(std::string joined, JoinCopyExports(copies, s, static_cast<int>(c), step));
        all.push_back({s, static_cast<int>(c), std::move(joined)});
      }
    }
    return all;
  }

  // One chunk's exports from the copies of stage s that split the optimizer, joined into
  // the file one unsplit stage would have written (common/model/split_checkpoint.h).
  absl::StatusOr<std::string> JoinCopyExports(const std::vector<std::string>& copies, int s,
                                              int c, int64_t step) const {
    const std::string what =
        absl::StrCat("job '", job_id_, "' step ", step, ": the copies of stage ", s, " chunk ", c);
    std::vector<model::Checkpoint> parsed;
    for (size_t r = 0; r < copies.size(); ++r) {
      ASSIGN_OR_RETURN(model::Checkpoint one,
                       model::ParseCheckpoint(copies[r], absl::StrCat(what, ", copy ", r)));
      parsed.push_back(std::move(one));
    }
    ASSIGN_OR_RETURN(model::Checkpoint joined, model::JoinCopies(std::move(parsed), what));
    return model::SerializeCheckpoint(joined);
  }

  // The checkpoint every checkpoint.every_steps (the last step's comes at the end).
  absl::Status PeriodicCheckpoint(int64_t step) {
    const int every = spec_.checkpoint().every_steps();
    if (every <= 0 || step % every != 0 || step == last_) return absl::OkStatus();
    absl::Status s = Checkpoint(step);
    // A stage that stopped answering is lost: recover now, not at the next step.
    if (s.ok() || !group_.lost().empty()) return s;
    // Otherwise the training is healthy and the newest complete checkpoint stays valid (a
    // failed one leaves no folder): only the job's last checkpoint must succeed.
    hooks_.Log(absl::StrCat("warning: ", s.message(), "; the job goes on and tries "
                            "again at the next checkpoint"));
    return absl::OkStatus();
  }

  // One step of the loop: the step, its validation loss when due, and its report.
  absl::Status TrainStep(int64_t step) {
    ASSIGN_OR_RETURN(pb::StepRecord record, Step(step));
    const int validate = spec_.data().validate_every_steps();
    if (validate > 0 && (step % validate == 0 || step == last_)) {
      ASSIGN_OR_RETURN(double val, Validate(step));
      record.set_val_loss(val);
      record.set_has_val_loss(true);
    }
    if (step % 20 == 0 || step == last_) ReportMeasured(step);
    hooks_.Step(record, std::move(timeline_));
    steps_done_ = step;
    return absl::OkStatus();
  }

  RunOutcome Succeeded() const {
    RunOutcome out;
    out.state = pb::JobStatus::SUCCEEDED;
    out.steps_done = steps_done_;
    out.configured = true;
    return out;
  }

  RunOutcome Fail(const absl::Status& s) {
    RunOutcome out;
    out.state = pb::JobStatus::FAILED;
    out.reason = std::string(s.message());
    out.lost_stage_ids = group_.lost();
    out.steps_done = steps_done_;
    out.configured = configured_;
    return out;
  }

  // Keeps the work done so far: a checkpoint of the last finished step.
  RunOutcome Cancelled(int64_t step) {
    RunOutcome out;
    out.state = pb::JobStatus::CANCELLED;
    out.reason = absl::StrCat("cancelled before step ", step);
    out.steps_done = steps_done_;
    out.configured = true;
    // A run restored from a snapshot holds a state no checkpoint may have yet.
    if (step > first_ || (start_.restored != nullptr && step > 1)) {
      if (absl::Status s = Checkpoint(step - 1); !s.ok()) {
        absl::StrAppend(&out.reason, "; the checkpoint of step ", step - 1, " failed: ", s.message());
      }
    }
    return out;
  }

  const std::string job_id_;
  const pb::JobSpec& spec_;
  const RunnerOptions& options_;
  RunnerHooks& hooks_;
  const RunStart& start_;
  const std::shared_ptr<StageConnector> connector_;
  StageGroup group_;
  planner::Plan plan_;
  std::optional<planner::MeasuredCosts> measured_;  // of this job's steps, for Predict
  bool fitted_logged_ = false;
  bool emulated_logged_ = false;
  schedule::Schedule eval_programs_;
  JobData data_;
  int64_t init_step_ = 0;   // the optimizer step of an init_from checkpoint
  int64_t first_ = 1;       // this run's first and last step, of the training run
  int64_t last_ = 0;
  int64_t steps_done_ = 0;  // the last step finished
  bool configured_ = false;
  std::vector<pb::TimelineEvent> timeline_;
};

}  // namespace

RunOutcome RunJob(const std::string& job_id, const pb::JobSpec& spec,
                  const std::vector<RunnerStage>& stages, const RunnerOptions& options,
                  RunnerHooks& hooks, const RunStart& start) {
  return Runner(job_id, spec, stages, options, hooks, start).Run();
}

}  // namespace pipetrain::coordinator
