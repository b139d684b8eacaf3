// `pipetrain logs ID [-f]`: the job's log lines so far, or (-f) followed until it ends.
#include "client/cli.h"
#include "client/output.h"
#include "client/remote.h"
#include "client/remote_verbs.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

int RunLogs(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  bool follow = false, help = false;
  common::FlagSet flags("pipetrain logs", "ID [flags]",
                        "Prints a job's log lines as \"TIME  TEXT\" (UTC), and with -f keeps "
                        "printing them\nuntil the job ends.\n\n" +
                            RemoteExitCodes("a coordinator error"));
  flags.AddBool("follow", &follow, "keep following until the job ends");
  flags.AddShort('f', "follow");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  std::string job_id;
  if (auto code = ParseJobIdVerb(flags, args, help, &connection, out, err, &job_id)) return *code;
  Remote remote("logs", connection);
  grpc::ClientContext context;
  if (grpc::Status st = remote.PrepareStream(context); !st.ok()) return remote.Fail(st, err);
  pb::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_no_follow(!follow);
  auto reader = remote.stub().WatchJob(&context, request);
  pb::JobEvent event;
  bool received = false;
  while (reader->Read(&event)) {
    received = true;
    if (event.event_case() != pb::JobEvent::kLog) continue;
    out << TimeTextMillis(event.log().time()) << "  " << event.log().text() << "\n" << std::flush;
  }
  const grpc::Status status = reader->Finish();
  if (status.ok()) return kExitOk;
  if (follow && received && status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return remote.LostWhileFollowing(status, job_id, err);
  }
  return remote.Fail(status, err);
}

}  // namespace pipetrain::client
