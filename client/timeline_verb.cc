// `pipetrain timeline ID --out trace.json`: the measured timeline of a job's last steps
// as a Chrome trace file, to open in Perfetto next to `pipetrain plan --trace`.
#include "absl/strings/str_cat.h"
#include "client/chrome_trace.h"
#include "client/cli.h"
#include "client/remote.h"
#include "client/remote_verbs.h"
#include "common/atomic_file.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

int RunTimeline(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  std::string out_path;
  int64_t steps = 1;
  bool help = false;
  common::FlagSet flags(
      "pipetrain timeline", "ID --out FILE [flags]",
      "Writes the measured timeline of a job's last steps (every action on every stage,\n"
      "compute and link lanes) as Chrome trace JSON; open it in https://ui.perfetto.dev.\n\n" +
          RemoteExitCodes("a coordinator error"));
  flags.AddString("out", &out_path, "the trace file to write", "FILE");
  flags.MarkRequired("out");
  flags.AddInt("steps", &steps, "how many of the latest steps to include", "N");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  std::string job_id;
  if (auto code = ParseJobIdVerb(flags, args, help, &connection, out, err, &job_id)) return *code;
  if (out_path.empty()) return UsageError(flags, "--out FILE is required", err);
  if (steps < 1 || steps > (1 << 20)) return UsageError(flags, "--steps must be >= 1", err);
  Remote remote("timeline", connection);
  grpc::ClientContext context;
  remote.PrepareUnary(context);
  pb::GetTimelineRequest request;
  request.set_job_id(job_id);
  request.set_last_steps(static_cast<int>(steps));
  pb::Timeline timeline;
  if (grpc::Status st = remote.stub().GetTimeline(&context, request, &timeline); !st.ok()) {
    return remote.Fail(st, err);
  }
  if (timeline.events_size() == 0) {
    err << "pipetrain timeline: " << job_id
        << " has no timeline yet (no step has finished); the trace is empty\n";
  }
  const std::string trace = TimelineToChromeTrace(timeline);
  absl::Status written = [&]() -> absl::Status {
    auto writer = common::AtomicFileWriter::Open(out_path);
    if (!writer.ok()) return writer.status();
    if (absl::Status s = writer->Write(trace); !s.ok()) return s;
    return writer->Commit();
  }();
  if (!written.ok()) {
    err << "pipetrain timeline: cannot write " << out_path << ": " << written.message() << "\n";
    return kExitUsage;
  }
  out << "wrote " << timeline.events_size() << " events of " << job_id << " to " << out_path
      << "; open it in https://ui.perfetto.dev\n";
  return kExitOk;
}

}  // namespace pipetrain::client
