// `pipetrain resume ID`: runs a failed or cancelled job's remaining steps as a new job,
// from its latest checkpoint (client/resume_spec.h says what carries over), and follows
// it like submit.
#include <iostream>

#include "client/cli.h"
#include "client/output.h"
#include "client/remote.h"
#include "client/remote_verbs.h"
#include "client/resume_spec.h"
#include "client/submit_verb.h"
#include "coordinator/spec/job_spec.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

int RunResume(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> sets;
  RemoteFlags connection;
  bool no_wait = false, json = false, help = false;
  common::FlagSet flags(
      "pipetrain resume", "ID [flags]",
      "Continues a failed or cancelled job: submits its spec again as a new job that starts\n"
      "from the job's latest checkpoint and runs the steps it had left. Weights, AdamW\n"
      "state, data order and learning-rate warm-up carry on from the checkpoint, so the\n"
      "losses are those of an unbroken run. Follows the new job like submit.\n\n" +
          RemoteExitCodes("the new job failed or was cancelled"));
  flags.AddRepeated("set", &sets,
                    "override a field of the resumed spec, e.g. --set pipeline.stages=3 when a "
                    "stage is gone",
                    "FIELD=VALUE");
  flags.AddBool("no-wait", &no_wait, "print only the new job's id and return at once");
  flags.AddBool("json", &json, "print the job id (--no-wait) or every event as one JSON line");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  std::string job_id;
  if (auto code = ParseJobIdVerb(flags, args, help, &connection, out, err, &job_id)) return *code;

  Remote remote("resume", connection);
  pb::JobStatus job;
  if (grpc::Status st = remote.GetJob(job_id, &job); !st.ok()) return remote.Fail(st, err);
  absl::StatusOr<pb::JobSpec> spec = ResumeSpec(job);
  if (spec.ok() && !sets.empty()) {
    auto overridden = coordinator::ApplyOverrides(coordinator::JobSpecToJson(*spec), sets);
    spec = overridden.ok() ? coordinator::ParseJobSpec(*overridden) : overridden.status();
  }
  absl::Status valid =
      spec.ok() ? coordinator::ValidateJobSpec(coordinator::WithDefaults(*spec)) : spec.status();
  if (!valid.ok()) {
    err << "pipetrain resume: " << valid.message() << "\n";
    return kExitUsage;
  }
  if (!json && !no_wait) {
    out << "resuming " << job.job_id() << " from " << spec->init_from() << ": "
        << spec->training().steps() << " steps left\n";
  }
  return SubmitAndFollow(remote, *spec, no_wait, json, out, err);
}

}  // namespace pipetrain::client
