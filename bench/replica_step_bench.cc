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
json Spec(const ScratchDir& dir, int replicas, bool split) {
  return {{"name", absl::StrCat("replicas-bench-R", replicas, split ? "-split" : "")},
          {"model", {{"vocab_size", 256}, {"seq_len", 64}, {"d_model", 128}, {"n_heads", 4},
                     {"n_layers", 4}}},
          {"pipeline", {{"stages", 1}, {"replicas", replicas}, {"micro_batches", 4},
                        {"schedule", "1f1b"}, {"shard_optimizer", split}}},
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
  // Per layout (R = 1, R = 2 each keeping the whole optimizer, R = 2 splitting it): the
  // median step of each repetition, and of the R = 2 jobs where the reduction's time went.
  struct Layout {
    int replicas;
    bool split;
    std::vector<double> step_s, total_ms, exposed_ms, hidden;
  };
  std::vector<Layout> layouts = {{1, false, {}, {}, {}, {}}, {2, false, {}, {}, {}, {}},
                                 {2, true, {}, {}, {}, {}}};
  std::vector<double> ratios, split_ratios;
  for (int rep = 0; rep < reps; ++rep) {
    for (Layout& layout : layouts) {
      const int replicas = layout.replicas;
      const std::string file =
          dir.File(absl::StrCat("R", replicas, layout.split ? "-split" : "", ".json"));
      RETURN_IF_ERROR(
          common::WriteFileAtomically(file, Spec(dir, replicas, layout.split).dump(2)));
      ASSIGN_OR_RETURN(std::string id, SubmitJob(c, file, /*wait=*/true));
      ASSIGN_OR_RETURN(json s, JobStatus(c, id));
      if (s.value("state", "") != "SUCCEEDED") {
        return absl::InternalError(absl::StrCat("allreduce: the R = ", replicas, " job ", id,
                                                " ended ", s.value("state", ""), ": ",
                                                s.value("reason", "")));
      }
      layout.step_s.push_back(MedianStepSeconds(s, kWarm));
      if (replicas == 1) continue;
      // Where the time went, from the measured timeline of the job's latest steps.
      ASSIGN_OR_RETURN(testing::RunResult b, c.Cli({"timeline", id, "--breakdown", "--json"}));
      const json breakdown = json::parse(b.out, nullptr, false);
      if (b.exit_code != 0 || breakdown.is_discarded()) {
        return absl::InternalError(absl::StrCat("allreduce: pipetrain timeline ", id,
                                                " --breakdown: ", b.err));
      }
      for (const json& st : breakdown.value("stages", json::array())) {
        layout.total_ms.push_back(1e3 * st.value("allreduce_total_s", 0.0));
        layout.exposed_ms.push_back(1e3 * st.value("allreduce_s", 0.0));
        layout.hidden.push_back(st.value("allreduce_hidden", 0.0));
      }
    }
    ratios.push_back(layouts[1].step_s.back() / layouts[0].step_s.back());
    split_ratios.push_back(layouts[2].step_s.back() / layouts[1].step_s.back());
    common::LogInfo("bench", absl::StrCat("allreduce: R = 2 / R = 1 step time ", ratios.back(),
                                          "; split / whole at R = 2 ", split_ratios.back()));
  }
  Layout& one = layouts[0];
  Layout& two = layouts[1];
  Layout& split = layouts[2];
  out.Label("replica_jobs", "examples/tiny-gpt.json's model, 1 cpu stage per replica "
                            "(--threads 1), 16 sequences per replica, M = 4, 1f1b; R = 2 with "
                            "pipeline.shard_optimizer false (step_s_R2, allreduce_*) and true "
                            "(*_split)");
  out.Add("step_s_R1", Median(one.step_s));
  out.Add("step_s_R2", Median(two.step_s));
  out.Add("step_time_R2_over_R1", Median(ratios));
  out.Add("allreduce_ms_per_step", Median(two.total_ms));
  out.Add("allreduce_waited_ms_per_step", Median(two.exposed_ms));
  out.Add("allreduce_hidden_fraction", Median(two.hidden));
  // The split: its reduce-scatter overlaps the backward as the all-reduce does; its
  // all-gather of the updated weights is inside the optimizer step, not in these.
  out.Add("step_s_R2_split", Median(split.step_s));
  out.Add("step_time_R2_split_over_R2", Median(split_ratios));
  out.Add("reduce_scatter_ms_per_step_split", Median(split.total_ms));
  out.Add("reduce_scatter_waited_ms_per_step_split", Median(split.exposed_ms));
  out.Add("reduce_scatter_hidden_fraction_split", Median(split.hidden));
  return absl::OkStatus();
}

}  // namespace pipetrain::bench
