#include "coordinator/job_runner.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/frame_proto.h"
#include "common/status_macros.h"
#include "coordinator/checkpoint_files.h"
#include "coordinator/corpus.h"
#include "coordinator/planner/forward_only.h"
#include "coordinator/planner/planner.h"
#include "coordinator/stage_client.h"
#include "coordinator/step_metrics.h"
#include "grpcpp/grpcpp.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

// Rows [mb * rows, (mb + 1) * rows) of a (B, T) token matrix as one (rows, T) tensor.
common::Tensor MicroBatch(const std::vector<int32_t>& all, int mb, int rows, int seq_len) {
  common::Tensor t = *common::Tensor::Create(common::DType::kI32, {rows, seq_len});
  std::copy(all.begin() + static_cast<size_t>(mb) * rows * seq_len,
            all.begin() + static_cast<size_t>(mb + 1) * rows * seq_len,
            t.data<int32_t>().begin());
  return t;
}

// Runs f(stage) for every stage on its own thread; returns the statuses by stage.
template <typename F>
std::vector<absl::Status> OnEveryStage(int stages, F f) {
  std::vector<absl::Status> status(stages);
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) threads.emplace_back([&, s] { status[s] = f(s); });
  for (std::thread& t : threads) t.join();
  return status;
}

class Runner {
 public:
  Runner(std::string job_id, const pb::JobSpec& spec, const std::vector<RunnerStage>& stages,
         const RunnerOptions& options, const RunnerHooks& hooks)
      : job_id_(std::move(job_id)), spec_(spec), stages_(stages), options_(options),
        hooks_(hooks) {
    for (const RunnerStage& s : stages_) {
      clients_.push_back(std::make_unique<StageClient>(s.address, options_.security));
    }
  }

  RunOutcome Run() {
    if (absl::Status s = Prepare(); !s.ok()) return Fail(s);
    const int64_t steps = spec_.training().steps();
    const int every = spec_.checkpoint().every_steps();
    const int validate = spec_.data().validate_every_steps();
    for (int64_t step = 1; step <= steps; ++step) {
      if (hooks_.cancelled()) return Cancelled(step);
      absl::StatusOr<pb::StepRecord> record = Step(step);
      if (!record.ok()) return Fail(record.status());
      if (validate > 0 && (step % validate == 0 || step == steps)) {
        absl::StatusOr<double> val = Validate(step);
        if (!val.ok()) return Fail(val.status());
        record->set_val_loss(*val);
        record->set_has_val_loss(true);
      }
      hooks_.step(*record, std::move(timeline_));
      if ((every > 0 && step % every == 0) || step == steps) {
        if (absl::Status s = Checkpoint(step); !s.ok()) return Fail(s);
      }
    }
    RunOutcome out;
    out.state = pb::JobStatus::SUCCEEDED;
    return out;
  }

 private:
  int K() const { return static_cast<int>(stages_.size()); }
  std::string StageName(int s) const {
    return absl::StrCat("stage ", s, " (", stages_[s].stage_id, " at ", stages_[s].address, ")");
  }

  absl::Status Prepare() {
    ASSIGN_OR_RETURN(planner::PlanOptions po, planner::OptionsFromJobSpec(spec_));
    // Costs for the predicted bubble: the slowest stage's FLOP rate (a CPU core is taken
    // as 10 GFLOP/s) and loopback-class links.
    double flops = 0;
    for (const RunnerStage& s : stages_) {
      const double f = s.device.peak_flops() > 0 ? s.device.peak_flops()
                                                 : 10e9 * std::max(1, s.device.threads());
      flops = flops == 0 ? f : std::min(flops, f);
    }
    po.device_flops = flops;
    po.link_bytes_per_s = 1e9;
    ASSIGN_OR_RETURN(plan_, planner::MakePlan(po));
    hooks_.log(absl::StrFormat(
        "planned %d stages, schedule %s, %d micro-batches of %d sequences; predicted bubble %.3f",
        K(), spec_.pipeline().schedule(), po.micro_batches, po.batch_size / po.micro_batches,
        plan_.simulation.bubble_fraction));
    for (int s = 0; s < K(); ++s) {
      std::string ranges;
      for (auto [b, e] : plan_.stages[s].layers) absl::StrAppend(&ranges, " [", b, ", ", e, ")");
      hooks_.log(absl::StrCat(StageName(s), " holds pipeline layers", ranges));
    }
    ASSIGN_OR_RETURN(corpus_, LoadCorpus(spec_));
    if (spec_.data().validate_every_steps() > 0) {
      ASSIGN_OR_RETURN(eval_programs_,
                       planner::ForwardOnlySchedule(K(), po.micro_batches, po.chunks));
    }
    RETURN_IF_ERROR(ConfigureAll());
    if (!spec_.init_from().empty()) RETURN_IF_ERROR(LoadInitCheckpoint());
    return absl::OkStatus();
  }

  pb::ConfigureRequest ConfigureFor(int s) const {
    pb::ConfigureRequest r;
    r.set_job_id(job_id_);
    r.set_stage(s);
    r.set_num_stages(K());
    *r.mutable_model() = spec_.model();
    for (size_t c = 0; c < plan_.stages[s].layers.size(); ++c) {
      pb::LayerRange* range = r.add_layers();
      range->set_chunk(c);
      range->set_begin_layer(plan_.stages[s].layers[c].first);
      range->set_end_layer(plan_.stages[s].layers[c].second);
    }
    r.set_seed(spec_.training().seed());
    const pb::TrainingSpec& t = spec_.training();
    pb::OptimizerConfig* o = r.mutable_optimizer();
    o->set_lr(t.lr());
    // WithDefaults has filled every optional field (see RunJob's contract).
    o->set_beta1(t.beta1());
    o->set_beta2(t.beta2());
    o->set_eps(1e-8f);
    o->set_weight_decay(t.weight_decay());
    o->set_grad_clip_norm(t.grad_clip_norm());
    if (K() > 1) {
      r.set_upstream_address(stages_[(s + K() - 1) % K()].address);
      r.set_downstream_address(stages_[(s + 1) % K()].address);
    }
    r.set_recompute(plan_.options.recompute);
    r.set_micro_batch_size(plan_.options.batch_size / plan_.options.micro_batches);
    r.set_peer_secret(secret_);
    r.set_recv_deadline_ms(options_.recv_deadline_ms);
    return r;
  }

  absl::Status ConfigureAll() {
    absl::BitGen gen;
    secret_ = absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
    std::vector<absl::Status> st = OnEveryStage(K(), [&](int s) -> absl::Status {
      absl::StatusOr<pb::ConfigureResponse> r = clients_[s]->Configure(ConfigureFor(s), options_.rpc_deadline);
      if (!r.ok()) return r.status();
      hooks_.log(absl::StrFormat("%s configured: %.1f MiB of weights, %.1f MiB of optimizer state",
                                 StageName(s), r->weight_bytes() / 1048576.0,
                                 r->optimizer_bytes() / 1048576.0));
      return absl::OkStatus();
    });
    return FirstError(st, 0, "configuring");
  }

  absl::Status LoadInitCheckpoint() {
    ASSIGN_OR_RETURN(compute::Checkpoint whole, LoadWholeCheckpoint(spec_.init_from(), "init_from"));
    if (!(whole.config == plan_.options.model) || whole.layer_begin != 0 ||
        whole.layer_end != plan_.options.model.n_layers + 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_from: '", spec_.init_from(), "' is not a whole checkpoint of this job's model "
          "(compare its config with the spec's model fields)"));
    }
    if (whole.optimizer) data_offset_ = whole.optimizer->step;
    std::vector<absl::Status> st = OnEveryStage(K(), [&](int s) -> absl::Status {
      for (size_t c = 0; c < plan_.stages[s].layers.size(); ++c) {
        auto [b, e] = plan_.stages[s].layers[c];
        ASSIGN_OR_RETURN(compute::Checkpoint part, SliceCheckpoint(whole, b, e));
        ASSIGN_OR_RETURN(std::string bytes, compute::SerializeCheckpoint(part));
        RETURN_IF_ERROR(clients_[s]->ImportShard(job_id_, static_cast<int>(c), bytes,
                                                 options_.rpc_deadline));
      }
      return absl::OkStatus();
    });
    RETURN_IF_ERROR(FirstError(st, 0, "loading init_from on"));
    hooks_.log(absl::StrCat("started from ", spec_.init_from(),
                            whole.optimizer ? absl::StrCat(" (AdamW state at update ",
                                                           whole.optimizer->step,
                                                           "; batches continue from there)")
                                            : " (weights only)"));
    return absl::OkStatus();
  }

  // Runs call(stage, context) on every stage at once, each context carrying the step
  // deadline. When a stage fails, the calls still open are cancelled so the job fails
  // promptly.
  template <typename F>
  std::vector<absl::Status> OnEveryStageCancellingOnError(F call) {
    std::vector<std::unique_ptr<grpc::ClientContext>> calls;
    for (int s = 0; s < K(); ++s) {
      calls.push_back(std::make_unique<grpc::ClientContext>());
      calls.back()->set_deadline(absl::ToChronoTime(absl::Now() + options_.step_deadline));
    }
    std::once_flag cancel_once;
    return OnEveryStage(K(), [&](int s) -> absl::Status {
      absl::Status status = call(s, *calls[s]);
      if (!status.ok()) {
        std::call_once(cancel_once, [&] {
          for (int o = 0; o < K(); ++o) if (o != s) calls[o]->TryCancel();
        });
      }
      return status;
    });
  }

  // Runs one program set on every stage at once. With defer_optimizer the stages only
  // report their grad_norm_sq at OPTIMIZER_STEP and wait for ApplyOnAll.
  absl::StatusOr<std::vector<pb::RunStepResponse>> RunOnAll(int64_t step,
                                                            const schedule::Schedule& programs,
                                                            const compute::TokenBatch& batch,
                                                            float lr, const char* what,
                                                            bool defer_optimizer = false) {
    const int M = plan_.options.micro_batches, T = plan_.options.model.seq_len;
    const int rows = batch.rows / M;
    std::vector<pb::RunStepResponse> out(K());
    std::vector<absl::Status> st =
        OnEveryStageCancellingOnError([&](int s, grpc::ClientContext& ctx) -> absl::Status {
      pb::RunStepRequest req;
      req.set_job_id(job_id_);
      req.set_step(step);
      *req.mutable_program() = schedule::ToProto(programs[s]);
      for (int mb = 0; mb < M; ++mb) {
        if (s == 0) common::TensorToProto(MicroBatch(batch.inputs, mb, rows, T), req.add_tokens());
        if (s == K() - 1) {
          common::TensorToProto(MicroBatch(batch.targets, mb, rows, T), req.add_targets());
        }
      }
      req.set_lr(lr);
      req.set_defer_optimizer(defer_optimizer);
      ASSIGN_OR_RETURN(out[s], clients_[s]->RunStep(ctx, req));
      return absl::OkStatus();
    });
    RETURN_IF_ERROR(FirstError(st, step, what));
    return out;
  }

  // Phase 2 of a step whose optimizer was deferred: the norm over the whole model from
  // every stage's share, then every stage's optimizer step clipped by it (as
  // torch.nn.utils.clip_grad_norm_ on one device). Each optimizer action's timing joins
  // its stage's response, so the step's record and timeline show it.
  absl::Status ApplyOnAll(int64_t step, float lr, std::vector<pb::RunStepResponse>& responses) {
    double sum_sq = 0;
    for (const pb::RunStepResponse& r : responses) sum_sq += r.grad_norm_sq();
    const double global_norm = std::sqrt(sum_sq);
    std::vector<absl::Status> st =
        OnEveryStageCancellingOnError([&](int s, grpc::ClientContext& ctx) -> absl::Status {
      pb::ApplyOptimizerRequest req;
      req.set_job_id(job_id_);
      req.set_step(step);
      req.set_global_grad_norm(global_norm);
      req.set_lr(lr);
      ASSIGN_OR_RETURN(pb::ApplyOptimizerResponse r, clients_[s]->ApplyOptimizer(ctx, req));
      *responses[s].add_timings() = r.timing();
      return absl::OkStatus();
    });
    return FirstError(st, step, "applying the optimizer on");
  }

  // The rate of this job's step `step`. A job started from a checkpoint (init_from)
  // continues its schedule: the warm-up counts the steps the checkpoint already took,
  // as the data order and AdamW's step do, so a resumed run equals an unbroken one.
  float LearningRate(int64_t job_step) const {
    const pb::TrainingSpec& t = spec_.training();
    const int64_t step = data_offset_ + job_step;
    if (t.warmup_steps() > 0 && step < t.warmup_steps()) {
      return t.lr() * static_cast<float>(step) / static_cast<float>(t.warmup_steps());
    }
    return t.lr();
  }

  absl::StatusOr<pb::StepRecord> Step(int64_t step) {
    const pb::TrainingSpec& t = spec_.training();
    ASSIGN_OR_RETURN(compute::TokenBatch batch,
                     TrainingBatch(corpus_, plan_.options.model, t.batch_size(), t.seed(),
                                   data_offset_ + step));
    const absl::Time start = absl::Now();
    const float lr = LearningRate(step);
    // Clipping needs the norm over the whole model, which no stage has alone: two phases.
    const bool two_phase = t.grad_clip_norm() > 0 && K() > 1;
    ASSIGN_OR_RETURN(std::vector<pb::RunStepResponse> responses,
                     RunOnAll(step, plan_.programs, batch, lr, "running", two_phase));
    if (two_phase) RETURN_IF_ERROR(ApplyOnAll(step, lr, responses));
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    timeline_ = TimelineOf(step, responses);
    return MakeStepRecord(step, responses, wall,
                          static_cast<int64_t>(t.batch_size()) * plan_.options.model.seq_len,
                          plan_.simulation.bubble_fraction);
  }

  absl::StatusOr<double> Validate(int64_t step) {
    ASSIGN_OR_RETURN(compute::TokenBatch batch,
                     ValidationBatch(corpus_, plan_.options.model, spec_.training().batch_size(),
                                     spec_.training().seed()));
    ASSIGN_OR_RETURN(std::vector<pb::RunStepResponse> responses,
                     RunOnAll(step, eval_programs_, batch, 0, "validating"));
    return MeanLoss(responses, step);
  }

  absl::Status Checkpoint(int64_t step) {
    const int chunks = plan_.options.chunks;
    std::vector<std::vector<ShardFile>> files(K());
    std::vector<absl::Status> st = OnEveryStage(K(), [&](int s) -> absl::Status {
      for (int c = 0; c < static_cast<int>(plan_.stages[s].layers.size()); ++c) {
        ASSIGN_OR_RETURN(std::string bytes, clients_[s]->ExportShard(job_id_, c, options_.rpc_deadline));
        files[s].push_back({s, c, std::move(bytes)});
      }
      return absl::OkStatus();
    });
    RETURN_IF_ERROR(FirstError(st, step, "checkpointing"));
    std::vector<ShardFile> all;
    for (auto& f : files) for (auto& one : f) all.push_back(std::move(one));
    const std::string dir = absl::StrCat(options_.checkpoint_root, "/step-", step);
    if (absl::Status s = WriteCheckpointFolder(dir, all, chunks); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("step ", step, ": writing the checkpoint: ", s.message()));
    }
    hooks_.checkpoint(dir, step);
    return absl::OkStatus();
  }

  // The error to report for a stage operation: a stage that no longer answers is the
  // cause (its neighbours only report the broken link), else the first failure.
  absl::Status FirstError(const std::vector<absl::Status>& st, int64_t step, const char* what) {
    // The first failure that is not our own cancellation of the others' calls.
    int first = -1;
    for (int s = 0; s < K(); ++s) {
      if (st[s].ok()) continue;
      if (first < 0 || (absl::IsCancelled(st[first]) && !absl::IsCancelled(st[s]))) first = s;
    }
    if (first < 0) return absl::OkStatus();
    const std::string when = step > 0 ? absl::StrCat(" at step ", step) : "";
    for (int s = 0; s < K(); ++s) {
      if (clients_[s]->Ping(absl::Seconds(3)).ok()) continue;
      lost_.push_back(stages_[s].stage_id);
      // Its own call was most likely cancelled by us; a neighbour's error says more.
      const absl::Status& own =
          st[s].ok() || absl::IsCancelled(st[s]) ? st[first] : st[s];
      return absl::UnavailableError(absl::StrCat(
          StageName(s), " stopped answering", when, " (", own.message(),
          "); the job's other stages are free again"));
    }
    return absl::Status(st[first].code(), absl::StrCat(what, " ", StageName(first), " failed",
                                                       when, ": ", st[first].message()));
  }

  RunOutcome Fail(const absl::Status& s) {
    RunOutcome out;
    out.state = pb::JobStatus::FAILED;
    out.reason = std::string(s.message());
    out.lost_stage_ids = lost_;
    return out;
  }

  // Keeps the work done so far: a checkpoint of the last finished step.
  RunOutcome Cancelled(int64_t step) {
    RunOutcome out;
    out.state = pb::JobStatus::CANCELLED;
    out.reason = absl::StrCat("cancelled before step ", step);
    if (step > 1) {
      if (absl::Status s = Checkpoint(step - 1); !s.ok()) {
        absl::StrAppend(&out.reason, "; the checkpoint of step ", step - 1, " failed: ", s.message());
      }
    }
    return out;
  }

  const std::string job_id_;
  const pb::JobSpec& spec_;
  const std::vector<RunnerStage>& stages_;
  const RunnerOptions& options_;
  const RunnerHooks& hooks_;
  std::vector<std::unique_ptr<StageClient>> clients_;
  planner::Plan plan_;
  schedule::Schedule eval_programs_;
  Corpus corpus_;
  std::string secret_;
  int64_t data_offset_ = 0;
  std::vector<pb::TimelineEvent> timeline_;
  std::vector<std::string> lost_;
};

}  // namespace

RunOutcome RunJob(const std::string& job_id, const pb::JobSpec& spec,
                  const std::vector<RunnerStage>& stages, const RunnerOptions& options,
                  const RunnerHooks& hooks) {
  return Runner(job_id, spec, stages, options, hooks).Run();
}

}  // namespace pipetrain::coordinator
