// `pipetrain cluster`: the stage servers the coordinator knows, with their devices,
// memory, state, job, the age of their last heartbeat and how their job's peer links move
// tensors (shared memory or the stream).
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli.h"
#include "client/output.h"
#include "client/remote.h"
#include "client/remote_verbs.h"
#include "common/byte_format.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

namespace {

// "1:shm/shm 3:tcp/shm": per peer link, the neighbour and each direction's path
// ("shm": through shared memory; "tcp": on the stream); "-" without links.
std::string LinksText(const pb::StageInfo& s) {
  if (s.links().empty()) return "-";
  auto path = [](const std::string& p) {
    return p.rfind("shared memory", 0) == 0 ? "shm" : "tcp";
  };
  std::string text;
  for (const pb::LinkPath& l : s.links()) {
    absl::StrAppend(&text, text.empty() ? "" : " ", l.peer_stage(), ":", path(l.sending()), "/",
                    path(l.receiving()));
  }
  return text;
}

}  // namespace

int RunCluster(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RemoteFlags connection;
  bool json = false, help = false;
  common::FlagSet flags("pipetrain cluster", "[flags]",
                        "Lists the stage servers registered with the coordinator: address, "
                        "device, how it\nruns training.precision bf16 (native; slow: no bf16 "
                        "instructions, same numbers;\nnone: refuses it), memory, state (IDLE, "
                        "BUSY, LOST), job, last heartbeat and, per peer link of its job, the\n"
                        "neighbour and whether each direction goes through shared memory (shm) "
                        "or the\nstream (tcp); --json has each path's reason.\n\n" +
                            RemoteExitCodes("a coordinator error"));
  flags.AddBool("json", &json, "print the ClusterStatus as JSON");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("help", &help, "print this help and exit");
  if (auto code = ParseVerbFlags(flags, args, help, out, err)) return *code;
  if (!CheckRemoteFlags(flags, &connection, err)) return kExitUsage;
  Remote remote("cluster", connection);
  grpc::ClientContext context;
  remote.PrepareUnary(context);
  pb::ClusterStatus cluster;
  if (grpc::Status st = remote.stub().GetCluster(&context, pb::GetClusterRequest(), &cluster);
      !st.ok()) {
    return remote.Fail(st, err);
  }
  if (json) {
    out << ProtoToJson(cluster);
    return kExitOk;
  }
  if (cluster.stages_size() == 0) {
    out << "no stage servers registered with " << remote.address()
        << "; start some with 'deploy/local/cluster.sh up' or pipetrain-stage --coordinator\n";
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows;
  for (const pb::StageInfo& s : cluster.stages()) {
    const pb::DeviceInfo& d = s.device();
    std::string device = d.name().empty() ? d.kind() : d.name();
    if (!d.name().empty() && !d.kind().empty() && d.name().find(d.kind()) == std::string::npos) {
      device = absl::StrCat(d.kind(), " ", d.name());
    }
    rows.push_back({s.stage_id(), s.address(), device, d.bf16().empty() ? "-" : d.bf16(),
                    d.memory_bytes() > 0 ? common::FormatBytes(d.memory_bytes()) : "-",
                    pb::StageInfo::State_Name(s.state()), s.job_id().empty() ? "-" : s.job_id(),
                    AgeText(s.last_heartbeat(), now), LinksText(s)});
  }
  out << RenderTable({"ID", "ADDRESS", "DEVICE", "BF16", "MEMORY", "STATE", "JOB",
                      "LAST HEARTBEAT", "LINKS (STAGE:SEND/RECEIVE)"},
                     rows);
  return kExitOk;
}

}  // namespace pipetrain::client
