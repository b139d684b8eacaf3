// The verbs that talk to a running coordinator, each one RPC (submit also follows the
// job's event stream, as follow does for a job already submitted; resume reads the job,
// then submits and follows like submit): submit, follow, status, logs, list, cancel,
// resume, cluster, timeline. They share
// the --address flag and the exit codes of client/remote.h.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunSubmit(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunFollow(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunStatus(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunLogs(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunList(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunCancel(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunResume(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunCluster(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunTimeline(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
