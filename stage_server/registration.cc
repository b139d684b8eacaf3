#include "stage_server/registration.h"

#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/logging.h"
#include "grpcpp/create_channel.h"

namespace pipetrain::stage_server {

Registration::Registration(std::string coordinator, pipetrain::v1::RegisterStageRequest request,
                           std::function<std::string()> job_id, common::RpcSecurity security,
                           Links links)
    : coordinator_(std::move(coordinator)), request_(std::move(request)),
      job_id_(std::move(job_id)), links_(std::move(links)), security_(std::move(security)) {
  // A restarted coordinator should see its stages back within a few heartbeats.
  stub_ = pipetrain::v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(coordinator_, security_.ChannelCredentials(),
                                common::ChannelArgumentsFor(common::ChannelUse::kRegistration)));
  thread_ = std::thread([this] { Run(); });
}

Registration::~Registration() {
  stop_.Notify();
  thread_.join();
}

std::string Registration::stage_id() const {
  absl::MutexLock lock(&mu_);
  return stage_id_;
}

bool Registration::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

bool Registration::HeartbeatNow() {
  std::string id, secret;
  {
    absl::MutexLock lock(&mu_);
    id = stage_id_;
    secret = secret_;
  }
  if (id.empty()) return false;
  pipetrain::v1::HeartbeatResponse response;
  // An unknown id: the thread registers again.
  const grpc::Status s = Beat(id, secret, absl::Seconds(2), &response);
  return s.ok() && response.known() && response.held();
}

grpc::Status Registration::Beat(const std::string& id, const std::string& secret,
                                absl::Duration deadline,
                                pipetrain::v1::HeartbeatResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
  security_.AddToken(ctx);
  pipetrain::v1::HeartbeatRequest req;
  req.set_stage_id(id);
  req.set_job_id(job_id_());
  if (links_) {
    for (pipetrain::v1::LinkPath& link : links_()) *req.add_links() = std::move(link);
  }
  req.set_registration_secret(secret);
  grpc::Status s = stub_->Heartbeat(&ctx, req, response);
  absl::MutexLock lock(&mu_);
  if (stage_id_ == id) held_ = s.ok() && response->known() && response->held();
  return s;
}

std::string Registration::registration_secret() const {
  absl::MutexLock lock(&mu_);
  return secret_;
}

void Registration::Run() {
  absl::Duration interval = absl::Seconds(2);
  std::string last_problem;
  auto problem = [&](const std::string& p) {
    if (p != last_problem) common::LogWarning("stage", p);
    last_problem = p;
  };
  while (!stop_.HasBeenNotified()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    security_.AddToken(ctx);
    std::string id;
    std::string secret;
    std::string previous_secret;
    {
      absl::MutexLock lock(&mu_);
      id = stage_id_;
      secret = secret_;
      previous_secret = previous_secret_;
    }
    if (id.empty()) {
      pipetrain::v1::RegisterStageRequest request = request_;
      request.set_registration_secret(previous_secret);
      pipetrain::v1::RegisterStageResponse resp;
      grpc::Status s = stub_->RegisterStage(&ctx, request, &resp);
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        stage_id_ = resp.stage_id();
        secret_ = resp.registration_secret();
        if (resp.heartbeat_interval_ms() > 0) {
          interval = absl::Milliseconds(resp.heartbeat_interval_ms());
        }
        common::LogInfo("stage", absl::StrCat("registered with ", coordinator_, " as ",
                                              resp.stage_id()));
        last_problem.clear();
      } else {
        problem(absl::StrCat("cannot register with the coordinator at ", coordinator_, ": ",
                             s.error_message(), " (retrying)"));
      }
    } else {
      pipetrain::v1::HeartbeatResponse resp;
      grpc::Status s = Beat(id, secret, absl::Seconds(5), &resp);
      if (s.ok() && !resp.known()) {
        // The coordinator restarted or dropped us, or our id is now another stage's:
        // register again at once, so the coordinator sees this stage as soon as it can.
        {
          absl::MutexLock lock(&mu_);
          stage_id_.clear();
          previous_secret_ = secret_;
          secret_.clear();
        }
        common::LogInfo("stage", absl::StrCat("the coordinator at ", coordinator_,
                                              " does not know ", id,
                                              " with its secret: registering again"));
        continue;
      } else if (!s.ok()) {
        problem(absl::StrCat("heartbeat to ", coordinator_, " failed: ", s.error_message()));
      } else {
        last_problem.clear();
      }
    }
    stop_.WaitForNotificationWithTimeout(interval);
  }
}

}  // namespace pipetrain::stage_server
