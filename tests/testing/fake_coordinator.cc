#include "tests/testing/fake_coordinator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace pipetrain::testing {

namespace pb = ::pipetrain::v1;

int FakeCoordinator::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}
std::vector<pb::JobSpec> FakeCoordinator::submitted() const {
  absl::MutexLock lock(&mu_);
  return submitted_;
}
std::vector<pb::WatchJobRequest> FakeCoordinator::watches() const {
  absl::MutexLock lock(&mu_);
  return watches_;
}
std::vector<pb::GetJobRequest> FakeCoordinator::gets() const {
  absl::MutexLock lock(&mu_);
  return gets_;
}
std::vector<pb::GetTimelineRequest> FakeCoordinator::timeline_requests() const {
  absl::MutexLock lock(&mu_);
  return timeline_requests_;
}
std::vector<std::string> FakeCoordinator::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

std::vector<pb::HeartbeatRequest> FakeCoordinator::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}
std::vector<pb::RegisterStageRequest> FakeCoordinator::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}
void FakeCoordinator::SetHeld(bool held) {
  absl::MutexLock lock(&mu_);
  held_ = held;
}
std::vector<pb::RegisterStageResponse> FakeCoordinator::ForgetStages(
    const std::vector<pb::RegisterStageRequest>& first) {
  absl::MutexLock lock(&mu_);
  secrets_.clear();
  next_stage_ = 1;
  std::vector<pb::RegisterStageResponse> answers;
  for (const pb::RegisterStageRequest& request : first) answers.push_back(RegisterLocked(request));
  return answers;
}

pb::RegisterStageResponse FakeCoordinator::RegisterLocked(const pb::RegisterStageRequest& request) {
  registrations_.push_back(request);
  const std::string id = absl::StrCat("stage-", next_stage_++);
  secrets_[id] = absl::StrCat("secret-", next_secret_++);
  pb::RegisterStageResponse response;
  response.set_stage_id(id);
  response.set_registration_secret(secrets_[id]);
  response.set_heartbeat_interval_ms(20);  // tests should not wait for heartbeats
  return response;
}

grpc::Status FakeCoordinator::RegisterStage(grpc::ServerContext*,
                                            const pb::RegisterStageRequest* request,
                                            pb::RegisterStageResponse* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  *response = RegisterLocked(*request);
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::Heartbeat(grpc::ServerContext*, const pb::HeartbeatRequest* request,
                                        pb::HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  heartbeats_.push_back(*request);
  auto it = secrets_.find(request->stage_id());
  response->set_known(it != secrets_.end() && it->second == request->registration_secret());
  response->set_held(response->known() && held_);
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::Known(const std::string& id) const {
  if (id == job_id) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("job '", id, "' not found"));
}

grpc::Status FakeCoordinator::SubmitJob(grpc::ServerContext*, const pb::SubmitJobRequest* request,
                                        pb::SubmitJobResponse* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  submitted_.push_back(request->spec());
  if (!submit_status.ok()) return submit_status;
  response->set_job_id(job_id);
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::GetJob(grpc::ServerContext*, const pb::GetJobRequest* request,
                                     pb::JobStatus* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  gets_.push_back(*request);
  if (grpc::Status st = Known(request->job_id()); !st.ok()) return st;
  *response = job;
  if (!request->include_history()) response->clear_history();
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::ListJobs(grpc::ServerContext*, const pb::ListJobsRequest*,
                                       pb::ListJobsResponse* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  *response = jobs;
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::CancelJob(grpc::ServerContext*, const pb::CancelJobRequest* request,
                                        pb::JobStatus* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  if (grpc::Status st = Known(request->job_id()); !st.ok()) return st;
  cancelled_.push_back(request->job_id());
  *response = job;
  response->set_state(pb::JobStatus::CANCELLED);
  response->set_reason("cancelled by the user");
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::WatchJob(grpc::ServerContext*, const pb::WatchJobRequest* request,
                                       grpc::ServerWriter<pb::JobEvent>* writer) {
  {
    absl::MutexLock lock(&mu_);
    ++calls_;
    watches_.push_back(*request);
  }
  if (grpc::Status st = Known(request->job_id()); !st.ok()) return st;
  for (const pb::JobEvent& e : events) {
    if (!writer->Write(e)) break;
  }
  return watch_end;
}

grpc::Status FakeCoordinator::GetTimeline(grpc::ServerContext*,
                                          const pb::GetTimelineRequest* request,
                                          pb::Timeline* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  timeline_requests_.push_back(*request);
  if (grpc::Status st = Known(request->job_id()); !st.ok()) return st;
  *response = timeline;
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::GetCluster(grpc::ServerContext*, const pb::GetClusterRequest*,
                                         pb::ClusterStatus* response) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  *response = cluster;
  return grpc::Status::OK;
}

TestServer::TestServer(grpc::Service* service) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  server_ = builder.BuildAndStart();
  address_ = absl::StrCat("127.0.0.1:", port);
}

TestServer::~TestServer() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
}

std::string UnusedAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);  // never listened: connecting is refused at once
  return absl::StrCat("127.0.0.1:", port);
}

}  // namespace pipetrain::testing
