#include "stage_server/runtime/stage_runtime.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/error_context.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "stage_server/collective/reducer_choice.h"
#include "stage_server/runtime/stage_runtime_job.h"

namespace pipetrain::stage_server {
namespace {

bool HasOptimizerStep(const schedule::StageProgram& program) {
  return std::any_of(program.actions.begin(), program.actions.end(), [](const schedule::Action& a) {
    return a.kind == schedule::ActionKind::kOptimizerStep;
  });
}

// What a step's errors are about.
common::ErrorContext StepContext(const JobConfig& config, uint64_t step) {
  return common::ErrorContext()
      .Job(config.job_id)
      .Stage(config.stage)
      .Step(static_cast<int64_t>(step));
}

}  // namespace

StageRuntime::StageRuntime(RuntimeOptions options) : options_(std::move(options)) {}

StageRuntime::~StageRuntime() {
  absl::MutexLock lock(&mu_);
  ForgetLinks();
  current_.job.reset();
}

void StageRuntime::AbortRunningStep() {
  {
    absl::MutexLock lock(&abort_mu_);
    for (PeerLink* link : abortable_.links) link->Close();  // idempotent; fails its waits at once
    // A step waiting in the replicas' all-reduce stops waiting (the collective itself
    // cannot be interrupted; its call ends at its own deadline, on its worker).
    if (abortable_.executor != nullptr) {
      abortable_.executor->AbortReduction(
          "the stage was configured again while this step waited for the other replicas' "
          "gradients");
    }
  }
  // A step still waiting for its upstream neighbour to connect stops waiting too.
  if (const std::string job_id = PublishedJobId(); !job_id.empty()) acceptor_.Forget(job_id);
}

void StageRuntime::DropLink(std::unique_ptr<PeerLink>& link) {
  {
    absl::MutexLock lock(&abort_mu_);
    std::vector<PeerLink*>& links = abortable_.links;
    links.erase(std::remove(links.begin(), links.end(), link.get()), links.end());
  }
  link.reset();
}

std::vector<LinkPathInfo> StageRuntime::LinkPaths() {
  absl::MutexLock lock(&abort_mu_);
  std::vector<LinkPathInfo> paths;
  for (PeerLink* link : abortable_.links) {
    paths.push_back({link->peer_stage(), link->sending_path(), link->receiving_path(),
                     link->bytes_sent(), link->bytes_sent_same_host()});
  }
  return paths;
}

void StageRuntime::ForgetLinks() {
  absl::MutexLock lock(&abort_mu_);
  abortable_ = Abortable();  // the job that owns them goes next
}

std::string StageRuntime::PublishedJobId() const {
  absl::MutexLock lock(&published_mu_);
  return published_.job_id;
}

absl::Status StageRuntime::EnsureLinks(Job& job) {
  const JobConfig& c = job.config;
  const absl::Time deadline = absl::Now() + c.recv_timeout;
  if (job.links.next && job.next == nullptr) {
    auto channel =
        grpc::CreateCustomChannel(c.downstream_address, options_.security.ChannelCredentials(),
                                  common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
    ASSIGN_OR_RETURN(job.next,
                     ConnectPeerLink(channel, WithTransport(DownstreamLinkOptions(c)), c.peer_secret, deadline));
  }
  if (job.links.prev && job.prev == nullptr) {
    ASSIGN_OR_RETURN(job.prev, acceptor_.WaitForPeer(c.job_id, UpstreamLinkOptions(c).peer_stage,
                                                     deadline));
  }
  RETURN_IF_ERROR(EnsureReplicas(job));
  absl::MutexLock lock(&abort_mu_);
  abortable_.links.clear();
  for (PeerLink* link : {job.next.get(), job.prev.get()}) {
    if (link != nullptr) abortable_.links.push_back(link);
  }
  return absl::OkStatus();
}

collective::ReducerOptions StageRuntime::RingOptions(const std::string& job_id,
                                                     const std::string& prefix, int replica,
                                                     int replicas, absl::Duration deadline) const {
  collective::ReducerOptions ro;
  ro.job_id = job_id;
  ro.replica = replica;
  ro.replicas = replicas;
  ro.rendezvous_prefix = prefix;
  ro.coordinator_address = options_.coordinator_address;
  ro.security = options_.security;
  ro.listen_host = options_.listen_host;
  ro.connect_deadline = deadline;
  return ro;
}

absl::Status StageRuntime::EnsureReplicas(Job& job) const {
  const JobConfig& c = job.config;
  if (c.replicas < 2 || job.emulated) return absl::OkStatus();
  {
    absl::MutexLock lock(&job.reducer->mu);
    if (job.reducer->reducer != nullptr) return absl::OkStatus();
  }
  collective::ReducerOptions ro =
      RingOptions(c.job_id, c.rendezvous_prefix, c.replica, c.replicas, c.recv_timeout);
  ro.stage = c.stage;
  ASSIGN_OR_RETURN(collective::ChosenReducer chosen,
                   collective::CreateReducer(ro, CudaIndexOf(options_.device)));
  common::LogInfo("replicas", absl::StrCat("job ", c.job_id, " stage ", c.stage, " replica ",
                                           c.replica, " of ", c.replicas, " reduces with ",
                                           chosen.choice.reason));
  absl::MutexLock lock(&job.reducer->mu);
  job.reducer->reducer = std::move(chosen.reducer);
  return absl::OkStatus();
}

absl::StatusOr<StepReport> StageRuntime::RunStep(StepRequest request) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckStepRequest(request));
  Job& job = *current_.job;
  RETURN_IF_ERROR(ReconnectLinks(job, request.step));
  Executor& ex = *job.executor;
  ex.SetNeighbours(job.next.get(), job.prev.get());  // the links of this step
  request.inputs.step = request.step;
  const bool deferred = request.inputs.defer_optimizer;
  ASSIGN_OR_RETURN(StepResult result, ex.RunStep(request.program, std::move(request.inputs)));
  job.last_step = request.step;
  ++current_.steps_run;
  current_.last_step_sent = result.bytes_sent;
  current_.last_step_received = result.bytes_received;
  // Emulated stages hold no weights; an evaluation updates nothing to keep.
  if (request.snapshot && !job.emulated && HasOptimizerStep(request.program)) {
    if (deferred) {
      job.snapshot_after_apply = request.step;
    } else {
      RETURN_IF_ERROR(TakeSnapshot(job, request.step));
    }
  }
  StepReport report;
  report.snapshots = snapshot_figures();
  // What the planner predicts (planner::StagePlan::peak_memory_bytes), part by part.
  report.peak_memory_bytes = job.state_bytes + job.table_bytes + report.snapshots.bytes +
                             result.peak_activation_bytes;
  report.emulated = job.emulated;
  report.result = std::move(result);
  return report;
}

absl::Status StageRuntime::CheckStepRequest(const StepRequest& request) const {
  const common::ErrorContext context =
      common::ErrorContext().Job(request.job_id).Step(static_cast<int64_t>(request.step));
  if (!current_.job) {
    return context.Error(absl::StatusCode::kFailedPrecondition, "this stage is not configured");
  }
  const Job& job = *current_.job;
  if (request.job_id != job.config.job_id) {
    return context.Error(absl::StatusCode::kFailedPrecondition,
                         absl::StrCat("this stage is configured for job '", job.config.job_id,
                                      "' (field job_id)"));
  }
  // An evaluation (forward-only program) may share the number of the training step it
  // follows: that step's frames have all been consumed by then.
  if (job.last_step && (request.step < *job.last_step ||
                        (request.step == *job.last_step && !request.program.forward_only))) {
    return StepContext(job.config, request.step)
        .Error(absl::StatusCode::kInvalidArgument,
               absl::StrCat("step ", *job.last_step,
                            " already ran; steps must increase, except an evaluation after its "
                            "step (field step)"));
  }
  // Before any link work: the pending optimizer step must be applied first.
  return job.executor->CheckNoPendingOptimizer(absl::StrCat("step ", request.step));
}

absl::Status StageRuntime::ReconnectLinks(Job& job, uint64_t step) {
  job.snapshot_after_apply.reset();
  // A failed link is rebuilt at the next step rather than leaving the stage stuck: the
  // upstream neighbour connects again, so it is expected again.
  if (job.next && !job.next->status().ok()) DropLink(job.next);
  if (job.prev && !job.prev->status().ok()) {
    DropLink(job.prev);
    acceptor_.Expect(WithTransport(UpstreamLinkOptions(job.config)), job.config.peer_secret);
  }
  return StepContext(job.config, step).Wrap(EnsureLinks(job));
}

absl::StatusOr<ActionTiming> StageRuntime::ApplyOptimizer(const ApplyOptimizerRequest& request) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJob(common::ErrorContext("apply optimizer")
                               .Job(request.job_id)
                               .Step(static_cast<int64_t>(request.step)),
                           request.job_id));
  Job& job = *current_.job;
  ASSIGN_OR_RETURN(ActionTiming timing, job.executor->ApplyOptimizer(
                                            request.step, request.global_grad_norm, request.lr));
  if (job.snapshot_after_apply == request.step) {
    job.snapshot_after_apply.reset();
    RETURN_IF_ERROR(TakeSnapshot(job, request.step));
  }
  return timing;
}

RuntimeStats StageRuntime::Stats() const {
  absl::MutexLock lock(&mu_);
  RuntimeStats s;
  s.memory_limit_bytes = options_.memory_limit_bytes;
  s.steps_run = current_.steps_run;
  s.last_step_bytes_sent = current_.last_step_sent;
  s.last_step_bytes_received = current_.last_step_received;
  if (current_.job) {
    const Job& job = *current_.job;
    s.job_id = job.config.job_id;
    s.memory_used_bytes = job.state_bytes + job.table_bytes + snapshots_.bytes();
    for (PeerLink* l : {job.next.get(), job.prev.get()}) {
      if (l == nullptr) continue;
      s.bytes_sent += l->bytes_sent();
      s.bytes_received += l->bytes_received();
    }
  }
  return s;
}

std::string StageRuntime::current_job_id() const { return PublishedJobId(); }

bool StageRuntime::configured() const {
  absl::MutexLock lock(&mu_);
  return current_.job != nullptr;
}

}  // namespace pipetrain::stage_server
