#include "stage_server/collective/coordinator_store.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/error_context.h"
#include "common/channel_args.h"
#include "common/grpc_status.h"
#include "gloo/common/error.h"
#include "grpcpp/create_channel.h"

namespace pipetrain::stage_server::collective {

namespace pb = ::pipetrain::v1;

namespace {

// One RPC's deadline beyond the wait it asks the coordinator for.
constexpr absl::Duration kRpcSlack = absl::Seconds(5);
// A coordinator that is down (UNAVAILABLE) is asked again this often until the
// caller's deadline, as a restarting one comes back within seconds.
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);

void SetDeadline(grpc::ClientContext& ctx, absl::Duration d) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + d));
}

}  // namespace

CoordinatorStore::CoordinatorStore(const std::string& coordinator_address,
                                   const common::RpcSecurity& security, std::string job_id,
                                   std::string prefix, absl::Duration timeout)
    : stub_(pb::Coordinator::NewStub(grpc::CreateCustomChannel(
          coordinator_address, security.ChannelCredentials(),
          common::ChannelArgumentsFor(common::ChannelUse::kRegistration)))),
      security_(security),
      address_(coordinator_address),
      job_id_(std::move(job_id)),
      prefix_(std::move(prefix)),
      timeout_(timeout) {}

absl::Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  pb::RendezvousSetRequest req;
  req.set_job_id(job_id_);
  req.set_key(prefix_ + key);
  req.set_value(value);
  const absl::Time deadline = absl::Now() + timeout_;
  while (true) {
    grpc::ClientContext ctx;
    security_.AddToken(ctx);
    SetDeadline(ctx, std::max(absl::Seconds(1), std::min(kRpcSlack, deadline - absl::Now())));
    pb::RendezvousSetResponse resp;
    const grpc::Status s = stub_->RendezvousSet(&ctx, req, &resp);
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + kRetryPause >= deadline) {
      return common::ErrorContext(absl::StrCat("rendezvous at coordinator ", address_))
          .Job(job_id_)
          .Wrap(common::FromGrpcStatus(s), absl::StrCat("setting key '", req.key(), "'"));
    }
    absl::SleepFor(kRetryPause);
  }
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key, absl::Duration wait) {
  pb::RendezvousGetRequest req;
  req.set_job_id(job_id_);
  req.set_key(prefix_ + key);
  const absl::Time deadline = absl::Now() + std::max(wait, absl::ZeroDuration());
  while (true) {
    const absl::Duration left = std::max(absl::ZeroDuration(), deadline - absl::Now());
    req.set_wait_ms(static_cast<int32_t>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left), std::numeric_limits<int32_t>::max())));
    grpc::ClientContext ctx;
    security_.AddToken(ctx);
    SetDeadline(ctx, left + kRpcSlack);
    pb::RendezvousGetResponse resp;
    const grpc::Status s = stub_->RendezvousGet(&ctx, req, &resp);
    if (s.ok()) return std::move(*resp.mutable_value());
    // The coordinator caps one wait (and may be restarting): ask again while time is
    // left; any other error is final.
    const bool again = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!again || absl::Now() + kRetryPause >= deadline) {
      return common::ErrorContext(absl::StrCat("rendezvous at coordinator ", address_))
          .Job(job_id_)
          .Wrap(common::FromGrpcStatus(s), absl::StrCat("key '", req.key(), "'"));
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) absl::SleepFor(kRetryPause);
  }
}

void CoordinatorStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = Set(key, std::string(data.begin(), data.end()));
  if (!s.ok()) throw gloo::IoException(std::string(s.message()));
}

std::vector<char> CoordinatorStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = Get(key, timeout_);
  if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
  return std::vector<char>(v->begin(), v->end());
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // gloo passes its context's timeout (zero: none); never wait longer than this
  // store's own.
  const absl::Duration asked = absl::FromChrono(timeout);
  const absl::Duration limit = asked > absl::ZeroDuration() ? std::min(asked, timeout_) : timeout_;
  const absl::Time deadline = absl::Now() + limit;
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> v = Get(key, deadline - absl::Now());
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
  }
}

}  // namespace pipetrain::stage_server::collective
