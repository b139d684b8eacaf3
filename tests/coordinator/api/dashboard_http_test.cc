// The coordinator's dashboard over HTTP, in process: a JobManager over a job store
// seeded with an ended job, and the HttpApi on 127.0.0.1 port 0. The page and its
// assets with their types (compiled in, not read from the source tree), ?since_step
// cutting the history, the job's log lines, 404 for an unknown job, and the token gate:
// login form, the cookie the right token sets, 401 without it or with a wrong one;
// plus the pure cookie and form helpers.
#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "coordinator/api/dashboard/dashboard_assets.h"
#include "coordinator/api/dashboard/dashboard_web.h"
#include "coordinator/api/http_api.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/store/job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_files.h"

namespace pipetrain::coordinator {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using json = nlohmann::json;
namespace pb = ::pipetrain::v1;

constexpr char kJob[] = "job-000001";
constexpr int kSteps = 12;
constexpr char kToken[] = "tok;en=with spaces&odd%chars";

// A coordinator's state with one SUCCEEDED job of kSteps steps and two log lines.
void SeedStore(const std::string& dir) {
  auto store = JobStore::Open(dir + "/jobs.db");
  ASSERT_THAT(store, IsOk());
  pb::JobStatus job;
  job.set_job_id(kJob);
  job.set_state(pb::JobStatus::SUCCEEDED);
  job.mutable_spec()->set_name("seeded");
  job.mutable_spec()->mutable_training()->set_steps(kSteps);
  job.set_steps_done(kSteps);
  job.set_first_step(1);
  job.mutable_created()->set_seconds(1700000000);
  ASSERT_THAT((*store)->Insert(job), IsOk());
  for (int s = 1; s <= kSteps; ++s) {
    pb::StepRecord r;
    r.set_step(s);
    r.set_loss(5.0 / s);
    ASSERT_THAT((*store)->AppendStep(kJob, r), IsOk());
  }
  for (const char* text : {"planned 2 stages", "checkpoint of step 12 written"}) {
    pb::LogLine line;
    line.set_text(text);
    line.mutable_time()->set_seconds(1700000001);
    ASSERT_THAT((*store)->AppendLog(kJob, line), IsOk());
  }
}

class DashboardHttpTest : public ::testing::Test {
 protected:
  void Start(const std::string& token) {
    SeedStore(dir_.path());
    ManagerOptions options;
    options.state_dir = dir_.path();
    auto manager = JobManager::Create(options);
    ASSERT_THAT(manager, IsOk());
    manager_ = *std::move(manager);
    auto api = HttpApi::Start(manager_.get(), "127.0.0.1", 0, token);
    ASSERT_THAT(api, IsOk());
    api_ = *std::move(api);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", api_->port());
  }
  void SetUp() override { Start(UsesToken() ? kToken : ""); }
  virtual bool UsesToken() const { return false; }
  void TearDown() override {
    client_.reset();
    api_.reset();
    if (manager_) manager_->Shutdown();
  }

  TempDir dir_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<HttpApi> api_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(DashboardHttpTest, ServesThePageAndItsAssetsWithTheirTypes) {
  struct Expected {
    const char* path;
    const char* type;
    const char* marker;  // something only that file holds
  };
  for (const auto& [path, type, marker] :
       {Expected{"/", "text/html", "<script src=\"/dashboard.js\">"},
        Expected{"/jobs/job-000001", "text/html", "id=\"loss-curve\""},
        Expected{"/dashboard.js", "text/javascript", "since_step="},
        Expected{"/dashboard.css", "text/css", "tr.lost"}}) {
    auto res = client_->Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_THAT(res->get_header_value("Content-Type"), StartsWith(type)) << path;
    EXPECT_THAT(res->body, HasSubstr(marker)) << path;
  }
  // The bytes served are the compiled-in ones, whole.
  auto js = client_->Get("/dashboard.js");
  ASSERT_TRUE(js);
  const DashboardAsset* asset = FindDashboardAsset("/dashboard.js");
  ASSERT_NE(asset, nullptr);
  EXPECT_EQ(js->body, asset->body);
  EXPECT_EQ(FindDashboardAsset("/nope.js"), nullptr);
}

TEST_F(DashboardHttpTest, NothingOnThePageComesFromElsewhere) {
  for (const DashboardAsset& asset : DashboardAssets()) {
    EXPECT_THAT(std::string(asset.body), Not(HasSubstr("http://"))) << asset.path;
    EXPECT_THAT(std::string(asset.body), Not(HasSubstr("https://"))) << asset.path;
  }
}

TEST_F(DashboardHttpTest, SinceStepCutsTheHistory) {
  auto all = client_->Get("/api/jobs/job-000001");
  ASSERT_TRUE(all);
  EXPECT_EQ(json::parse(all->body)["history"].size(), static_cast<size_t>(kSteps));
  for (int since : {0, 5, kSteps - 1, kSteps, kSteps + 10}) {
    auto res = client_->Get(absl::StrCat("/api/jobs/job-000001?since_step=", since));
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json job = json::parse(res->body);
    EXPECT_EQ(job["job_id"], kJob);
    EXPECT_EQ(job["steps_done"], std::to_string(kSteps)) << "the status is whole";
    const json& history = job["history"];
    ASSERT_EQ(history.size(), static_cast<size_t>(std::max(0, kSteps - since))) << since;
    for (size_t i = 0; i < history.size(); ++i) {
      EXPECT_EQ(history[i]["step"], std::to_string(since + 1 + i));
    }
  }
}

TEST_F(DashboardHttpTest, SinceStepMustBeAStepNumber) {
  for (const char* bad : {"x", "-1", "3.5"}) {
    auto res = client_->Get(absl::StrCat("/api/jobs/job-000001?since_step=", bad));
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << bad;
    EXPECT_THAT(res->body, HasSubstr("since_step")) << bad;
  }
}

TEST_F(DashboardHttpTest, ServesAJobsLogLines) {
  auto res = client_->Get("/api/jobs/job-000001/logs");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json logs = json::parse(res->body)["logs"];
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_EQ(logs[1]["text"], "checkpoint of step 12 written");
  EXPECT_THAT(logs[0]["time"].get<std::string>(), StartsWith("2023-11-14T22:13:21"));
}

TEST_F(DashboardHttpTest, AnUnknownJobIsNotFound) {
  auto page = client_->Get("/jobs/job-999999");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 404);
  EXPECT_THAT(page->get_header_value("Content-Type"), StartsWith("text/html"));
  EXPECT_THAT(page->body, HasSubstr("no such job"));
  EXPECT_THAT(page->body, HasSubstr("job-999999"));
  // The id is escaped, not markup.
  auto tricky = client_->Get("/jobs/%3Cb%3Ex");
  ASSERT_TRUE(tricky);
  EXPECT_EQ(tricky->status, 404);
  EXPECT_THAT(tricky->body, Not(HasSubstr("<b>x")));
  for (const char* api : {"/api/jobs/job-999999", "/api/jobs/job-999999?since_step=3",
                          "/api/jobs/job-999999/logs"}) {
    auto res = client_->Get(api);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404) << api;
    EXPECT_THAT(res->body, HasSubstr("job-999999")) << api;
  }
}

class DashboardTokenTest : public DashboardHttpTest {
 protected:
  bool UsesToken() const override { return true; }
  httplib::Result Login(const std::string& token, const std::string& next = "/jobs/job-000001") {
    return client_->Post("/login",
                         absl::StrCat("token=", PercentEncode(token), "&next=", PercentEncode(next)),
                         "application/x-www-form-urlencoded");
  }
};

TEST_F(DashboardTokenTest, WithoutTheTokenThePageIsTheLoginForm) {
  for (const char* page : {"/", "/jobs/job-000001"}) {
    auto res = client_->Get(page);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << page;
    EXPECT_THAT(res->body, HasSubstr("action=\"/login\"")) << page;
    EXPECT_THAT(res->body, Not(HasSubstr("seeded"))) << page;
  }
  for (const char* data : {"/api/jobs", "/api/cluster", "/dashboard.js", "/metrics"}) {
    auto res = client_->Get(data);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << data;
    EXPECT_THAT(res->body, Not(HasSubstr(kJob))) << data;
  }
  auto css = client_->Get("/dashboard.css");  // the login form's look
  ASSERT_TRUE(css);
  EXPECT_EQ(css->status, 200);
}

TEST_F(DashboardTokenTest, TheRightTokenSetsAnHttpOnlyStrictCookie) {
  auto res = Login(kToken);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 303);
  EXPECT_EQ(res->get_header_value("Location"), "/jobs/job-000001");
  const std::string cookie = res->get_header_value("Set-Cookie");
  EXPECT_THAT(cookie, StartsWith("pipetrain_token="));
  EXPECT_THAT(cookie, HasSubstr("HttpOnly"));
  EXPECT_THAT(cookie, HasSubstr("SameSite=Strict"));
  EXPECT_THAT(res->get_header_value("Location"), Not(HasSubstr("tok")));
  const std::string value = cookie.substr(0, cookie.find(';'));
  EXPECT_THAT(value, Not(HasSubstr("with spaces"))) << "the cookie holds the token in hex";
  httplib::Headers with_cookie = {{"Cookie", absl::StrCat("other=1; ", value)}};
  for (const char* path : {"/", "/jobs/job-000001", "/dashboard.js", "/api/jobs",
                           "/api/jobs/job-000001?since_step=3", "/api/cluster"}) {
    auto ok = client_->Get(path, with_cookie);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << path;
  }
}

TEST_F(DashboardTokenTest, AWrongTokenShowsTheFormAgainWithoutACookie) {
  auto res = Login("not the token");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_FALSE(res->has_header("Set-Cookie"));
  EXPECT_THAT(res->body, HasSubstr("wrong token"));
  EXPECT_THAT(res->body, HasSubstr("action=\"/login\""));
  // A forged cookie is no better than none.
  auto forged = client_->Get("/api/jobs", {{"Cookie", "pipetrain_token=guess"}});
  ASSERT_TRUE(forged);
  EXPECT_EQ(forged->status, 401);
  auto page = client_->Get("/", {{"Cookie", "pipetrain_token=guess"}});
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 401);
  EXPECT_THAT(page->body, HasSubstr("action=\"/login\""));
}

TEST_F(DashboardTokenTest, TheBearerHeaderStillWorks) {
  httplib::Headers bearer = {{"Authorization", absl::StrCat("Bearer ", kToken)}};
  auto res = client_->Get("/api/jobs", bearer);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->body, HasSubstr(kJob));
  auto wrong = client_->Get("/api/jobs", {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(wrong->get_header_value("WWW-Authenticate"), "Bearer");
}

TEST_F(DashboardTokenTest, LoginGoesBackOnlyToAPathOfThisServer) {
  for (const char* elsewhere : {"//evil.example/", "https://evil.example/", "/\\evil"}) {
    auto res = Login(kToken, elsewhere);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->get_header_value("Location"), "/") << elsewhere;
  }
}

TEST(DashboardWebTest, CookiesAndForms) {
  EXPECT_EQ(PercentDecode(PercentEncode(kToken)), kToken);
  EXPECT_EQ(PercentDecode("a+b%21"), "a b!");
  EXPECT_EQ(PercentDecode("%4"), std::nullopt);
  EXPECT_EQ(PercentDecode("%zz"), std::nullopt);
  EXPECT_EQ(FormField("a=1&token=x%26y&b=", "token"), "x&y");
  EXPECT_EQ(FormField("a=1", "token"), std::nullopt);
  EXPECT_EQ(CookieValue("a=1; pipetrain_token=abc;b=2", "pipetrain_token"), "abc");
  EXPECT_EQ(CookieValue("xpipetrain_token=abc", "pipetrain_token"), std::nullopt);
  EXPECT_TRUE(CookieHoldsToken(LoginCookie(kToken), kToken));
  EXPECT_FALSE(CookieHoldsToken(LoginCookie("tok"), kToken));
  EXPECT_FALSE(CookieHoldsToken(LoginCookie(""), ""));
  EXPECT_EQ(SafeNextPath("/jobs/job-000001"), "/jobs/job-000001");
  EXPECT_EQ(SafeNextPath("javascript:alert(1)"), "/");
  EXPECT_EQ(HtmlEscape("<a href=\"x\">'&"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;");
}

}  // namespace
}  // namespace pipetrain::coordinator
