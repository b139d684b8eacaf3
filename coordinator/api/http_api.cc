#include "coordinator/api/http_api.h"

#include <cstdint>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"
#include "common/version.h"
#include "coordinator/api/dashboard/dashboard_assets.h"
#include "coordinator/api/dashboard/dashboard_web.h"
#include "coordinator/metrics/prometheus_metrics.h"
#include "coordinator/metrics/prometheus_text.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"
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

void Asset(httplib::Response& res, std::string_view path) {
  const DashboardAsset* asset = FindDashboardAsset(path);
  if (asset == nullptr) {
    return Error(res, absl::InternalError(absl::StrCat("dashboard file ", std::string(path),
                                                       " is not compiled in")));
  }
  res.set_content(asset->body.data(), asset->body.size(), std::string(asset->content_type).c_str());
  // A new coordinator may serve new files: the browser asks again each load.
  res.set_header("Cache-Control", "no-cache");
}

void Html(httplib::Response& res, int status, const std::string& page) {
  res.status = status;
  res.set_content(page, "text/html; charset=utf-8");
  res.set_header("Cache-Control", "no-store");
}

// The pages a browser opens (the login form is shown in their place without a token).
bool IsPage(const std::string& path) { return path == "/" || absl::StartsWith(path, "/jobs/"); }

// A job's log lines (no steps): what the dashboard's event log shows.
absl::StatusOr<std::string> LogsJson(JobManager* m, const std::string& job_id) {
  nlohmann::json lines = nlohmann::json::array();
  absl::Status s = m->Watch(job_id, std::numeric_limits<int64_t>::max(), /*no_follow=*/true,
                            [&](const pb::JobEvent& e) {
                              if (e.has_log()) {
                                lines.push_back(
                                    {{"time", google::protobuf::util::TimeUtil::ToString(
                                                  e.log().time())},
                                     {"text", e.log().text()}});
                              }
                              return true;
                            });
  if (!s.ok()) return s;
  return nlohmann::json({{"job_id", job_id}, {"logs", lines}}).dump() + "\n";
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(JobManager* m, const std::string& host,
                                                        int port, const std::string& token) {
  std::unique_ptr<HttpApi> api(new HttpApi());
  api->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *api->server_;
  if (!token.empty()) {
    s.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
      // Open to all: the login form's style sheet and the login itself.
      if ((req.method == "GET" && req.path == "/dashboard.css") ||
          (req.method == "POST" && req.path == "/login")) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      if (CookieHoldsToken(req.get_header_value("Cookie"), token)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      const std::string header = req.get_header_value("Authorization");  // a copy
      absl::Status allowed = common::CheckBearerToken(
          req.has_header("Authorization") ? std::optional<absl::string_view>(header)
                                          : std::nullopt,
          token);
      if (allowed.ok()) return httplib::Server::HandlerResponse::Unhandled;
      if (req.method == "GET" && IsPage(req.path)) {
        Html(res, 401, LoginPage(req.path, ""));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (allowed.code() == absl::StatusCode::kUnauthenticated) {
        allowed = absl::UnauthenticatedError(
            "missing bearer token: send the header 'Authorization: Bearer <token>' with the "
            "token in the coordinator's --token-file (or log in to the dashboard at /)");
      }
      Error(res, allowed);
      res.status = 401;  // RFC 6750: a missing and a wrong token alike
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  // The login form's POST: the right token sets the cookie and goes back to the page
  // (303, so a reload does not post again); a wrong one shows the form with an error.
  s.Post("/login", [token](const httplib::Request& req, httplib::Response& res) {
    const std::string next = SafeNextPath(FormField(req.body, "next").value_or("/"));
    if (token.empty()) return res.set_redirect(next, 303);
    const std::optional<std::string> given = FormField(req.body, "token");
    if (!given || !CookieHoldsToken(LoginCookie(*given), token)) {
      return Html(res, 401, LoginPage(next, "wrong token: it is the contents of the "
                                            "coordinator's --token-file"));
    }
    res.set_header("Set-Cookie", LoginCookie(token));
    res.set_redirect(next, 303);
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) { Asset(res, "/index.html"); });
  s.Get(R"(/jobs/([^/]+))", [m](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<pb::JobStatus> job = m->Get(req.matches[1], /*history=*/false);
    if (job.status().code() == absl::StatusCode::kNotFound) {
      return Html(res, 404, UnknownJobPage(req.matches[1].str()));
    }
    Asset(res, "/index.html");
  });
  s.Get("/dashboard.js", [](const httplib::Request& req, httplib::Response& res) {
    Asset(res, req.path);
  });
  s.Get("/dashboard.css", [](const httplib::Request& req, httplib::Response& res) {
    Asset(res, req.path);
  });
  s.Get("/api", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "pipetrain coordinator API (JSON):\n  GET /api/jobs\n  GET /api/jobs/ID[?since_step=N]\n"
        "  GET /api/jobs/ID/timeline?steps=N\n  GET /api/jobs/ID/timeline?predicted=1\n"
        "  GET /api/jobs/ID/logs\n  GET /api/cluster\n"
        "Prometheus metrics (text format 0.0.4):\n  GET /metrics\n"
        "The dashboard (HTML):\n  GET /\n  GET /jobs/ID\n",
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
    // ?since_step=N: the job without the steps up to N, so a page that polls costs the
    // steps that are new since its last answer, not the whole history.
    if (!req.has_param("since_step")) return Reply(res, m->Get(req.matches[1], /*history=*/true));
    int64_t since = 0;
    if (!absl::SimpleAtoi(req.get_param_value("since_step"), &since) || since < 0) {
      return Error(res, absl::InvalidArgumentError(absl::StrCat(
                            "since_step: '", req.get_param_value("since_step"),
                            "' is not a step number (0 or more)")));
    }
    absl::StatusOr<pb::JobStatus> job = m->Get(req.matches[1], /*history=*/false);
    if (!job.ok()) return Error(res, job.status());
    absl::StatusOr<std::vector<pb::StepRecord>> steps = m->Steps(job->job_id(), since + 1);
    if (!steps.ok()) return Error(res, steps.status());
    for (pb::StepRecord& step : *steps) *job->add_history() = std::move(step);
    res.set_content(ToJson(*job), "application/json");
  });
  s.Get(R"(/api/jobs/([^/]+)/logs)", [m](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<std::string> logs = LogsJson(m, req.matches[1]);
    if (!logs.ok()) return Error(res, logs.status());
    res.set_content(*logs, "application/json");
  });
  s.Get(R"(/api/jobs/([^/]+)/timeline)", [m](const httplib::Request& req, httplib::Response& res) {
    int steps = 1;
    if (req.has_param("steps") && !absl::SimpleAtoi(req.get_param_value("steps"), &steps)) {
      return Error(res, absl::InvalidArgumentError("steps: not a number"));
    }
    // ?predicted=1: the simulator's picture of the latest step, from the costs measured
    // on the steps before it; drawn under the measured one on the same time axis.
    if (req.has_param("predicted")) {
      const std::string predicted = req.get_param_value("predicted");
      if (predicted == "1" || predicted == "true") return Reply(res, m->PredictedTimeline(req.matches[1]));
      if (predicted != "0" && predicted != "false") {
        return Error(res, absl::InvalidArgumentError(
                              absl::StrCat("predicted: '", predicted, "' is not 1, 0, true or false")));
      }
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
                                                  " (GET /api lists them)")));
    }
  });
  const int bound = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (bound < 0) {
    return absl::UnavailableError(absl::StrCat("--http: cannot listen on ", host, ":", port,
                                               " (in use, or not an address of this machine)"));
  }
  api->port_ = bound;
  api->thread_ = std::thread([p = api.get()] { p->server_->listen_after_bind(); });
  // Until the loop runs, httplib's stop() is lost and the destructor's join would wait
  // forever (a server stopped right after it started: tests).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!s.is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  if (!s.is_running()) {
    return absl::InternalError(absl::StrCat("--http: the server on ", host, ":", bound,
                                            " did not start within 10 s"));
  }
  return api;
}

HttpApi::~HttpApi() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace pipetrain::coordinator
