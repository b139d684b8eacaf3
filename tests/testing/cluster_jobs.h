// Fixtures for the coordinator's end-to-end tests: the small job they all run, driven
// through the `pipetrain` CLI (submit followed or detached, `status --json` parsed, polls
// until a state), and one cluster a test binary shares among the tests that leave it as
// they found it, so that each of them needs no cluster start of its own.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/local_cluster.h"
#include "tests/testing/status_json.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::testing {

// The losses of a `status --json` answer, step by step.
std::vector<double> Losses(const nlohmann::json& status);

// The job id in the "submitted job-000001 (name)" line of `out`; "" if there is none.
std::string SubmittedId(const std::string& out);

// A cluster that a test binary starts once, when a test first asks for it, in a folder
// that lives as long as the process, and stops when the process ends (hold it in a
// function-local static). A start that failed is not tried again: every later test is
// told why. For tests that leave the cluster as they found it.
class ProcessCluster {
 public:
  // What to put in the cluster's folder before it starts (files its jobs read), and the
  // options to start it with; run once, by the constructor.
  using Prepare = std::function<LocalClusterOptions(const TempDir& dir)>;

  explicit ProcessCluster(int stages, const Prepare& prepare = nullptr);

  // The cluster, started by the first call; nullptr if it could not start.
  LocalCluster* Get();
  // Why it could not start (OK while it runs or before the first Get).
  const absl::Status& failure() const { return failure_; }
  // Its folder: the coordinator's state is in StateDir(), the rest is the tests'.
  const TempDir& dir() const { return dir_; }
  std::string StateDir() const { return dir_.File("state"); }

 private:
  TempDir dir_;  // declared first, so removed last: after the cluster whose state is in it
  int stages_;
  LocalClusterOptions options_;
  std::unique_ptr<LocalCluster> cluster_;
  absl::Status failure_;
};

// A per-test folder with the corpus, the small job spec reading it, and the CLI verbs
// the tests use, each checking (non-fatally) that the verb itself worked.
class ClusterJobTest : public ::testing::Test {
 protected:
  using json = nlohmann::json;

  ClusterJobTest();

  std::string WriteSpec(const json& spec, const std::string& name = "job.json");

  // `pipetrain submit` of spec_ with `--set` overrides, following the job to its end;
  // the job id.
  std::string SubmitAndFollow(LocalCluster& c, const std::vector<std::string>& sets,
                              int expect_exit = 0);
  // The same with --no-wait: returns as soon as the job is queued.
  std::string SubmitNoWait(LocalCluster& c, const std::vector<std::string>& sets);

  // `pipetrain status ID --json`, parsed.
  json Status(LocalCluster& c, const std::string& id);
  // Polls Status until `pred` holds (deadline 60 s), adding a failure if it never does.
  json WaitFor(LocalCluster& c, const std::string& id,
               const std::function<bool(const json&)>& pred);

  // The address of a registered stage, from `pipetrain cluster --json` ("" if absent).
  std::string StageAddress(LocalCluster& c, const std::string& stage_id);

  // Per step, how far another number of data-parallel replicas may take spec_'s job
  // from the losses `reference` (RegroupedTrainingTolerances: each gradient is a sum over
  // the batch's tokens, grouped by replica; AdamW with the spec's betas).
  std::vector<double> RegroupedTolerances(const std::vector<double>& reference) const;

  TempDir dir_;
  // 4 steps of a 2-layer model, 4 micro-batches, validation and a checkpoint every 2
  // steps, on 1 stage unless a test sets more.
  json spec_;
};

// Tests on one cluster of 4 stages that the whole test binary shares (a ProcessCluster):
// started by the first such test, stopped when the process ends. A test on it may submit
// what it likes but must leave every stage idle and assume nothing of the jobs others
// ran; jobs that several tests read are run once, by whichever test asks first
// (SharedJob).
class SharedClusterTest : public ClusterJobTest {
 public:
  static constexpr int kStages = 4;

 protected:
  void SetUp() override;
  // False for a test (or parameter) that needs no cluster, so none is started for it.
  virtual bool WantsCluster() const { return true; }

  // The shared cluster's state folder (checkpoints live under it).
  static std::string StateDir();
  // A file in the folder that lives as long as the cluster, for data that jobs read
  // after the test that wrote it (a resumed job reads its data again).
  static std::string SharedFile(const std::string& name);

  // The job that `make` submits and brings to its end, made once per `key` in this
  // process; "" (with `make`'s failures) if it could not be made, and then the next
  // test to ask tries again.
  std::string SharedJob(const std::string& key, const std::function<std::string()>& make);
  // A job of spec_ with `sets`, followed to its end, shared by spec and overrides.
  std::string FinishedJob(const std::vector<std::string>& sets);

  LocalCluster* c_ = nullptr;  // the shared cluster, once SetUp has started it
};

}  // namespace pipetrain::testing
