#include "bench/coordinator_load_bench.h"

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/scratch_dir.h"
#include "common/atomic_file.h"
#include "common/job_state.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/spec/job_spec.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain::bench {
namespace {

namespace pb = ::pipetrain::v1;
using json = nlohmann::json;

constexpr int kRounds = 4;            // of the history phase
constexpr int kJobsPerRound = 50;     // small jobs run one after another
constexpr int kWatchers = 50;         // WatchJob streams following the running job
constexpr int kPollers = 50;          // clients polling GetJob
constexpr int kQueued = 20;           // jobs waiting behind the running one
constexpr absl::Duration kPollEvery = absl::Milliseconds(100);  // each poller's period
constexpr absl::Duration kLoadTime = absl::Seconds(20);         // of one load run
constexpr absl::Duration kIdleTime = absl::Seconds(10);         // of the idle baseline
constexpr int kLoadRuns = 3;  // --repetitions N for more
constexpr int kChannelStorm = 1000;  // fresh connections, one GetJob each

// The coordinator's resident set size, from /proc; -1 if unreadable.
int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (!absl::ConsumePrefix(&v, "VmRSS:")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, "kB");
    int64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) return kb * 1024;
  }
  return -1;
}
double Mb(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// A model small enough that a job is mostly the coordinator's own work.
absl::StatusOr<pb::JobSpec> Spec(const ScratchDir& dir, int steps, const std::string& name) {
  const json spec = {
      {"name", name},
      {"model", {{"vocab_size", 256}, {"seq_len", 16}, {"d_model", 16}, {"n_heads", 2},
                 {"n_layers", 1}}},
      {"pipeline", {{"stages", 1}, {"micro_batches", 1}}},
      {"training", {{"steps", steps}, {"batch_size", 2}, {"seed", 1}, {"lr", 0.001}}},
      {"data", {{"corpus", dir.File("corpus.txt")}, {"validate_every_steps", 0}}},
      {"checkpoint", {{"every_steps", 0}, {"snapshot_every_steps", 0}}}};
  return coordinator::ParseJobSpec(spec.dump());
}

std::unique_ptr<pb::Coordinator::Stub> Stub(const std::string& address, int salt = 0) {
  grpc::ChannelArguments args;
  // A distinct argument makes a channel of its own (gRPC shares subchannels otherwise).
  if (salt != 0) args.SetInt("pipetrain.bench.salt", salt);
  return pb::Coordinator::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<std::string> Submit(pb::Coordinator::Stub& stub, const pb::JobSpec& spec) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  pb::SubmitJobResponse resp;
  grpc::Status s = stub.SubmitJob(&ctx, req, &resp);
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("submit: ", s.error_message()));
  return resp.job_id();
}

absl::StatusOr<pb::JobStatus> Get(pb::Coordinator::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::GetJobRequest req;
  req.set_job_id(id);
  pb::JobStatus job;
  grpc::Status s = stub.GetJob(&ctx, req, &job);
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("get ", id, ": ", s.error_message()));
  return job;
}

absl::Status WaitEnded(pb::Coordinator::Stub& stub, const std::string& id,
                       absl::Duration limit = absl::Minutes(5)) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    ASSIGN_OR_RETURN(pb::JobStatus job, Get(stub, id));
    if (common::JobEnded(job.state())) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(id, " did not end within ", absl::FormatDuration(limit)));
}

// Hundreds of small jobs, one after another: the memory after each round of them.
absl::Status HistoryPhase(testing::LocalCluster& c, const ScratchDir& dir, BenchResult& out) {
  auto stub = Stub(c.address());
  ASSIGN_OR_RETURN(pb::JobSpec spec, Spec(dir, 5, "load-small"));
  std::vector<double> rss;
  for (int r = 0; r < kRounds; ++r) {
    std::string last;
    for (int j = 0; j < kJobsPerRound; ++j) {
      ASSIGN_OR_RETURN(last, Submit(*stub, spec));
    }
    RETURN_IF_ERROR(WaitEnded(*stub, last));  // jobs run in order on the one stage
    absl::SleepFor(absl::Milliseconds(500));
    rss.push_back(Mb(RssBytes(c.coordinator_pid())));
    common::LogInfo("bench", absl::StrCat("coordinator-load: ", (r + 1) * kJobsPerRound,
                                          " jobs done, coordinator RSS ", rss.back(), " MB"));
  }
  out.Add(absl::StrCat("history_rss_mb_after_", kJobsPerRound, "_jobs"), rss.front());
  out.Add(absl::StrCat("history_rss_mb_after_", kRounds * kJobsPerRound, "_jobs"), rss.back());
  out.Add("history_growth_mb_per_100_jobs",
          (rss.back() - rss.front()) * 100.0 / ((kRounds - 1) * kJobsPerRound));
  return absl::OkStatus();
}

// GetJob's latency as kPollers clients see it, each asking every kPollEvery (one of
// `ids` in turn) until `stop`.
struct PollFigures {
  std::vector<double> latency_ms;  // sorted
  int64_t errors = 0;

  double Percentile(double q) const {
    const std::vector<double>& l = latency_ms;
    return l.empty() ? 0.0 : l[std::min(l.size() - 1, static_cast<size_t>(q * l.size()))];
  }
};

PollFigures Poll(testing::LocalCluster& c, const std::vector<std::string>& ids,
                 absl::Duration duration) {
  PollFigures f;
  absl::Mutex mu;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int p = 0; p < kPollers; ++p) {
    threads.emplace_back([&, p] {
      auto s = Stub(c.address());
      std::vector<double> mine;
      int64_t errors = 0;
      for (size_t i = p; !stop.load(); i += kPollers) {
        const absl::Time t0 = absl::Now();
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        pb::GetJobRequest req;
        req.set_job_id(ids[i % ids.size()]);
        pb::JobStatus job;
        if (!s->GetJob(&ctx, req, &job).ok()) ++errors;
        const absl::Duration took = absl::Now() - t0;
        mine.push_back(absl::ToDoubleMilliseconds(took));
        if (took < kPollEvery) absl::SleepFor(kPollEvery - took);
      }
      absl::MutexLock lock(&mu);
      f.latency_ms.insert(f.latency_ms.end(), mine.begin(), mine.end());
      f.errors += errors;
    });
  }
  absl::SleepFor(duration);
  stop = true;
  for (std::thread& t : threads) t.join();
  std::sort(f.latency_ms.begin(), f.latency_ms.end());
  return f;
}

// The baseline the load runs are divided by, measured in the same run: the same
// pollers on an idle coordinator (no job running or queued, nobody watching), asking
// for the history phase's finished jobs.
absl::StatusOr<PollFigures> IdleBaseline(testing::LocalCluster& c, BenchResult& out) {
  std::vector<std::string> ids;
  for (int j = 1; j <= kQueued + 1; ++j) ids.push_back(absl::StrFormat("job-%06d", j));
  PollFigures idle = Poll(c, ids, kIdleTime);
  if (idle.latency_ms.empty() || idle.Percentile(0.50) <= 0) {
    return absl::InternalError("coordinator-load: the idle baseline measured nothing");
  }
  out.Add("idle_getjob_requests", static_cast<double>(idle.latency_ms.size()));
  out.Add("idle_getjob_p50_ms", idle.Percentile(0.50));
  out.Add("idle_getjob_p99_ms", idle.Percentile(0.99));
  out.Add("idle_getjob_errors", static_cast<double>(idle.errors));
  return idle;
}

// kWatchers WatchJob streams following `running` until their contexts are cancelled:
// the events they read and their errors (other than the cancellation).
struct Watchers {
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::thread> threads;
  absl::Mutex mu;
  int64_t events = 0;
  int64_t errors = 0;

  void Start(testing::LocalCluster& c, const std::string& running) {
    for (int w = 0; w < kWatchers; ++w) {
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      threads.emplace_back([this, &c, running, ctx = contexts.back().get()] {
        auto s = Stub(c.address());
        pb::WatchJobRequest req;
        req.set_job_id(running);
        auto reader = s->WatchJob(ctx, req);
        pb::JobEvent e;
        int64_t n = 0;
        while (reader->Read(&e)) ++n;
        grpc::Status st = reader->Finish();
        absl::MutexLock lock(&mu);
        events += n;
        if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) ++errors;
      });
    }
  }
  void Stop() {
    for (auto& ctx : contexts) ctx->TryCancel();
    for (std::thread& t : threads) t.join();
  }
};

// One load run: a long job, kQueued behind it, kWatchers following it, kPollers polling;
// GetJob's latency also as ratios to the idle baseline's.
absl::Status LoadRun(testing::LocalCluster& c, const ScratchDir& dir, const PollFigures& idle,
                     int run, BenchResult& out) {
  auto stub = Stub(c.address());
  ASSIGN_OR_RETURN(pb::JobSpec long_spec, Spec(dir, 1000000, "load-long"));
  ASSIGN_OR_RETURN(pb::JobSpec small, Spec(dir, 5, "load-queued"));
  ASSIGN_OR_RETURN(std::string running, Submit(*stub, long_spec));
  std::vector<std::string> ids = {running};
  for (int j = 0; j < kQueued; ++j) {
    ASSIGN_OR_RETURN(std::string id, Submit(*stub, small));
    ids.push_back(id);
  }
  absl::SleepFor(absl::Seconds(1));  // the long job under way
  const int64_t before = RssBytes(c.coordinator_pid());

  Watchers watchers;
  watchers.Start(c, running);
  const PollFigures f = Poll(c, ids, kLoadTime);
  watchers.Stop();
  for (const std::string& id : ids) {
    grpc::ClientContext ctx;
    pb::CancelJobRequest req;
    req.set_job_id(id);
    pb::JobStatus ignored;
    stub->CancelJob(&ctx, req, &ignored);  // ended ones answer FAILED_PRECONDITION
  }
  RETURN_IF_ERROR(WaitEnded(*stub, ids.back()));
  absl::SleepFor(absl::Milliseconds(500));
  const int64_t after = RssBytes(c.coordinator_pid());

  const std::string r = absl::StrCat("run", run, "_");
  out.Add(r + "getjob_requests", static_cast<double>(f.latency_ms.size()));
  out.Add(r + "getjob_p50_ms", f.Percentile(0.50));
  out.Add(r + "getjob_p99_ms", f.Percentile(0.99));
  out.Add(r + "getjob_max_ms", f.latency_ms.empty() ? 0 : f.latency_ms.back());
  out.Add(r + "getjob_p50_x_idle", f.Percentile(0.50) / idle.Percentile(0.50));
  out.Add(r + "getjob_p99_x_idle", f.Percentile(0.99) / idle.Percentile(0.99));
  out.Add(r + "getjob_errors", static_cast<double>(f.errors));
  out.Add(r + "watch_events", static_cast<double>(watchers.events));
  out.Add(r + "watch_errors", static_cast<double>(watchers.errors));
  out.Add(r + "rss_mb_before", Mb(before));
  out.Add(r + "rss_mb_after", Mb(after));
  return absl::OkStatus();
}

// Many clients that connect, ask once and go (as `pipetrain status` in a shell loop).
absl::Status ChannelStorm(testing::LocalCluster& c, const std::string& id, BenchResult& out) {
  const int64_t before = RssBytes(c.coordinator_pid());
  int64_t errors = 0;
  for (int i = 1; i <= kChannelStorm; ++i) {
    auto stub = Stub(c.address(), i);
    if (!Get(*stub, id).ok()) ++errors;
  }
  absl::SleepFor(absl::Milliseconds(500));
  out.Add("storm_connections", kChannelStorm);
  out.Add("storm_errors", static_cast<double>(errors));
  out.Add("storm_rss_mb_before", Mb(before));
  out.Add("storm_rss_mb_after", Mb(RssBytes(c.coordinator_pid())));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchResult> RunCoordinatorLoadBench(const BenchOptions& options) {
  ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::Make("coordinator_load"));
  RETURN_IF_ERROR(
      common::WriteFileAtomically(dir.File("corpus.txt"), testing::EnglishLikeCorpus()));
  ASSIGN_OR_RETURN(std::unique_ptr<testing::LocalCluster> cluster,
                   testing::LocalCluster::Start(dir.File("state"), 1));
  testing::LocalCluster& c = *cluster;
  BenchResult out;
  out.Label("machine", "2 shared cores; coordinator and stage on the same machine");
  out.Add("coordinator_rss_mb_at_start", Mb(RssBytes(c.coordinator_pid())));
  RETURN_IF_ERROR(HistoryPhase(c, dir, out));
  ASSIGN_OR_RETURN(const PollFigures idle, IdleBaseline(c, out));
  const int runs = options.repetitions > 0 ? options.repetitions : kLoadRuns;
  for (int run = 1; run <= runs; ++run) RETURN_IF_ERROR(LoadRun(c, dir, idle, run, out));
  RETURN_IF_ERROR(ChannelStorm(c, "job-000001", out));
  return out;
}

}  // namespace pipetrain::bench
