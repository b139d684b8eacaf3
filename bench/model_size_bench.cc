#include "bench/model_size_bench.h"

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/model_size_search.h"
#include "bench/scratch_dir.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "coordinator/planner/planner.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain::bench {
namespace {

namespace fs = std::filesystem;
namespace pb = ::pipetrain::v1;
using json = nlohmann::json;
using namespace std::chrono_literals;

// GPipe (Huang et al. 2019), table 1: the largest AmoebaNet per accelerator count.
constexpr double kGpipeParamsK1Never = 82e6;
constexpr double kGpipeParamsK1Always = 318e6;
constexpr double kGpipeParamsK8Always = 1.8e9;

// The training shape: 16 sequences of 64 tokens in 8 micro-batches of 2 (GPipe's
// schedule holds all 8 on every stage), so that without re-materialization a block's
// activations (~9 KB a token at d_model 128) outweigh its weights and optimizer state
// (16 bytes a parameter), and with it only each stage's input stays per micro-batch.
constexpr int kSeqLen = 64;
constexpr int kBatch = 16;
constexpr int kMicroBatches = 8;
constexpr int kSteps = 2;
constexpr int kHeads = 4;
constexpr int kDepthWidth = 128;  // d_model of the deeper family
constexpr int kWidthDepth = 8;    // blocks of the wider family: one a stage at K = 8
constexpr int kWidthStep = 32;    // d_model steps of the wider family (8 per head)
constexpr int kMaxTries = 4;
constexpr double kDefaultCap = 128.0 * (1 << 20);

struct Settings {
  double cap_bytes = kDefaultCap;
  std::vector<int> stages = {1, 2, 4, 8};
  // --replicas: R copies of one stage instead of K stages (empty: the K series).
  std::vector<int> replicas;
  std::vector<ModelFamily> families = {ModelFamily::kDepth, ModelFamily::kWidth};
  std::string data_out;
};

// "1,2,4": counts from 1 (the baseline), named `what` in errors.
absl::StatusOr<std::vector<int>> Counts(absl::string_view v, const std::string& what) {
  std::vector<int> out;
  for (absl::string_view k : absl::StrSplit(v, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(k, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat(what, "='", v, "': '", k, "' is not a count"));
    }
    out.push_back(n);
  }
  if (out.empty() || out[0] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "='", v, "' must start with 1 (the baseline)"));
  }
  return out;
}

absl::StatusOr<Settings> SettingsFrom(const BenchOptions& options) {
  Settings s;
  if (!options.replicas.empty()) {
    ASSIGN_OR_RETURN(s.replicas, Counts(options.replicas, "--replicas"));
  }
  if (const char* v = std::getenv("PIPETRAIN_BENCH_MEMORY_LIMIT")) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(v, &bytes) || bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("PIPETRAIN_BENCH_MEMORY_LIMIT='", v, "' is not a positive byte count"));
    }
    s.cap_bytes = static_cast<double>(bytes);
  }
  if (const char* v = std::getenv("PIPETRAIN_BENCH_MODEL_SIZE_STAGES")) {
    ASSIGN_OR_RETURN(s.stages, Counts(v, "PIPETRAIN_BENCH_MODEL_SIZE_STAGES"));
  }
  if (const char* v = std::getenv("PIPETRAIN_BENCH_MODEL_SIZE_FAMILIES")) {
    s.families.clear();
    for (absl::string_view f : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      if (f == "depth") {
        s.families.push_back(ModelFamily::kDepth);
      } else if (f == "width") {
        s.families.push_back(ModelFamily::kWidth);
      } else {
        return absl::InvalidArgumentError(absl::StrCat("PIPETRAIN_BENCH_MODEL_SIZE_FAMILIES='", v,
                                                       "': '", f, "' is not depth or width"));
      }
    }
  }
  if (const char* v = std::getenv("PIPETRAIN_BENCH_DATA_OUT")) s.data_out = v;
  return s;
}

FamilySpec SpecOf(ModelFamily family) {
  FamilySpec spec;
  spec.family = family;
  spec.base = {.vocab_size = 256,
               .seq_len = kSeqLen,
               .d_model = kDepthWidth,
               .n_heads = kHeads,
               .n_layers = kWidthDepth};
  spec.width_step = kWidthStep;
  return spec;
}

// What the coordinator plans with for these stages (stage_costs: 10 GFLOP/s for the one
// thread, a loopback link, the stages' --memory-limit as the cap), so that the plan here
// is the one the job runs with.
// With r replicas each takes the batch one stage takes alone (weak scaling: the same
// activations a stage, so that what grows is what the optimizer's split frees).
planner::PlanOptions OptionsFor(const model::TransformerConfig& m, int k, int r,
                                pb::RecomputeMode recompute, double cap) {
  planner::PlanOptions o;
  o.model = m;
  o.stages = k;
  o.replicas = r;
  o.micro_batches = kMicroBatches;
  o.batch_size = kBatch * r;
  o.schedule = planner::ScheduleKind::kGpipe;
  o.recompute = recompute;
  o.device_flops = 10e9;
  o.link_bytes_per_s = 1e9;
  o.memory_cap_bytes = cap;
  return o;
}

int64_t ParamsOf(const model::TransformerConfig& m) {
  int64_t p = 0;
  for (int l = 0; l < m.num_pipeline_layers(); ++l) p += model::CostOfLayer(m, l).params;
  return p;
}

double JsonNumber(const json& v) {
  if (v.is_number()) return v.get<double>();
  double d = 0;
  if (v.is_string()) (void)absl::SimpleAtod(v.get<std::string>(), &d);
  return d;
}

// --- Peak RSS of our own stage processes, found by the port each listens on. ---

// The inode of the socket listening on `port`, from /proc/net/tcp or tcp6 (gRPC listens
// on a v4-mapped IPv6 socket).
std::optional<std::string> ListeningInode(int port) {
  const std::string want = absl::StrFormat(":%04X", port);
  for (const char* table : {"/proc/net/tcp6", "/proc/net/tcp"}) {
    std::ifstream tcp(table);
    std::string line;
    std::getline(tcp, line);  // header
    while (std::getline(tcp, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
      if (f.size() < 10 || f[3] != "0A" || f[1].size() < want.size()) continue;
      if (f[1].compare(f[1].size() - want.size(), want.size(), want) == 0) return f[9];
    }
  }
  return std::nullopt;
}

// Our child processes (the cluster's coordinator and stages).
std::vector<pid_t> ChildPids() {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  const pid_t self = getpid();
  while (dirent* e = readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(text.substr(paren + 2), ' ');
    int ppid = 0;
    if (f.size() > 1 && absl::SimpleAtoi(f[1], &ppid) && ppid == self) out.push_back(pid);
  }
  closedir(d);
  return out;
}

// The child holding socket `inode`, if any.
std::optional<pid_t> PidWithSocket(const std::vector<pid_t>& pids, const std::string& inode) {
  const std::string target = absl::StrCat("socket:[", inode, "]");
  for (pid_t pid : pids) {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), ec)) {
      std::error_code lec;
      if (fs::read_symlink(fd.path(), lec).string() == target) return pid;
    }
  }
  return std::nullopt;
}

// VmHWM of `pid` in bytes, 0 if unreadable.
double PeakRss(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    int64_t kb = 0;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() >= 2 && absl::SimpleAtoi(f[1], &kb)) return kb * 1024.0;
  }
  return 0;
}

// --- One training run on real stages. ---

struct StageFigures {
  double measured = 0;   // the stage's reported peak_memory_bytes, max over the steps
  double predicted = 0;  // the plan's state + simulated peak activations
  // VmHWM of its process (0 if not found): as of the last poll before the job reported
  // its last step, and at the job's end (which adds the final checkpoint's export).
  double rss_idle = 0;  // before the job: the process with no model
  double rss_training = 0;
  double rss_end = 0;
  // What training added to the process against what the stage reported: above 1 by
  // what the report leaves out (transient gradients, received frames, allocator slack).
  double RssOverReported() const {
    return rss_training > 0 && measured > 0 ? (rss_training - rss_idle) / measured : 0;
  }
};

struct RunFigures {
  ModelFamily family = ModelFamily::kDepth;
  int k = 1;
  int r = 1;  // replicas of the K stages
  pb::RecomputeMode recompute = pb::RECOMPUTE_NEVER;
  int64_t planned_n = 0;  // the planner's largest
  int64_t n = 0;          // the largest that trained
  int64_t params = 0;
  std::vector<StepDownResult::Try> tries;
  std::vector<StageFigures> stages;
  double step_s = 0;  // the slower of the two steps
  double seconds = 0;
  // The largest (or smallest) of `figure` over the stages; 0 without stages.
  template <typename F>
  double Over(F figure, bool largest = true) const {
    if (stages.empty()) return 0;
    double m = figure(stages[0]);
    for (const StageFigures& s : stages)
      m = largest ? std::max(m, figure(s)) : std::min(m, figure(s));
    return m;
  }
};

// Trains `m` for two steps on a fresh cluster of k capped stages through the CLI; OK
// when the job succeeded and no stage's reported peak exceeded the cap.
absl::Status TrainOnce(const model::TransformerConfig& m, int k, int r, pb::RecomputeMode recompute,
                       const Settings& settings, const std::string& corpus, RunFigures& figures) {
  ASSIGN_OR_RETURN(planner::Plan plan,
                   planner::MakePlan(OptionsFor(m, k, r, recompute, settings.cap_bytes)));
  ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::Make("model_size"));
  // The largest model without in-memory snapshots (OptionsFor plans none either): the
  // figures in docs/PERFORMANCE.md were measured that way, and snapshots would take
  // 2 x 12 bytes per parameter of the stage and of its ring predecessor on top.
  const json spec = {
      {"name", absl::StrFormat("model-size %s K=%d R=%d %s", FamilyName(figures.family), k, r,
                               planner::RecomputeName(recompute))},
      {"model",
       {{"vocab_size", m.vocab_size},
        {"seq_len", m.seq_len},
        {"d_model", m.d_model},
        {"n_heads", m.n_heads},
        {"n_layers", m.n_layers}}},
      {"pipeline",
       {{"stages", k},
        {"replicas", r},
        {"micro_batches", kMicroBatches},
        {"schedule", "gpipe"},
        {"recompute", planner::RecomputeName(recompute)}}},
      {"training", {{"steps", kSteps}, {"batch_size", kBatch * r}, {"seed", 1}, {"lr", 1e-3}}},
      {"data", {{"corpus", corpus}}},
      {"checkpoint", {{"snapshot_every_steps", 0}}}};
  const std::string spec_file = dir.path() + "/job.json";
  RETURN_IF_ERROR(common::WriteFileAtomically(spec_file, spec.dump(2)));
  const std::string cap = absl::StrCat(static_cast<int64_t>(settings.cap_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<testing::LocalCluster> cluster,
                   testing::LocalCluster::Start(
                       dir.path() + "/state", k * r,
                       std::vector<std::string>{"--memory-limit", cap, "--threads", "1"}));
  // Each stage's process, by its address.
  const std::vector<pid_t> children = ChildPids();
  std::map<std::string, pid_t> pid_of;
  for (const std::string& address : cluster->stage_addresses()) {
    int port = 0;
    if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) continue;
    if (auto inode = ListeningInode(port)) {
      if (auto pid = PidWithSocket(children, *inode)) pid_of[address] = *pid;
    }
  }
  std::map<pid_t, double> hwm_idle;
  for (const auto& [address, pid] : pid_of) hwm_idle[pid] = PeakRss(pid);
  ASSIGN_OR_RETURN(testing::RunResult submit, cluster->Cli({"submit", spec_file, "--no-wait"}));
  const std::string id(absl::StripAsciiWhitespace(submit.out));
  if (submit.exit_code != 0 || id.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("submit exited ", submit.exit_code, ": ", submit.err.substr(0, 400)));
  }
  // Follows the job, reading every stage's VmHWM while steps remain: the peak of
  // training without the checkpoint export that ends every job.
  std::map<pid_t, double> hwm_training;
  auto stub = pb::Coordinator::NewStub(
      grpc::CreateChannel(cluster->address(), grpc::InsecureChannelCredentials()));
  const auto deadline = std::chrono::steady_clock::now() + 600s;
  while (true) {
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job ", id, " did not end within 600 s"));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    pb::GetJobRequest request;
    request.set_job_id(id);
    pb::JobStatus job;
    if (stub->GetJob(&ctx, request, &job).ok()) {
      const bool ended = job.state() == pb::JobStatus::SUCCEEDED ||
                         job.state() == pb::JobStatus::FAILED ||
                         job.state() == pb::JobStatus::CANCELLED;
      if (ended) break;
      if (job.steps_done() < kSteps) {
        for (const auto& [address, pid] : pid_of) hwm_training[pid] = PeakRss(pid);
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSIGN_OR_RETURN(testing::RunResult status, cluster->Cli({"status", id, "--json"}));
  const json job = json::parse(status.out, nullptr, false);
  if (job.is_discarded()) {
    return absl::InternalError(absl::StrCat("status ", id, " --json is not JSON: ", status.err));
  }
  if (job.value("state", "") != "SUCCEEDED") {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " ended ", job.value("state", "?"), ": ", job.value("reason", "")));
  }
  figures.stages.assign(k, {});
  for (int s = 0; s < k; ++s) {
    figures.stages[s].predicted = plan.stages[s].state_bytes + plan.stages[s].peak_activation_bytes;
  }
  figures.step_s = 0;
  for (const json& step : job["history"]) {
    figures.step_s = std::max(figures.step_s, JsonNumber(step["step_time_s"]));
    for (const json& st : step["stages"]) {
      const int s = static_cast<int>(JsonNumber(st["stage"]));
      if (s < 0 || s >= k) continue;
      figures.stages[s].measured =
          std::max(figures.stages[s].measured, JsonNumber(st["peak_memory_bytes"]));
    }
  }
  // Peak RSS by pipeline position: stage id -> address (cluster --json) -> pid.
  std::map<std::string, std::string> address_of;
  if (auto view = cluster->Cli({"cluster", "--json"}); view.ok()) {
    const json c = json::parse(view->out, nullptr, false);
    if (!c.is_discarded())
      for (const json& st : c["stages"]) address_of[st["stage_id"]] = st["address"];
  }
  int s = 0;
  for (const json& stage_id : job["stage_ids"]) {
    if (s >= k) break;
    auto it = pid_of.find(address_of[stage_id.get<std::string>()]);
    if (it != pid_of.end()) {
      figures.stages[s].rss_idle = hwm_idle[it->second];
      figures.stages[s].rss_training = hwm_training[it->second];
      figures.stages[s].rss_end = PeakRss(it->second);
    }
    ++s;
  }
  for (int i = 0; i < k; ++i) {
    if (figures.stages[i].measured > settings.cap_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("job %s stage %d reported a peak of %.1f MiB, over the %.1f MiB cap", id,
                          i, figures.stages[i].measured / 1048576, settings.cap_bytes / 1048576));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RunFigures> FindLargest(ModelFamily family, int k, int r,
                                       pb::RecomputeMode recompute, const Settings& settings,
                                       const std::string& corpus) {
  const auto start = std::chrono::steady_clock::now();
  RunFigures figures;
  figures.family = family;
  figures.k = k;
  figures.r = r;
  figures.recompute = recompute;
  const FamilySpec spec = SpecOf(family);
  ASSIGN_OR_RETURN(figures.planned_n, LargestPlannable(spec, OptionsFor(spec.base, k, r, recompute,
                                                                        settings.cap_bytes)));
  absl::StatusOr<StepDownResult> trained =
      StepDown(figures.planned_n, SmallestSize(spec, k), kMaxTries, [&](int64_t n) {
        absl::Status s =
            TrainOnce(ModelOfSize(spec, n), k, r, recompute, settings, corpus, figures);
        std::cerr << absl::StrFormat("model-size: %s K=%d R=%d %s n=%d: %s\n", FamilyName(family),
                                     k, r, planner::RecomputeName(recompute), n,
                                     s.ok() ? "trained" : std::string(s.message()));
        return s;
      });
  if (!trained.ok()) {
    return absl::Status(
        trained.status().code(),
        absl::StrFormat("model-size %s K=%d R=%d recompute %s: %s", FamilyName(family), k, r,
                        planner::RecomputeName(recompute), trained.status().message()));
  }
  figures.n = trained->n;
  figures.tries = trained->tries;
  figures.params = ParamsOf(ModelOfSize(spec, figures.n));
  figures.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return figures;
}

std::string Mode(pb::RecomputeMode r) { return planner::RecomputeName(r); }

double PeakOverPredicted(const StageFigures& s) { return s.measured / s.predicted; }

}  // namespace

absl::StatusOr<BenchResult> RunModelSizeBench(const BenchOptions& options) {
  ASSIGN_OR_RETURN(Settings settings, SettingsFrom(options));
  // The K series (stages), or with --replicas the R series (copies of one stage).
  const bool by_replicas = !settings.replicas.empty();
  const std::vector<int>& counts = by_replicas ? settings.replicas : settings.stages;
  const std::string x = by_replicas ? "r" : "k", X = by_replicas ? "R" : "K";
  ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::Make("model_size"));
  const std::string corpus = dir.path() + "/corpus.txt";
  RETURN_IF_ERROR(common::WriteFileAtomically(corpus, testing::EnglishLikeCorpus()));

  const std::vector<pb::RecomputeMode> modes = {pb::RECOMPUTE_NEVER, pb::RECOMPUTE_ALWAYS};
  // (family, mode, K or R) -> figures
  std::map<std::tuple<ModelFamily, pb::RecomputeMode, int>, RunFigures> runs;
  for (ModelFamily family : settings.families) {
    for (pb::RecomputeMode mode : modes) {
      for (int n : counts) {
        ASSIGN_OR_RETURN(RunFigures f, FindLargest(family, by_replicas ? 1 : n,
                                                   by_replicas ? n : 1, mode, settings, corpus));
        runs[{family, mode, n}] = std::move(f);
      }
    }
  }

  BenchResult result;
  result.Label("memory_limit", absl::StrFormat("%.0f MiB per stage (--memory-limit %.0f)",
                                               settings.cap_bytes / 1048576, settings.cap_bytes));
  result.Label("shape",
               absl::StrFormat("vocab 256, seq %d, %d heads, batch %d in %d micro-batches, gpipe, "
                               "%d steps, 1 thread a stage; depth: d_model %d, more blocks; "
                               "width: %d blocks, d_model in steps of %d",
                               kSeqLen, kHeads, kBatch, kMicroBatches, kSteps, kDepthWidth,
                               kWidthDepth, kWidthStep));
  if (by_replicas) {
    result.Label("series", "R data-parallel copies of one stage, each on the batch one stage "
                           "takes alone, the optimizer split among them (pipeline.shard_optimizer)");
  }
  std::ostringstream table;
  table << absl::StrFormat(
      "# family %s recompute params ratio_to_%s_times_1 measured_peak_over_predicted"
      "  (family: depth|width; %s; recompute: never|always; params: of the largest"
      " model that trained; ratio_to_%s_times_1: params / (%s * params at %s = 1, same family"
      " and recompute); measured_peak_over_predicted: the largest over the stages of the"
      " stage's reported peak / the planner's state + simulated activations)\n",
      X, x, by_replicas ? "R: copies of one stage" : "K: stages", x, X, X);
  const int k_max = counts.back();
  for (ModelFamily family : settings.families) {
    const std::string fam = FamilyName(family);
    for (pb::RecomputeMode mode : modes) {
      const double base = static_cast<double>(runs[{family, mode, 1}].params);
      for (int k : counts) {
        const RunFigures& f = runs[{family, mode, k}];
        const std::string key = absl::StrCat(fam, "_", x, k, "_", Mode(mode));
        const double ratio = f.params / (k * base);
        result.Add(key + "_params", static_cast<double>(f.params));
        result.Add(key + "_size_n", static_cast<double>(f.n));
        result.Add(key + "_planned_n", static_cast<double>(f.planned_n));
        result.Add(key + "_tries", static_cast<double>(f.tries.size()));
        if (k > 1) result.Add(absl::StrCat(key, "_ratio_to_", x, "_times_1"), ratio);
        result.Add(key + "_peak_over_cap_max",
                   f.Over([&](const StageFigures& s) { return s.measured / settings.cap_bytes; }));
        result.Add(key + "_peak_over_predicted_max", f.Over(PeakOverPredicted));
        result.Add(key + "_peak_over_predicted_min", f.Over(PeakOverPredicted, false));
        result.Add(key + "_rss_training_max_mib",
                   f.Over([](const StageFigures& s) { return s.rss_training; }) / 1048576);
        result.Add(key + "_rss_end_max_mib",
                   f.Over([](const StageFigures& s) { return s.rss_end; }) / 1048576);
        result.Add(key + "_rss_growth_over_reported_max",
                   f.Over([](const StageFigures& s) { return s.RssOverReported(); }));
        result.Add(key + "_step_s", f.step_s);
        result.Add(key + "_search_s", f.seconds);
        table << absl::StrFormat("%s %d %s %d %.4f %.4f\n", fam, k, Mode(mode), f.params, ratio,
                                 f.Over(PeakOverPredicted));
        std::vector<std::string> per_stage, tries;
        for (size_t s = 0; s < f.stages.size(); ++s) {
          per_stage.push_back(absl::StrFormat(
              "s%d peak/predicted %.1f/%.1f MiB (x%.3f), rss idle/training/end %.0f/%.0f/%.0f MiB "
              "(growth/peak x%.3f)",
              s, f.stages[s].measured / 1048576, f.stages[s].predicted / 1048576,
              f.stages[s].measured / f.stages[s].predicted, f.stages[s].rss_idle / 1048576,
              f.stages[s].rss_training / 1048576, f.stages[s].rss_end / 1048576,
              f.stages[s].RssOverReported()));
        }
        for (const auto& t : f.tries)
          tries.push_back(
              absl::StrCat("n=", t.n, t.failure.empty() ? " trained" : ": " + t.failure));
        result.Label(key + "_stages", absl::StrJoin(per_stage, "; "));
        result.Label(key + "_tries", absl::StrJoin(tries, " | "));
      }
    }
    // Re-materialization's gain and the targets.
    for (int k : counts) {
      result.Add(absl::StrCat(fam, "_", x, k, "_remat_gain"),
                 static_cast<double>(runs[{family, pb::RECOMPUTE_ALWAYS, k}].params) /
                     runs[{family, pb::RECOMPUTE_NEVER, k}].params);
    }
    for (pb::RecomputeMode mode : modes) {
      if (k_max == 1) break;
      const double ratio = runs[{family, mode, k_max}].params /
                           (k_max * static_cast<double>(runs[{family, mode, 1}].params));
      // The aims: 0.9 of K times for stages (GPipe's), 0.8 of R times for copies
      // (whose weights and gradients stay whole: only the moments divide).
      const double aim = by_replicas ? 0.8 : 0.9;
      result.Label(absl::StrFormat("target_%s_%s_%s%d_ratio_ge_%.1f", fam, Mode(mode), x, k_max, aim),
                   absl::StrFormat("%s (%.3f)", ratio >= aim ? "PASS" : "MISS", ratio));
    }
  }
  double worst = 0;
  for (const auto& [key, f] : runs) {
    for (const StageFigures& s : f.stages)
      worst = std::max(worst, std::abs(s.measured / s.predicted - 1));
  }
  result.Label("target_peak_within_10pct_of_predicted",
               absl::StrFormat("%s (largest |measured / predicted - 1| over every stage of every "
                               "run: %.3f)",
                               worst <= 0.1 ? "PASS" : "MISS", worst));
  result.Add("gpipe_k1_never_params", kGpipeParamsK1Never);
  result.Add("gpipe_k1_always_params", kGpipeParamsK1Always);
  result.Add("gpipe_k8_always_params", kGpipeParamsK8Always);
  result.Add("gpipe_k1_remat_gain", kGpipeParamsK1Always / kGpipeParamsK1Never);
  result.Add("gpipe_k8_always_ratio_to_k_times_1",
             kGpipeParamsK8Always / (8 * kGpipeParamsK1Always));
  result.Label("table", table.str());
  if (!settings.data_out.empty()) RETURN_IF_ERROR(common::WriteFileAtomically(settings.data_out, table.str()));
  return result;
}

}  // namespace pipetrain::bench
