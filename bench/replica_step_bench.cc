#include "bench/replica_step_bench.h"

#include "absl/strings/str_cat.h"
#include "bench/cluster_jobs.h"
#include "bench/scratch_dir.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "tests/testing/corpus_text.h"

namespace pipetrain::bench {
namespace {

using json = nlohmann::json;

constexpr int kSteps = 30;
constexpr int kWarm = 5;              // left out of the medians
constexpr int kBatchPerReplica = 16;  // equal work per replica

// examples/tiny-gpt.json's model on one stage per replica: 0.86 M parameters, so each
// step all-reduces 3.4 MB of gradients.
json Spec(const ScratchDir& dir, int replicas) {
  return {{"name", absl::StrCat("replicas-bench-R", replicas)},
          {"model", {{"vocab_size", 256}, {"seq_len", 64}, {"d_model", 128}, {"n_heads", 4},
                     {"n_layers", 4}}},
          {"pipeline", {{"stages", 1}, {"replicas", replicas}, {"micro_batches", 4},
                        {"schedule", "1f1b"}}},
          {"training", {{"steps", kSteps}, {"batch_size", kBatchPerReplica * replicas},
                        {"seed", 1}, {"lr", 0.003}}},
          {"data", {{"corpus", dir.File("corpus.txt")}, {"validate_every_steps", 0}}},
          {"checkpoint", {{"every_steps", 0}, {"snapshot_every_steps", 0}}}};
}

}  // namespace

absl::Status AddReplicaStepFigures(const BenchOptions& options, BenchResult& out) {
  const int reps = options.repetitions > 0 ? options.repetitions : 3;
  ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::Make("replicas"));
  RETURN_IF_ERROR(common::WriteFileAtomically(dir.File("corpus.txt"), testing::EnglishLikeCorpus()));
  testing::LocalClusterOptions co;
  co.security = options.security;
  co.stage_args = {"--threads", "1"};
  ASSIGN_OR_RETURN(std::unique_ptr<testing::LocalCluster> cluster,
                   testing::LocalCluster::Start(dir.File("state"), 2, co));
  testing::LocalCluster& c = *cluster;
  std::vector<double> ratios, one, two, total_ms, exposed_ms, hidden;
  for (int rep = 0; rep < reps; ++rep) {
    for (int replicas : {1, 2}) {
      const std::string file = dir.File(absl::StrCat("R", replicas, ".json"));
      RETURN_IF_ERROR(common::WriteFileAtomically(file, Spec(dir, replicas).dump(2)));
      ASSIGN_OR_RETURN(std::string id, SubmitJob(c, file, /*wait=*/true));
      ASSIGN_OR_RETURN(json s, JobStatus(c, id));
      if (s.value("state", "") != "SUCCEEDED") {
        return absl::InternalError(absl::StrCat("allreduce: the R = ", replicas, " job ", id,
                                                " ended ", s.value("state", ""), ": ",
                                                s.value("reason", "")));
      }
      (replicas == 1 ? one : two).push_back(MedianStepSeconds(s, kWarm));
      if (replicas == 1) continue;
      // Where the time went, from the measured timeline of the job's latest steps.
      ASSIGN_OR_RETURN(testing::RunResult b, c.Cli({"timeline", id, "--breakdown", "--json"}));
      const json breakdown = json::parse(b.out, nullptr, false);
      if (b.exit_code != 0 || breakdown.is_discarded()) {
        return absl::InternalError(absl::StrCat("allreduce: pipetrain timeline ", id,
                                                " --breakdown: ", b.err));
      }
      for (const json& st : breakdown.value("stages", json::array())) {
        total_ms.push_back(1e3 * st.value("allreduce_total_s", 0.0));
        exposed_ms.push_back(1e3 * st.value("allreduce_s", 0.0));
        hidden.push_back(st.value("allreduce_hidden", 0.0));
      }
    }
    ratios.push_back(two.back() / one.back());
    common::LogInfo("bench", absl::StrCat("allreduce: R = 2 / R = 1 step time ", ratios.back()));
  }
  out.Label("replica_jobs", "examples/tiny-gpt.json's model, 1 cpu stage per replica "
                            "(--threads 1), 16 sequences per replica, M = 4, 1f1b");
  out.Add("step_s_R1", Median(one));
  out.Add("step_s_R2", Median(two));
  out.Add("step_time_R2_over_R1", Median(ratios));
  out.Add("allreduce_ms_per_step", Median(total_ms));
  out.Add("allreduce_waited_ms_per_step", Median(exposed_ms));
  out.Add("allreduce_hidden_fraction", Median(hidden));
  return absl::OkStatus();
}

}  // namespace pipetrain::bench
