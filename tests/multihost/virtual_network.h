// Test hosts made of Linux network namespaces: one namespace per host, each with its
// own address on a private bridge that lives in a namespace of its own, so the
// machine's interfaces and routes are never touched. Needs root; removed on destruction.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::testing {

class VirtualNetwork {
 public:
  // Makes the switch namespace and its bridge. FAILED_PRECONDITION (with ip's words)
  // where this process may not make network namespaces: the caller skips.
  static absl::StatusOr<std::unique_ptr<VirtualNetwork>> Create();
  ~VirtualNetwork();  // deletes every namespace it made
  VirtualNetwork(const VirtualNetwork&) = delete;
  VirtualNetwork& operator=(const VirtualNetwork&) = delete;

  // Adds host `name`: a namespace with loopback up and eth0 (a veth to the bridge)
  // holding the next address of the subnet. Returns that address.
  absl::StatusOr<std::string> AddHost(const std::string& name);
  // `argv` prefixed so that it runs inside the host's namespace (`ip netns exec`,
  // which execs in place: the pid is the command's own).
  std::vector<std::string> InHost(const std::string& host, std::vector<std::string> argv) const;
  // Runs `fn` on a thread that lives in the host's namespace (sockets it opens are
  // the host's); for in-process clients such as an HTTP request.
  absl::Status RunInHost(const std::string& host, const std::function<void()>& fn) const;
  // Takes the host's eth0 down or up, as if its cable were pulled.
  absl::Status SetLink(const std::string& host, bool up);
  // The host whose address is `ip`, or "".
  std::string HostOf(const std::string& ip) const;
  const std::string& namespace_prefix() const { return prefix_; }

  // Deletes namespaces left by earlier runs whose test process is gone (a crash or a
  // ctest timeout), first killing, by pid, the processes those runs left inside them.
  static void RemoveLeftovers();

 private:
  VirtualNetwork() = default;
  absl::Status Ip(std::vector<std::string> args);  // `ip ARGS`, error with its stderr
  std::string NamespaceOf(const std::string& host) const { return prefix_ + host; }

  std::string prefix_;                       // "ptmh<pid>n<serial>-": unique per run
  std::vector<std::string> namespaces_;      // made so far, the switch first
  std::map<std::string, std::string> hosts_;  // host -> address
};

}  // namespace pipetrain::testing
