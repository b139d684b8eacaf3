// `pipetrain status ID`, `pipetrain list` and `pipetrain cancel ID`: one unary RPC each,
// printed for people (a summary, a table) or as JSON for scripts.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli.h"
#include "client/output.h"
#include "client/remote.h"
#include "client/remote_verbs.h"
#include "common/job_state.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;

std::string StateName(pb::JobStatus::State s) { return pb::JobStatus::State_Name(s); }

std::string StepsText(const pb::JobStatus& job) {
  return absl::StrCat(job.steps_done(), "/", common::JobLastStep(job));
}

std::string StatusText(const pb::JobStatus& job) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"job", job.job_id()}, {"name", job.spec().name()}, {"state", StateName(job.state())}};
  if (!job.reason().empty()) rows.push_back({"reason", job.reason()});
  rows.push_back({"steps", StepsText(job)});
  if (job.history_size() > 0) {
    const pb::StepRecord& last = job.history(job.history_size() - 1);
    rows.push_back({"loss", absl::StrFormat("%.4f (step %d)", last.loss(), last.step())});
    for (int i = job.history_size() - 1; i >= 0; --i) {
      if (job.history(i).has_val_loss()) {
        rows.push_back({"val loss", absl::StrFormat("%.4f (step %d)", job.history(i).val_loss(),
                                                    job.history(i).step())});
        break;
      }
    }
    rows.push_back({"throughput", absl::StrCat(WithThousands(std::llround(last.tokens_per_s())),
                                               " tok/s (last step)")});
    rows.push_back({"bubble", absl::StrFormat("%.2f measured, %.2f predicted (last step)",
                                              last.bubble_measured(), last.bubble_predicted())});
  }
  const auto& p = job.spec().pipeline();
  rows.push_back({"pipeline", absl::StrCat(p.schedule(), ", ", p.stages(), " stages, ",
                                           p.micro_batches(), " micro-batches")});
  if (job.has_auto_plan()) {
    // pipeline.schedule "auto": what was chosen and why, and the prediction against
    // what the steps took.
    const pb::AutoPlan& a = job.auto_plan();
    rows.push_back({"auto plan", absl::StrCat(a.shape(), "; costs ", a.cost_source())});
    rows.push_back({"why", a.reason()});
    rows.push_back({"step time",
                    a.steps_measured() > 0
                        ? absl::StrFormat("%.4g s predicted, %.4g s measured (median of %d "
                                          "steps, the first left out: %+.1f%%)",
                                          a.predicted_step_s(), a.measured_step_s(),
                                          a.steps_measured(),
                                          100 * (a.measured_step_s() / a.predicted_step_s() - 1))
                        : absl::StrFormat("%.4g s predicted, none measured yet",
                                          a.predicted_step_s())});
  }
  if (job.stage_ids_size() > 0) rows.push_back({"stages", absl::StrJoin(job.stage_ids(), ", ")});
  if (!job.device_sharing().empty()) rows.push_back({"devices", job.device_sharing()});
  if (!job.checkpoint_dir().empty()) rows.push_back({"checkpoint", job.checkpoint_dir()});
  // Each automatic restart after a lost stage, oldest first.
  for (const pb::Recovery& r : job.recoveries()) {
    rows.push_back({"restart", absl::StrCat(absl::StrJoin(r.lost_stage_ids(), ", "),
                                            " lost at step ", r.failed_step(), "; from ",
                                            r.restored_step() > 0
                                                ? absl::StrCat("step ", r.restored_step())
                                                : std::string("the start"),
                                            " (", r.source(), ") on ",
                                            common::JobLayoutText(job.spec().pipeline().replicas(),
                                                                  r.replicas(), r.stages()))});
  }
  rows.push_back({"created", TimeText(job.created())});
  if (IsSet(job.started())) rows.push_back({"started", TimeText(job.started())});
  if (IsSet(job.finished())) rows.push_back({"finished", TimeText(job.finished())});
  std::string out;
  for (const auto& [key, value] : rows) {
    absl::StrAppend(&out, absl::StrFormat("%-11s %s\n", key, value));
  }
  return out;
}

}  // namespace

int RunStatus(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  std::string job_id;
  bool json = false, help = false;
  common::FlagSet flags("pipetrain status", "ID [flags]",
                        "Shows a job: state (and why it failed), steps done, last loss and "
                        "bubble, stages,\ncheckpoint, automatic restarts and times; for "
                        "pipeline.schedule \"auto\", the plan chosen,\nwhy, and its predicted "
                        "step time next to the measured one. It reports whatever the job's "
                        "state; it does not judge it.\n\n" +
                            RemoteExitCodes("a coordinator error",
                                            "the job was found, whatever its state"));
  flags.AddBool("json", &json,
                "print the job with its step history (history[]: step, loss, step_time_s, ...)");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  if (auto code = ParseJobIdVerb(flags, args, help, &connection, out, err, &job_id)) return *code;
  Remote remote("status", connection);
  pb::JobStatus job;
  // With the history: the last loss, and --json's history.
  if (grpc::Status st = remote.GetJob(job_id, &job, true); !st.ok()) return remote.Fail(st, err);
  out << (json ? ProtoToJson(job) : StatusText(job));
  return kExitOk;
}

int RunList(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  int64_t limit = 0;
  bool json = false, help = false;
  common::FlagSet flags("pipetrain list", "[flags]",
                        "Lists the coordinator's jobs, most recent first.\n\n" +
                            RemoteExitCodes("a coordinator error"));
  flags.AddInt("limit", &limit, "show at most N jobs (0 = all)");
  flags.AddBool("json", &json, "print the ListJobsResponse as JSON");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  if (auto code = ParseVerbFlags(flags, args, help, out, err)) return *code;
  if (limit < 0) return UsageError(flags, "--limit must be >= 0", err);
  if (!CheckRemoteFlags(flags, &connection, err)) return kExitUsage;
  Remote remote("list", connection);
  grpc::ClientContext context;
  remote.PrepareUnary(context);
  pb::ListJobsRequest request;
  request.set_limit(static_cast<int>(std::min<int64_t>(limit, 1 << 30)));
  pb::ListJobsResponse response;
  if (grpc::Status st = remote.stub().ListJobs(&context, request, &response); !st.ok()) {
    return remote.Fail(st, err);
  }
  if (json) {
    out << ProtoToJson(response);
    return kExitOk;
  }
  if (response.jobs_size() == 0) {
    out << "no jobs yet; submit one with 'pipetrain submit JOB.json'\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const pb::JobStatus& job : response.jobs()) {
    // The list carries no history unless the coordinator adds it; then LOSS stays blank.
    const std::string loss =
        job.history_size() > 0
            ? absl::StrFormat("%.4f", job.history(job.history_size() - 1).loss())
            : "";
    rows.push_back({job.job_id(), StateName(job.state()), job.spec().name(), StepsText(job), loss,
                    TimeText(job.created())});
  }
  out << RenderTable({"ID", "STATE", "NAME", "STEPS", "LOSS", "CREATED"}, rows);
  return kExitOk;
}

int RunCancel(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  std::string job_id;
  bool help = false;
  common::FlagSet flags("pipetrain cancel", "ID [flags]",
                        "Cancels a queued or running job and prints its new state. A queued job\n"
                        "ends at once; a running one after its current step, with a checkpoint.\n"
                        "Cancelling an ended job changes nothing and shows its state.\n\n" +
                            RemoteExitCodes("a coordinator error"));
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  if (auto code = ParseJobIdVerb(flags, args, help, &connection, out, err, &job_id)) return *code;
  Remote remote("cancel", connection);
  grpc::ClientContext context;
  remote.PrepareUnary(context);
  pb::CancelJobRequest request;
  request.set_job_id(job_id);
  pb::JobStatus job;
  if (grpc::Status st = remote.stub().CancelJob(&context, request, &job); !st.ok()) {
    return remote.Fail(st, err);
  }
  out << job.job_id() << ": " << StateName(job.state());
  if (!job.reason().empty()) out << " (" << job.reason() << ")";
  out << "\n";
  return kExitOk;
}

}  // namespace pipetrain::client
