// The stage registry: a vector of records in registration order under one mutex. Loss is
// computed lazily (every reader sweeps first), so no timer is needed for correctness.
#include "coordinator/stages/stage_registry.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/address.h"

namespace pipetrain::coordinator {
namespace {

// The canonical text of an IP literal (IPv4 in any form inet_aton takes, IPv6 with an
// IPv4-mapped one as IPv4); nullopt for a host name.
std::optional<std::string> CanonicalIp(const std::string& host) {
  char text[INET6_ADDRSTRLEN] = {};
  in_addr v4;
  if (inet_aton(host.c_str(), &v4) != 0) {
    return inet_ntop(AF_INET, &v4, text, sizeof(text)) ? std::optional<std::string>(text)
                                                        : std::nullopt;
  }
  const size_t zone = host.find('%');  // fe80::1%eth0: the zone stays as written
  in6_addr v6;
  if (inet_pton(AF_INET6, host.substr(0, zone).c_str(), &v6) != 1) return std::nullopt;
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(&v4, &v6.s6_addr[12], sizeof(v4));
    if (inet_ntop(AF_INET, &v4, text, sizeof(text)) == nullptr) return std::nullopt;
  } else if (inet_ntop(AF_INET6, &v6, text, sizeof(text)) == nullptr) {
    return std::nullopt;
  }
  return zone == std::string::npos ? std::string(text) : absl::StrCat(text, host.substr(zone));
}

}  // namespace

std::string AddressKey(const std::string& address) {
  absl::StatusOr<common::HostPort> hp = common::ParseHostPort(address, 0, "address");
  if (!hp.ok()) return address;
  std::string host = absl::AsciiStrToLower(absl::StripSuffix(hp->host, "."));
  if (std::optional<std::string> ip = CanonicalIp(host)) host = *std::move(ip);
  // One machine's own stage server, however the loopback is named.
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") host = "loopback";
  return absl::StrCat(host, "|", hp->port);
}

namespace {

// Marks records silent for longer than `timeout` as lost; returns the ids newly marked.
// A lost stage keeps its job_id: the job still has to notice and release it.
std::vector<std::string> MarkStale(std::vector<StageRecord>& stages, absl::Time now,
                                   absl::Duration timeout) {
  std::vector<std::string> newly_lost;
  for (StageRecord& stage : stages) {
    if (!stage.lost && now - stage.last_heartbeat > timeout) {
      stage.lost = true;
      newly_lost.push_back(stage.stage_id);
    }
  }
  return newly_lost;
}

bool IsFree(const StageRecord& stage, uint64_t min_memory_bytes) {
  return !stage.lost && stage.job_id.empty() && stage.device.memory_bytes() >= min_memory_bytes;
}

// 128 bits: two registrations never share a secret, whichever coordinator made them.
std::string NewSecret(absl::BitGen& gen) {
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

void ToTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  int64_t seconds = absl::ToUnixSeconds(t);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>((t - absl::FromUnixSeconds(seconds)) / absl::Nanoseconds(1)));
}

}  // namespace

StageRegistry::StageRegistry(absl::Duration heartbeat_timeout, std::function<absl::Time()> now)
    : timeout_(heartbeat_timeout), now_(std::move(now)) {}

absl::StatusOr<StageRegistration> StageRegistry::Register(const std::string& address,
                                                          const pipetrain::v1::DeviceInfo& device,
                                                          const std::string& secret,
                                                          const std::string& identity) {
  if (address.empty()) {
    return absl::InvalidArgumentError("register stage: address is empty");
  }
  absl::Time now = now_();
  const std::string key = AddressKey(address);
  absl::MutexLock lock(&mu_);
  for (StageRecord& stage : stages_) {
    if (AddressKey(stage.address) != key) continue;
    const absl::Duration silent = now - stage.last_heartbeat;
    const bool live = !stage.lost && silent <= timeout_;
    if (live && !stage.identity.empty() && identity != stage.identity) {
      return absl::PermissionDeniedError(absl::StrCat(
          "register stage at ", address, ": ", stage.stage_id, " registered there as '",
          stage.identity, "' and is alive; this client's TLS identity is '", identity,
          "', which cannot replace it"));
    }
    if (live && secret != stage.secret) {
      // Another client, or this stage's new process that has no secret yet: the live
      // record stays until it misses its heartbeats.
      // At least a tenth of a second: at the boundary it is still live for that long.
      const absl::Duration wait =
          std::max(absl::Ceil(timeout_ - silent, absl::Milliseconds(100)), absl::Milliseconds(100));
      return absl::AlreadyExistsError(absl::StrCat(
          "register stage at ", address, ": ", stage.stage_id, " is registered there",
          stage.address == address ? "" : absl::StrCat(" (as ", stage.address, ")"),
          " and alive (last heartbeat ", absl::FormatDuration(silent),
          " ago); only that stage may register there again, with its registration_secret; "
          "a registration without it takes the address only once the stage has missed "
          "heartbeats for ", absl::FormatDuration(timeout_), ": retry in ",
          absl::FormatDuration(wait)));
    }
    // The same stage again (it has the secret), or one whose record is lost: keep its
    // id, its place in the oldest-first order and any job holding it, which will find
    // out on its own. A new secret: the earlier registration's heartbeats are refused.
    // The address as it now gives it is the one its peers dial.
    stage.address = address;
    stage.device = device;
    stage.last_heartbeat = now;
    stage.lost = false;
    stage.secret = NewSecret(secrets_);
    stage.identity = identity;
    return StageRegistration{stage.stage_id, stage.secret};
  }
  StageRecord& stage = stages_.emplace_back();
  stage.stage_id = absl::StrCat("stage-", next_id_++);
  stage.address = address;
  stage.device = device;
  stage.registered = now;
  stage.last_heartbeat = now;
  stage.secret = NewSecret(secrets_);
  stage.identity = identity;
  return StageRegistration{stage.stage_id, stage.secret};
}

bool StageRegistry::Heartbeat(const std::string& stage_id, const std::string& secret,
                              std::vector<pipetrain::v1::LinkPath> links) {
  absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  for (StageRecord& stage : stages_) {
    if (stage.stage_id == stage_id) {
      // Same id, other secret: a registration this registry did not make (an earlier
      // coordinator's, whose id now names another stage) or an older one of this stage.
      if (stage.secret != secret) return false;
      stage.last_heartbeat = now;
      stage.lost = false;
      stage.links = std::move(links);
      return true;
    }
  }
  return false;
}

std::vector<std::string> StageRegistry::Sweep() {
  absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  return MarkStale(stages_, now, timeout_);
}

void StageRegistry::SweepLocked() { MarkStale(stages_, now_(), timeout_); }

std::optional<std::vector<StageRecord>> StageRegistry::Acquire(const std::string& job_id, int count,
                                                               uint64_t min_memory_bytes) {
  // An empty job id would take stages that still look free.
  if (job_id.empty() || count < 0) return std::nullopt;
  absl::MutexLock lock(&mu_);
  SweepLocked();
  // stages_ is in registration order, so the first matches are the oldest.
  std::vector<size_t> picked;
  for (size_t i = 0; i < stages_.size() && static_cast<int>(picked.size()) < count; ++i) {
    if (IsFree(stages_[i], min_memory_bytes)) picked.push_back(i);
  }
  if (static_cast<int>(picked.size()) < count) return std::nullopt;
  std::vector<StageRecord> taken;
  taken.reserve(picked.size());
  for (size_t i : picked) {
    stages_[i].job_id = job_id;
    taken.push_back(stages_[i]);
  }
  return taken;
}

void StageRegistry::Release(const std::string& job_id) {
  if (job_id.empty()) return;
  absl::MutexLock lock(&mu_);
  for (StageRecord& stage : stages_) {
    if (stage.job_id == job_id) stage.job_id.clear();
  }
}

void StageRegistry::MarkLost(const std::string& stage_id) {
  absl::MutexLock lock(&mu_);
  for (StageRecord& stage : stages_) {
    if (stage.stage_id == stage_id) stage.lost = true;
  }
}

void StageRegistry::ReleaseStage(const std::string& job_id, const std::string& stage_id) {
  absl::MutexLock lock(&mu_);
  for (StageRecord& stage : stages_) {
    if (stage.stage_id == stage_id && stage.job_id == job_id) stage.job_id.clear();
  }
}

std::vector<std::optional<StageRecord>> StageRegistry::AcquireAt(
    const std::string& job_id, const std::vector<std::string>& addresses) {
  std::vector<std::optional<StageRecord>> taken(addresses.size());
  if (job_id.empty()) return taken;
  absl::MutexLock lock(&mu_);
  SweepLocked();
  for (size_t a = 0; a < addresses.size(); ++a) {
    const std::string key = AddressKey(addresses[a]);
    for (StageRecord& stage : stages_) {
      if (AddressKey(stage.address) == key && IsFree(stage, 0)) {
        stage.job_id = job_id;
        taken[a] = stage;
        break;
      }
    }
  }
  return taken;
}

bool StageRegistry::Held(const std::string& stage_id) {
  absl::MutexLock lock(&mu_);
  for (const StageRecord& stage : stages_) {
    if (stage.stage_id == stage_id) return !stage.job_id.empty();
  }
  return false;
}

int StageRegistry::FreeCount(uint64_t min_memory_bytes) {
  absl::MutexLock lock(&mu_);
  SweepLocked();
  int count = 0;
  for (const StageRecord& stage : stages_) count += IsFree(stage, min_memory_bytes) ? 1 : 0;
  return count;
}

int StageRegistry::LiveCount() {
  absl::MutexLock lock(&mu_);
  SweepLocked();
  int count = 0;
  for (const StageRecord& stage : stages_) count += stage.lost ? 0 : 1;
  return count;
}

std::optional<StageRecord> StageRegistry::Find(const std::string& stage_id) {
  absl::MutexLock lock(&mu_);
  SweepLocked();
  for (const StageRecord& stage : stages_) {
    if (stage.stage_id == stage_id) return stage;
  }
  return std::nullopt;
}

std::vector<pipetrain::v1::StageInfo> StageRegistry::Snapshot() {
  absl::MutexLock lock(&mu_);
  SweepLocked();
  std::vector<pipetrain::v1::StageInfo> infos;
  infos.reserve(stages_.size());
  for (const StageRecord& stage : stages_) {
    pipetrain::v1::StageInfo& info = infos.emplace_back();
    info.set_stage_id(stage.stage_id);
    info.set_address(stage.address);
    *info.mutable_device() = stage.device;
    info.set_job_id(stage.job_id);
    for (const pipetrain::v1::LinkPath& link : stage.links) *info.add_links() = link;
    if (stage.lost) {
      info.set_state(pipetrain::v1::StageInfo::LOST);
    } else if (!stage.job_id.empty()) {
      info.set_state(pipetrain::v1::StageInfo::BUSY);
    } else {
      info.set_state(pipetrain::v1::StageInfo::IDLE);
    }
    ToTimestamp(stage.last_heartbeat, info.mutable_last_heartbeat());
  }
  return infos;
}

}  // namespace pipetrain::coordinator
