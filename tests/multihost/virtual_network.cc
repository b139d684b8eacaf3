#include "tests/multihost/virtual_network.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/testing/subprocess.h"

namespace pipetrain::testing {
namespace {

using namespace std::chrono_literals;

constexpr char kPrefix[] = "ptmh";
constexpr char kBridge[] = "br0";
// Every address lives only inside this run's namespaces (the bridge too), never in
// the machine's own namespace, so the subnet cannot collide with the machine's routes
// nor with a parallel run's.
constexpr char kSubnet[] = "10.213.0";

std::string IpBinary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

absl::StatusOr<RunResult> RunIp(std::vector<std::string> args) {
  const std::string ip = IpBinary();
  if (ip.empty()) {
    return absl::FailedPreconditionError(
        "the `ip` command is missing: install iproute2 (deploy/install-deps.sh)");
  }
  args.insert(args.begin(), ip);
  return RunCommand(args, 20s);
}

// The pid in a name of ours ("ptmh<pid>n<serial>-host"), or 0.
pid_t OwnerOf(const std::string& ns) {
  if (ns.rfind(kPrefix, 0) != 0) return 0;
  const size_t end = ns.find('n', sizeof(kPrefix) - 1);
  int pid = 0;
  if (end == std::string::npos ||
      !absl::SimpleAtoi(ns.substr(sizeof(kPrefix) - 1, end - (sizeof(kPrefix) - 1)), &pid)) {
    return 0;
  }
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<VirtualNetwork>> VirtualNetwork::Create() {
  static std::atomic<int> serial{0};
  std::unique_ptr<VirtualNetwork> net(new VirtualNetwork());
  net->prefix_ = absl::StrCat(kPrefix, getpid(), "n", serial++, "-");
  const std::string sw = net->NamespaceOf("switch");
  absl::StatusOr<RunResult> made = RunIp({"netns", "add", sw});
  if (!made.ok()) return made.status();
  if (made->exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ip netns add failed: ", absl::StripAsciiWhitespace(made->err)));
  }
  net->namespaces_.push_back(sw);
  // `ip netns exec` also needs to make a mount namespace; some containers allow the
  // one and not the other.
  absl::StatusOr<RunResult> exec = RunIp({"netns", "exec", sw, "/bin/true"});
  if (!exec.ok()) return exec.status();
  if (exec->exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ip netns exec failed: ", absl::StripAsciiWhitespace(exec->err)));
  }
  if (absl::Status s = net->Ip({"-n", sw, "link", "add", kBridge, "type", "bridge"}); !s.ok()) {
    return s;
  }
  if (absl::Status s = net->Ip({"-n", sw, "link", "set", kBridge, "up"}); !s.ok()) return s;
  return net;
}

VirtualNetwork::~VirtualNetwork() {
  // Hosts first, the switch last; a namespace still holding a process lives on until
  // that process ends, but its name is gone either way.
  for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
    (void)RunIp({"netns", "del", *it});
  }
}

absl::Status VirtualNetwork::Ip(std::vector<std::string> args) {
  absl::StatusOr<RunResult> r = RunIp(args);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::InternalError(absl::StrCat("ip ", absl::StrJoin(args, " "), " failed: ",
                                            absl::StripAsciiWhitespace(r->err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> VirtualNetwork::AddHost(const std::string& name) {
  if (hosts_.count(name)) return absl::AlreadyExistsError("host " + name + " exists");
  const std::string ns = NamespaceOf(name), sw = NamespaceOf("switch");
  const std::string port = absl::StrCat("v", hosts_.size());  // the bridge's end
  const std::string address = absl::StrCat(kSubnet, ".", hosts_.size() + 1);
  if (absl::Status s = Ip({"netns", "add", ns}); !s.ok()) return s;
  namespaces_.push_back(ns);
  for (const std::vector<std::string>& step : std::vector<std::vector<std::string>>{
           {"-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
           {"-n", sw, "link", "set", port, "master", kBridge},
           {"-n", sw, "link", "set", port, "up"},
           {"-n", ns, "addr", "add", address + "/24", "dev", "eth0"},
           {"-n", ns, "link", "set", "eth0", "up"},
           {"-n", ns, "link", "set", "lo", "up"}}) {
    if (absl::Status s = Ip(step); !s.ok()) return s;
  }
  hosts_[name] = address;
  return address;
}

std::vector<std::string> VirtualNetwork::InHost(const std::string& host,
                                                std::vector<std::string> argv) const {
  std::vector<std::string> out = {IpBinary(), "netns", "exec", NamespaceOf(host)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status VirtualNetwork::RunInHost(const std::string& host,
                                       const std::function<void()>& fn) const {
  absl::Status status;
  // A network namespace belongs to a thread: only this one moves.
  std::thread worker([&] {
    const std::string path = "/run/netns/" + NamespaceOf(host);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      status = absl::InternalError(absl::StrCat("entering ", path, ": ", strerror(errno)));
      if (fd >= 0) close(fd);
      return;
    }
    close(fd);
    fn();
  });
  worker.join();
  return status;
}

absl::Status VirtualNetwork::SetLink(const std::string& host, bool up) {
  if (!hosts_.count(host)) return absl::NotFoundError("no host " + host);
  return Ip({"-n", NamespaceOf(host), "link", "set", "eth0", up ? "up" : "down"});
}

std::string VirtualNetwork::HostOf(const std::string& ip) const {
  for (const auto& [name, address] : hosts_) {
    if (address == ip) return name;
  }
  return "";
}

void VirtualNetwork::RemoveLeftovers() {
  absl::StatusOr<RunResult> list = RunIp({"netns", "list"});
  if (!list.ok() || list->exit_code != 0) return;
  for (absl::string_view line : absl::StrSplit(list->out, '\n', absl::SkipEmpty())) {
    const std::string ns(line.substr(0, line.find(' ')));
    const pid_t owner = OwnerOf(ns);
    if (owner <= 0 || owner == getpid()) continue;
    if (kill(owner, 0) == 0 || errno == EPERM) continue;  // that run is still going
    absl::StatusOr<RunResult> pids = RunIp({"netns", "pids", ns});
    if (pids.ok()) {
      for (absl::string_view p : absl::StrSplit(pids->out, '\n', absl::SkipEmpty())) {
        int pid = 0;
        if (absl::SimpleAtoi(p, &pid) && pid > 1) kill(pid, SIGKILL);
      }
    }
    (void)RunIp({"netns", "del", ns});
  }
}

}  // namespace pipetrain::testing
