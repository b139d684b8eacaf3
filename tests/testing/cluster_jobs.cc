#include "tests/testing/cluster_jobs.h"

#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/tolerance.h"

namespace pipetrain::testing {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::vector<std::string> SubmitArgs(const std::string& spec_file,
                                    const std::vector<std::string>& sets) {
  std::vector<std::string> args = {"submit", spec_file};
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

LocalClusterOptions WriteTheCorpus(const TempDir& dir) {
  WriteFileOrDie(dir.File("corpus.txt"), EnglishLikeCorpus());
  return {};
}

// What the SharedClusterTests of one process share: the cluster (and the corpus in its
// folder) and the jobs run for SharedJob.
struct Shared {
  ProcessCluster cluster{SharedClusterTest::kStages, WriteTheCorpus};
  std::map<std::string, std::string> jobs;  // SharedJob's key -> job id
};

Shared& TheShared() {
  static Shared shared;  // destroyed at exit, so that the stages stop with the process
  return shared;
}

}  // namespace

ProcessCluster::ProcessCluster(int stages, const Prepare& prepare) : stages_(stages) {
  if (prepare) options_ = prepare(dir_);
}

LocalCluster* ProcessCluster::Get() {
  if (cluster_ == nullptr && failure_.ok()) {
    auto started = LocalCluster::Start(StateDir(), stages_, options_);
    if (started.ok()) {
      cluster_ = *std::move(started);
    } else {
      failure_ = started.status();
    }
  }
  return cluster_.get();
}

std::vector<double> Losses(const json& status) {
  std::vector<double> out;
  for (const json& h : status["history"]) out.push_back(h["loss"].get<double>());
  return out;
}

std::string SubmittedId(const std::string& out) {
  const size_t at = out.find("submitted job-");
  if (at == std::string::npos) return "";
  std::vector<std::string> words =
      absl::StrSplit(out.substr(at, out.find('\n', at) - at), ' ');
  return words.size() > 1 ? words[1] : "";
}

ClusterJobTest::ClusterJobTest() {
  WriteFileOrDie(dir_.File("corpus.txt"), EnglishLikeCorpus());
  spec_ = {
      {"name", "e2e"},
      {"model", {{"vocab_size", 256}, {"seq_len", 16}, {"d_model", 32}, {"n_heads", 2},
                 {"n_layers", 2}}},
      {"pipeline", {{"stages", 1}, {"micro_batches", 4}, {"schedule", "gpipe"}}},
      {"training", {{"steps", 4}, {"batch_size", 8}, {"seed", 7}, {"lr", 0.01},
                    {"weight_decay", 0.0}}},
      {"data", {{"corpus", dir_.File("corpus.txt")}, {"validate_every_steps", 2}}},
      {"checkpoint", {{"every_steps", 2}}}};
}

std::string ClusterJobTest::WriteSpec(const json& spec, const std::string& name) {
  WriteFileOrDie(dir_.File(name), spec.dump(2));
  return dir_.File(name);
}

std::string ClusterJobTest::SubmitAndFollow(LocalCluster& c, const std::vector<std::string>& sets,
                                            int expect_exit) {
  auto r = c.Cli(SubmitArgs(WriteSpec(spec_), sets));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return "";
  EXPECT_EQ(r->exit_code, expect_exit) << r->out << r->err;
  // "submitted job-000001 (...)" is the first line.
  const std::string first = r->out.substr(0, r->out.find('\n'));
  EXPECT_THAT(first, HasSubstr("submitted job-")) << r->out;
  return SubmittedId(first);
}

std::string ClusterJobTest::SubmitNoWait(LocalCluster& c, const std::vector<std::string>& sets) {
  std::vector<std::string> args = SubmitArgs(WriteSpec(spec_), sets);
  args.push_back("--no-wait");
  auto r = c.Cli(args);
  EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
  return r.ok() ? std::string(absl::StripAsciiWhitespace(r->out)) : "";
}

json ClusterJobTest::Status(LocalCluster& c, const std::string& id) {
  auto r = c.Cli({"status", id, "--json"});
  EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
  json j = json::parse(r.ok() ? r->out : "", nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << (r.ok() ? r->out : "");
  return j;
}

json ClusterJobTest::WaitFor(LocalCluster& c, const std::string& id,
                             const std::function<bool(const json&)>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  json s;
  while (std::chrono::steady_clock::now() < deadline) {
    s = Status(c, id);
    if (pred(s)) return s;
    std::this_thread::sleep_for(100ms);
  }
  ADD_FAILURE() << "job " << id << " never reached the wanted state: " << s.dump();
  return s;
}

std::string ClusterJobTest::StageAddress(LocalCluster& c, const std::string& stage_id) {
  auto view = c.Cli({"cluster", "--json"});
  EXPECT_TRUE(view.ok() && view->exit_code == 0);
  if (!view.ok()) return "";
  const json stages = json::parse(view->out, nullptr, false);
  if (stages.is_discarded()) return "";
  for (const json& s : stages["stages"]) {
    if (s["stage_id"] == stage_id) return s["address"];
  }
  return "";
}

std::vector<double> ClusterJobTest::RegroupedTolerances(
    const std::vector<double>& reference) const {
  const json& training = spec_["training"];
  const int64_t tokens =
      training["batch_size"].get<int64_t>() * spec_["model"]["seq_len"].get<int64_t>();
  AdamWSettings adam;  // only the betas matter; the job's defaults unless the spec sets them
  adam.beta1 = training.value("beta1", 0.9);
  adam.beta2 = training.value("beta2", 0.95);
  return RegroupedTrainingTolerances(reference, tokens, adam);
}

void SharedClusterTest::SetUp() {
  ProcessCluster& shared = TheShared().cluster;
  // Jobs outlive the test that ran them (SharedJob, `pipetrain resume`): their corpus
  // must too.
  spec_["data"]["corpus"] = shared.dir().File("corpus.txt");
  if (!WantsCluster()) return;
  c_ = shared.Get();
  ASSERT_NE(c_, nullptr) << "the shared cluster did not start: " << shared.failure();
}

std::string SharedClusterTest::StateDir() { return TheShared().cluster.StateDir(); }

std::string SharedClusterTest::SharedFile(const std::string& name) {
  return TheShared().cluster.dir().File(name);
}

std::string SharedClusterTest::SharedJob(const std::string& key,
                                         const std::function<std::string()>& make) {
  std::map<std::string, std::string>& jobs = TheShared().jobs;
  if (auto it = jobs.find(key); it != jobs.end()) return it->second;
  const std::string id = make();
  if (!id.empty() && !::testing::Test::HasFailure()) jobs[key] = id;
  return id;
}

std::string SharedClusterTest::FinishedJob(const std::vector<std::string>& sets) {
  return SharedJob(spec_.dump() + " " + absl::StrJoin(sets, " "),
                   [&] { return SubmitAndFollow(*c_, sets); });
}

}  // namespace pipetrain::testing
