// The monitoring API as JSON over HTTP (`pipetrain-coordinator --http`), for the
// dashboard and curl: GET /api/jobs, /api/jobs/ID (with every step, or ?since_step=N the
// steps after N), /api/jobs/ID/timeline (?steps=N), /api/jobs/ID/logs, /api/cluster. The
// bodies are the gRPC messages in the protobuf JSON mapping with snake_case names; GET
// /metrics is for Prometheus (prometheus_metrics.h). GET / and /jobs/ID serve the
// dashboard (coordinator/api/dashboard/, compiled in). Read-only; translation only. With a
// token, every request needs "Authorization: Bearer <token>" or the login cookie that
// POST /login sets (401 otherwise; the pages show the login form).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "coordinator/jobs/job_manager.h"

namespace httplib {
class Server;
}

namespace pipetrain::coordinator {

class HttpApi {
 public:
  // Binds host:port (port 0 picks one) and serves on a background thread. A non-empty
  // `token` is required on every request.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(JobManager* manager,
                                                        const std::string& host, int port,
                                                        const std::string& token = "");
  ~HttpApi();  // stops serving
  int port() const { return port_; }

 private:
  HttpApi() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace pipetrain::coordinator
