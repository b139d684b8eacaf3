#include "bench/cluster_jobs.h"

#include <unistd.h>

#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/benchmark.h"
#include "common/status_macros.h"

namespace pipetrain::bench {

using json = nlohmann::json;

absl::Time JsonTime(const json& j, const char* key) {
  absl::Time t = absl::InfinitePast();
  std::string err;
  if (j.contains(key)) (void)absl::ParseTime(absl::RFC3339_full, j[key].get<std::string>(), &t, &err);
  return t;
}

absl::StatusOr<json> JobStatus(testing::LocalCluster& c, const std::string& id) {
  ASSIGN_OR_RETURN(testing::RunResult r, c.Cli({"status", id, "--json"}));
  json j = json::parse(r.out, nullptr, false);
  if (r.exit_code != 0 || j.is_discarded()) {
    return absl::InternalError(absl::StrCat("pipetrain status ", id, ": ", r.err));
  }
  return j;
}

absl::StatusOr<std::string> SubmitJob(testing::LocalCluster& c, const std::string& spec_file,
                                      bool wait) {
  std::vector<std::string> args = {"submit", spec_file};
  if (!wait) args.push_back("--no-wait");
  ASSIGN_OR_RETURN(testing::RunResult r, c.Cli(args, std::chrono::minutes(10)));
  const size_t at = r.out.find("job-");
  if (at == std::string::npos) {
    return absl::InternalError(absl::StrCat("pipetrain submit ", spec_file, " exited ",
                                            r.exit_code, " without a job: ", r.out, r.err));
  }
  std::string id = r.out.substr(at);
  return id.substr(0, id.find_first_of(" \n"));
}

absl::StatusOr<json> WaitForJob(testing::LocalCluster& c, const std::string& id,
                                const std::function<bool(const json&)>& pred) {
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (absl::Now() < deadline) {
    absl::StatusOr<json> s = JobStatus(c, id);
    if (s.ok() && pred(*s)) return s;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("job ", id, " did not get there in 5 minutes"));
}

std::vector<double> JobLosses(const json& s) {
  std::vector<double> out;
  for (const json& h : s.value("history", json::array())) out.push_back(h.value("loss", 0.0));
  return out;
}

double MedianStepSeconds(const json& s, int warm) {
  std::vector<double> t;
  const json history = s.value("history", json::array());
  for (size_t i = warm; i < history.size(); ++i) t.push_back(history[i].value("step_time_s", 0.0));
  return Median(t);
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // After the command name in parentheses: state is field 3, utime 14 and stime 15.
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 > text.size()) return 0;
  std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) return 0;
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double StagesCpuSeconds(const testing::LocalCluster& c) {
  double sum = 0;
  for (pid_t pid : c.stage_pids()) sum += ProcessCpuSeconds(pid);
  return sum;
}

}  // namespace pipetrain::bench
