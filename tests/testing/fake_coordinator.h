// An in-process Coordinator service for CLI tests: it answers every RPC from canned
// messages, records what it was sent, and runs on 127.0.0.1 with a port the OS picked.
// Stage registration is the one stateful part: ids and secrets as a real coordinator
// hands them out, and a restart that forgets them (for the stage's Registration).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/server.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::testing {

class FakeCoordinator final : public pipetrain::v1::Coordinator::Service {
 public:
  // Canned answers; set them before the calls.
  std::string job_id = "job-000001";
  pipetrain::v1::JobStatus job;          // GetJob and CancelJob, for `job_id` only
  std::vector<pipetrain::v1::JobEvent> events;  // WatchJob sends them in order
  grpc::Status watch_end;                // how WatchJob ends after the events
  pipetrain::v1::ListJobsResponse jobs;
  pipetrain::v1::ClusterStatus cluster;
  pipetrain::v1::Timeline timeline;
  grpc::Status submit_status;            // SubmitJob's answer when not OK

  int calls() const;
  std::vector<pipetrain::v1::JobSpec> submitted() const;
  std::vector<pipetrain::v1::WatchJobRequest> watches() const;
  std::vector<pipetrain::v1::GetJobRequest> gets() const;
  std::vector<pipetrain::v1::GetTimelineRequest> timeline_requests() const;
  std::vector<std::string> cancelled() const;
  // Registration: "stage-N" in order with secret "secret-M" (M counts every
  // registration ever, so a secret is never given twice); a heartbeat is known when
  // its id and secret are a current registration's. Every heartbeat is recorded.
  std::vector<pipetrain::v1::HeartbeatRequest> heartbeats() const;
  std::vector<pipetrain::v1::RegisterStageRequest> registrations() const;
  // What a known heartbeat answers as `held` from now on (false at first).
  void SetHeld(bool held);
  // Forgets every registration and hands out ids from stage-1 again, as a restarted
  // coordinator does; the stages of `first` register at once, before any heartbeat
  // can come in between. Returns their answers.
  std::vector<pipetrain::v1::RegisterStageResponse> ForgetStages(
      const std::vector<pipetrain::v1::RegisterStageRequest>& first = {});

  grpc::Status SubmitJob(grpc::ServerContext*, const pipetrain::v1::SubmitJobRequest* request,
                         pipetrain::v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext*, const pipetrain::v1::GetJobRequest* request,
                      pipetrain::v1::JobStatus* response) override;
  grpc::Status ListJobs(grpc::ServerContext*, const pipetrain::v1::ListJobsRequest* request,
                        pipetrain::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext*, const pipetrain::v1::CancelJobRequest* request,
                         pipetrain::v1::JobStatus* response) override;
  grpc::Status WatchJob(grpc::ServerContext*, const pipetrain::v1::WatchJobRequest* request,
                        grpc::ServerWriter<pipetrain::v1::JobEvent>* writer) override;
  grpc::Status GetTimeline(grpc::ServerContext*, const pipetrain::v1::GetTimelineRequest* request,
                           pipetrain::v1::Timeline* response) override;
  grpc::Status GetCluster(grpc::ServerContext*, const pipetrain::v1::GetClusterRequest* request,
                          pipetrain::v1::ClusterStatus* response) override;
  grpc::Status RegisterStage(grpc::ServerContext*,
                             const pipetrain::v1::RegisterStageRequest* request,
                             pipetrain::v1::RegisterStageResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const pipetrain::v1::HeartbeatRequest* request,
                         pipetrain::v1::HeartbeatResponse* response) override;

 private:
  grpc::Status Known(const std::string& id) const;
  pipetrain::v1::RegisterStageResponse RegisterLocked(
      const pipetrain::v1::RegisterStageRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<pipetrain::v1::JobSpec> submitted_ ABSL_GUARDED_BY(mu_);
  std::vector<pipetrain::v1::WatchJobRequest> watches_ ABSL_GUARDED_BY(mu_);
  std::vector<pipetrain::v1::GetJobRequest> gets_ ABSL_GUARDED_BY(mu_);
  std::vector<pipetrain::v1::GetTimelineRequest> timeline_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::vector<pipetrain::v1::RegisterStageRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<pipetrain::v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> secrets_ ABSL_GUARDED_BY(mu_);  // id -> secret
  int next_stage_ ABSL_GUARDED_BY(mu_) = 1;
  int next_secret_ ABSL_GUARDED_BY(mu_) = 1;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
};

// Serves a service on 127.0.0.1:0 until destroyed.
class TestServer {
 public:
  explicit TestServer(grpc::Service* service);
  ~TestServer();
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// "127.0.0.1:PORT" of a port that was free a moment ago and has no listener now.
std::string UnusedAddress();

}  // namespace pipetrain::testing
