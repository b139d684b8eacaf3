// `pipetrain timeline ID --out trace.json`: the measured timeline of a job's last steps
// as a Chrome trace file, to open in Perfetto next to `pipetrain plan --trace`; with
// --breakdown (alone or as well), where each stage's time went over those steps, as a
// table or (--json) JSON (client/timeline_breakdown.h).
#include "absl/strings/str_cat.h"
#include "client/chrome_trace.h"
#include "client/cli.h"
#include "client/remote.h"
#include "client/remote_verbs.h"
#include "client/timeline_breakdown.h"
#include "common/atomic_file.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

int RunTimeline(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  std::string out_path;
  int64_t steps = 1;
  bool breakdown = false, json = false, help = false;
  common::FlagSet flags(
      "pipetrain timeline", "ID [--out FILE] [--breakdown [--json]] [flags]",
      "With --out, writes the measured timeline of a job's last steps (every action on\n"
      "every stage, compute and link lanes) as Chrome trace JSON; open it in\n"
      "https://ui.perfetto.dev.\n"
      "With --breakdown it prints, per stage and averaged over those steps, the time in\n"
      "forward, backward (B), backward input (I), backward weight (W), recompute (the\n"
      "forward re-run inside B and I, which they then exclude), optimizer, send,\n"
      "recv-wait and idle, each also as a share of the step time (the longest stage\n"
      "span), so that every row adds up to 100%. --out and --breakdown may go together.\n\n" +
          RemoteExitCodes("a coordinator error, or --breakdown of a job no step of which has "
                          "finished"));
  flags.AddString("out", &out_path, "the trace file to write (required without --breakdown)",
                  "FILE");
  flags.AddInt("steps", &steps, "how many of the latest steps to include", "N");
  flags.AddBool("breakdown", &breakdown, "print where each stage's time went, per category");
  flags.AddBool("json", &json,
                "with --breakdown: print the breakdown as JSON only (job_id, steps, "
                "step_time_s, stages[] with *_s and shares)");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  std::string job_id;
  if (auto code = ParseJobIdVerb(flags, args, help, &connection, out, err, &job_id)) return *code;
  if (out_path.empty() && !breakdown) {
    return UsageError(flags, "--out FILE is required (or --breakdown)", err);
  }
  if (json && !breakdown) return UsageError(flags, "--json goes with --breakdown", err);
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
  if (!out_path.empty()) {
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
    // --json keeps stdout for the JSON alone.
    (json ? err : out) << "wrote " << timeline.events_size() << " events of " << job_id
                       << " to " << out_path << "; open it in https://ui.perfetto.dev\n";
  }
  if (!breakdown) return kExitOk;
  if (timeline.job_id().empty()) timeline.set_job_id(job_id);
  absl::StatusOr<TimelineBreakdown> b = BreakDownTimeline(timeline);
  if (!b.ok()) {
    err << "pipetrain timeline: " << b.status().message() << "\n";
    return kExitJobFailed;
  }
  out << (json ? BreakdownJson(*b) : BreakdownTable(*b));
  return kExitOk;
}

}  // namespace pipetrain::client
