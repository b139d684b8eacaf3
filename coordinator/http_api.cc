#include "coordinator/http_api.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc_security.h"
#include "common/version.h"
#include "coordinator/prometheus_metrics.h"
#include "coordinator/prometheus_text.h"
#include "google/protobuf/util/json_util.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out + "\n";
}

void Error(httplib::Response& res, const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound: res.status = 404; break;
    case absl::StatusCode::kInvalidArgument: res.status = 400; break;
    case absl::StatusCode::kFailedPrecondition: res.status = 409; break;
    default: res.status = 500;
  }
  nlohmann::json j = {{"error", std::string(s.message())}};
  res.set_content(j.dump() + "\n", "application/json");
}

template <typename T>
void Reply(httplib::Response& res, const absl::StatusOr<T>& result) {
  if (!result.ok()) return Error(res, result.status());
  res.set_content(ToJson(*result), "application/json");
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(JobManager* m, const std::string& host,
                                                        int port, const std::string& token) {
  std::unique_ptr<HttpApi> api(new HttpApi());
  api->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *api->server_;
  if (!token.empty()) {
    s.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
      const std::string header = req.get_header_value("Authorization");  // a copy
      absl::Status allowed = common::CheckBearerToken(
          req.has_header("Authorization") ? std::optional<absl::string_view>(header)
                                          : std::nullopt,
          token);
      if (allowed.ok()) return httplib::Server::HandlerResponse::Unhandled;
      if (allowed.code() == absl::StatusCode::kUnauthenticated) {
        allowed = absl::UnauthenticatedError(
            "missing bearer token: send the header 'Authorization: Bearer <token>' with the "
            "token in the coordinator's --token-file");
      }
      Error(res, allowed);
      res.status = 401;  // RFC 6750: a missing and a wrong token alike
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "pipetrain coordinator API (JSON):\n  GET /api/jobs\n  GET /api/jobs/ID\n"
        "  GET /api/jobs/ID/timeline?steps=N\n  GET /api/cluster\n"
        "Prometheus metrics (text format 0.0.4):\n  GET /metrics\n",
        "text/plain");
  });
  s.Get("/api/jobs", [m](const httplib::Request&, httplib::Response& res) {
    absl::StatusOr<std::vector<pb::JobStatus>> jobs = m->List(0);
    if (!jobs.ok()) return Error(res, jobs.status());
    pb::ListJobsResponse list;
    for (pb::JobStatus& j : *jobs) *list.add_jobs() = std::move(j);
    res.set_content(ToJson(list), "application/json");
  });
  s.Get(R"(/api/jobs/([^/]+))", [m](const httplib::Request& req, httplib::Response& res) {
    Reply(res, m->Get(req.matches[1], /*history=*/true));
  });
  s.Get(R"(/api/jobs/([^/]+)/timeline)", [m](const httplib::Request& req, httplib::Response& res) {
    int steps = 1;
    if (req.has_param("steps") && !absl::SimpleAtoi(req.get_param_value("steps"), &steps)) {
      return Error(res, absl::InvalidArgumentError("steps: not a number"));
    }
    Reply(res, m->Timeline(req.matches[1], steps));
  });
  s.Get("/api/cluster", [m](const httplib::Request&, httplib::Response& res) {
    res.set_content(ToJson(m->Cluster()), "application/json");
  });
  s.Get("/metrics", [m](const httplib::Request&, httplib::Response& res) {
    // The jobs with series get their steps below; the others only count by state.
    absl::StatusOr<std::vector<pb::JobStatus>> jobs = m->List(0, /*latest_step=*/false);
    if (!jobs.ok()) return Error(res, jobs.status());
    MetricsInput input{.jobs = *std::move(jobs), .cluster = m->Cluster(), .now = absl::Now(),
                       .version = common::ProjectVersion()};
    for (size_t i : JobsWithSeries(input.jobs)) {
      pb::JobStatus& job = input.jobs[i];
      absl::StatusOr<std::vector<pb::StepRecord>> steps =
          m->Steps(job.job_id(), FirstStepForMetrics(job));
      if (!steps.ok()) return Error(res, steps.status());
      for (pb::StepRecord& step : *steps) *job.add_history() = std::move(step);
    }
    res.set_content(PrometheusMetrics(input), kPrometheusContentType);
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && res.body.empty()) {
      Error(res, absl::NotFoundError(absl::StrCat("no such endpoint: ", req.path,
                                                  " (GET / lists them)")));
    }
  });
  const int bound = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (bound < 0) {
    return absl::UnavailableError(absl::StrCat("--http: cannot listen on ", host, ":", port,
                                               " (in use, or not an address of this machine)"));
  }
  api->port_ = bound;
  api->thread_ = std::thread([p = api.get()] { p->server_->listen_after_bind(); });
  return api;
}

HttpApi::~HttpApi() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace pipetrain::coordinator
