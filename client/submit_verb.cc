// `pipetrain submit JOB.json`: checks the spec here (so a typo costs no round trip),
// submits it, and follows the job to its end with a progress bar and a summary;
// `pipetrain follow ID` follows a job already submitted the same way.
#include <sys/ioctl.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/output.h"
#include "client/progress.h"
#include "client/remote.h"
#include "client/schedule_file_read.h"
#include "client/remote_verbs.h"
#include "client/submit_verb.h"
#include "common/job_state.h"
#include "common/user_path.h"
#include "coordinator/spec/job_spec.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;

bool IsConnectionLoss(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::UNKNOWN;
}

// Follows job_id's events until it ends; returns the exit code. `spec` is what was
// submitted, with defaults, for the step count until the coordinator tells its own.
int Follow(Remote& remote, const std::string& job_id, const pb::JobSpec& spec, bool json,
           std::ostream& out, std::ostream& err) {
  const bool tty = !json && &out == &std::cout && isatty(STDOUT_FILENO);
  winsize size{};
  const int width = tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 ? size.ws_col : 0;
  ProgressPrinter progress(spec.training().steps(), tty, out, width);
  std::optional<pb::JobStatus> final_status;
  grpc::ClientContext context;
  if (grpc::Status st = remote.PrepareStream(context); !st.ok()) {
    return remote.LostWhileFollowing(st, job_id, err);
  }
  pb::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = remote.stub().WatchJob(&context, request);
  pb::JobEvent event;
  while (reader->Read(&event)) {
    if (json) out << ProtoToJson(event, /*pretty=*/false) << std::flush;
    switch (event.event_case()) {
      case pb::JobEvent::kStep:
        if (!json) progress.Step(event.step());
        break;
      case pb::JobEvent::kLog:
        if (!json) progress.Log(event.log());
        break;
      case pb::JobEvent::kStateChange:
        if (event.state_change().spec().training().steps() > 0) {
          progress.SetTotal(common::JobLastStep(event.state_change()));
        }
        if (common::JobEnded(event.state_change().state())) final_status = event.state_change();
        break;
      default:
        break;
    }
  }
  const grpc::Status status = reader->Finish();
  progress.Finish();
  if (!status.ok()) {
    return IsConnectionLoss(status.error_code()) ? remote.LostWhileFollowing(status, job_id, err)
                                                 : remote.Fail(status, err);
  }
  if (!final_status) {  // the stream ended early; ask how the job stands
    grpc::ClientContext get_context;
    remote.PrepareUnary(get_context);
    pb::GetJobRequest get;
    get.set_job_id(job_id);
    pb::JobStatus job;
    const grpc::Status got = remote.stub().GetJob(&get_context, get, &job);
    if (!got.ok() || !common::JobEnded(job.state())) {
      return remote.LostWhileFollowing(
          got.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  "the event stream ended before the job did")
                   : got,
          job_id, err);
    }
    final_status = job;
    if (json) {
      pb::JobEvent last;
      *last.mutable_state_change() = job;
      out << ProtoToJson(last, /*pretty=*/false);
    }
  }
  if (!final_status->has_spec()) *final_status->mutable_spec() = spec;
  if (!json) out << JobSummary(*final_status, progress.totals());
  return final_status->state() == pb::JobStatus::SUCCEEDED ? kExitOk : kExitJobFailed;
}

}  // namespace

int RunFollow(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  std::string job_id;
  bool json = false, help = false;
  common::FlagSet flags(
      "pipetrain follow", "ID [flags]",
      "Follows a job already submitted until it ends, as submit does: a progress bar on a\n"
      "terminal, a line every 5% of the steps otherwise, log lines, and a summary; the steps\n"
      "it has done already come first. For a script that submitted with --no-wait, or\n"
      "one that comes back to its job (deploy/slurm/pipetrain.sbatch after a requeue).\n\n" +
          RemoteExitCodes("the job failed or was cancelled"));
  flags.AddBool("json", &json, "print every event as one JSON line");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  if (auto code = ParseJobIdVerb(flags, args, help, &connection, out, err, &job_id)) return *code;
  Remote remote("follow", connection);
  pb::JobStatus job;
  if (grpc::Status st = remote.GetJob(job_id, &job, false); !st.ok()) return remote.Fail(st, err);
  const pb::JobSpec filled = coordinator::WithDefaults(job.spec());
  if (!json) out << "following " << job_id << " (" << filled.name() << ")\n";
  return Follow(remote, job_id, filled, json, out, err);
}

int RunSubmit(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> sets;
  RemoteFlags connection;
  std::string init_from;
  bool no_wait = false, json = false, help = false;
  common::FlagSet flags(
      "pipetrain submit", "JOB.json [flags]",
      "Submits a job spec (JSON, see examples/tiny-gpt.json) to the coordinator and follows\n"
      "the job until it ends: a progress bar on a terminal, a line every 5% of the steps\n"
      "otherwise, log lines, and a summary. The spec is checked here first. Ctrl-C stops\n"
      "following; the job keeps running ('pipetrain status ID', 'pipetrain cancel ID').\n\n" +
          RemoteExitCodes("the job failed or was cancelled"));
  flags.AddRepeated("set", &sets, "override a spec field, e.g. --set pipeline.stages=2",
                    "FIELD=VALUE");
  flags.AddString("init-from", &init_from,
                  "start from this checkpoint folder (on the coordinator) instead of fresh weights",
                  "DIR");
  flags.AddBool("no-wait", &no_wait, "print only the job id and return at once");
  flags.AddBool("json", &json, "print the job id (--no-wait) or every event as one JSON line");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  std::vector<std::string> positionals;
  if (auto code = ParseVerbFlags(flags, args, help, out, err, &positionals)) return *code;
  if (positionals.size() != 1) return UsageError(flags, "takes one job spec file (JOB.json)", err);
  if (!CheckRemoteFlags(flags, &connection, err)) return kExitUsage;
  const std::string& path = positionals[0];
  absl::StatusOr<std::string> text =
      common::ReadRegularFile(path, common::kMaxJsonFileBytes, "job spec");
  if (!text.ok()) {
    err << "pipetrain submit: " << text.status().message()
        << "; give the path of a job spec (JSON)\n";
    return kExitUsage;
  }
  auto overridden = coordinator::ApplyOverrides(*text, sets);
  if (!overridden.ok()) {
    err << "pipetrain submit: " << path << ": " << overridden.status().message() << "\n";
    return kExitUsage;
  }
  auto spec = coordinator::ParseJobSpec(*overridden);
  if (spec.ok() && !init_from.empty()) spec->set_init_from(init_from);
  if (spec.ok()) {
    if (absl::Status read = ReadScheduleFile(*spec, path); !read.ok()) spec = read;
  }
  absl::Status valid =
      spec.ok() ? coordinator::ValidateJobSpec(coordinator::WithDefaults(*spec)) : spec.status();
  if (!valid.ok()) {
    err << "pipetrain submit: " << path << ": invalid job spec: " << valid.message() << "\n";
    return kExitUsage;
  }

  Remote remote("submit", connection);
  return SubmitAndFollow(remote, *spec, no_wait, json, out, err);
}

int SubmitAndFollow(Remote& remote, const pb::JobSpec& spec, bool no_wait, bool json,
                    std::ostream& out, std::ostream& err) {
  grpc::ClientContext context;
  remote.PrepareUnary(context, kSubmitDeadlineSeconds);
  pb::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  pb::SubmitJobResponse response;
  if (grpc::Status st = remote.stub().SubmitJob(&context, request, &response); !st.ok()) {
    return remote.Fail(st, err, "invalid job spec: ");
  }
  if (no_wait) {
    out << (json ? ProtoToJson(response, /*pretty=*/false) : response.job_id() + "\n");
    return kExitOk;
  }
  const pb::JobSpec filled = coordinator::WithDefaults(spec);
  if (!json) out << "submitted " << response.job_id() << " (" << filled.name() << ")\n";
  return Follow(remote, response.job_id(), filled, json, out, err);
}

}  // namespace pipetrain::client
