// End to end, a job's TensorBoard event files: a real cluster runs a small job (2
// stages, validation every 2 steps, a learning-rate warm-up, clipping), and the files
// under STATE_DIR/tensorboard/JOB/, read with the independent reader (every CRC
// checked), hold every step's scalars as `pipetrain status --json` reports them;
// --tensorboard-dir moves them; a job the next coordinator continues adds a file.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/tfrecord_reader.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::pipetrain::testing::ReadEvent;
using ::pipetrain::testing::ReadEventFile;
using ::testing::HasSubstr;
using json = nlohmann::json;

// The event files in `dir`, in name order.
std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A number of proto JSON: a double, or an int64/uint64 written as a string; 0 when
// absent (proto JSON leaves default values out).
double Number(const json& j, const std::string& key) {
  if (!j.contains(key)) return 0;
  const json& v = j[key];
  if (v.is_string()) {
    double d = 0;
    EXPECT_TRUE(absl::SimpleAtod(v.get<std::string>(), &d)) << key << ": " << v;
    return d;
  }
  return v.get<double>();
}

// simple_value is a float: the record's double rounded once.
void ExpectScalar(const ReadEvent& e, const std::string& tag, double want) {
  auto it = e.scalars.find(tag);
  ASSERT_NE(it, e.scalars.end()) << "step " << e.step << " has no " << tag;
  EXPECT_EQ(it->second, static_cast<float>(want)) << "step " << e.step << " " << tag;
}

class TensorBoardJobTest : public testing::ClusterJobTest {
 protected:
  // The job of 4 steps on 2 stages that every test here runs.
  std::string RunJob(LocalCluster& c) {
    spec_["training"]["warmup_steps"] = 3;      // lr changes over the steps
    spec_["training"]["grad_clip_norm"] = 0.5;  // the two-phase step: norm before clipping
    return SubmitAndFollow(c, {"pipeline.stages=2"});
  }

  // Every scalar of the job's `files` event files against its history in `status
  // --json`: each file starts with the version record, and a step written again by a
  // later run (a restart repeats the steps after its snapshot) counts as that run's.
  void ExpectFilesMatchStatus(LocalCluster& c, const std::string& id, const std::string& dir,
                              size_t files_wanted, int64_t steps) {
    const std::vector<std::string> files = EventFiles(dir);
    ASSERT_EQ(files.size(), files_wanted) << "in " << dir;
    std::map<int64_t, ReadEvent> latest;
    for (const std::string& file : files) {
      absl::StatusOr<std::vector<ReadEvent>> events = ReadEventFile(file);
      ASSERT_TRUE(events.ok()) << events.status();
      ASSERT_GE(events->size(), 2u) << file << ": a run's file has at least one step";
      EXPECT_EQ((*events)[0].file_version, "brain.Event:2") << file;
      for (size_t i = 1; i < events->size(); ++i) latest[(*events)[i].step] = (*events)[i];
    }
    const json status = Status(c, id);
    const json& history = status["history"];
    ASSERT_EQ(history.size(), static_cast<size_t>(steps)) << status.dump();
    ASSERT_EQ(latest.size(), history.size());
    int with_val = 0;
    for (size_t i = 0; i < history.size(); ++i) {
      const json& h = history[i];
      SCOPED_TRACE(absl::StrCat("history[", i, "] ", h.dump()));
      const auto step = static_cast<int64_t>(Number(h, "step"));
      ASSERT_EQ(latest.count(step), 1u);
      const ReadEvent& e = latest[step];
      EXPECT_GT(e.wall_time, 1.6e9);  // seconds since 1970, as TensorBoard expects
      ExpectScalar(e, "train/loss", Number(h, "loss"));
      ExpectScalar(e, "perf/tokens_per_s", Number(h, "tokens_per_s"));
      ExpectScalar(e, "pipeline/bubble_measured", Number(h, "bubble_measured"));
      ExpectScalar(e, "pipeline/bubble_predicted", Number(h, "bubble_predicted"));
      ExpectScalar(e, "train/lr", Number(h, "lr"));
      ExpectScalar(e, "train/grad_norm", Number(h, "grad_norm"));
      // The records are real: a warm-up rate below the job's, a norm of real gradients.
      EXPECT_GT(Number(h, "grad_norm"), 0);
      EXPECT_NEAR(Number(h, "lr"), 0.01 * std::min(1.0, static_cast<double>(step) / 3.0), 1e-6);
      size_t expected = 6;  // loss, tokens/s, the two bubbles, lr, grad norm
      if (h.value("has_val_loss", false)) {
        ++with_val;
        ++expected;
        ExpectScalar(e, "val/loss", Number(h, "val_loss"));
      } else {
        EXPECT_EQ(e.scalars.count("val/loss"), 0u);
      }
      ASSERT_EQ(h["stages"].size(), 2u);
      for (const json& st : h["stages"]) {
        ++expected;
        ExpectScalar(e, absl::StrCat("stage_", st.value("stage", 0), "/peak_memory_bytes"),
                     Number(st, "peak_memory_bytes"));
      }
      EXPECT_EQ(e.scalars.size(), expected);
    }
    const int validate_every = spec_["data"]["validate_every_steps"].get<int>();
    EXPECT_EQ(with_val, steps / validate_every);
  }
};

TEST_F(TensorBoardJobTest, EveryStepsScalarsAreInTheStateDirAsStatusReportsThem) {
  const std::string state = dir_.File("state");
  auto cluster = LocalCluster::Start(state, 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string id = RunJob(**cluster);
  ASSERT_FALSE(id.empty());
  ExpectFilesMatchStatus(**cluster, id, absl::StrCat(state, "/tensorboard/", id), 1, 4);
}

TEST_F(TensorBoardJobTest, TensorBoardDirPutsTheJobFoldersThere) {
  const std::string state = dir_.File("state");
  const std::string elsewhere = dir_.File("runs/tb");
  LocalClusterOptions options;
  options.coordinator_args = {"--tensorboard-dir", elsewhere};
  auto cluster = LocalCluster::Start(state, 2, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string id = RunJob(**cluster);
  ASSERT_FALSE(id.empty());
  ExpectFilesMatchStatus(**cluster, id, absl::StrCat(elsewhere, "/", id), 1, 4);
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(state, "/tensorboard")))
      << "moved, not copied";
}

// A coordinator killed mid-job and started again continues the job (from its stages'
// snapshots) in a second file in the same folder; the two together hold every step.
TEST_F(TensorBoardJobTest, AJobContinuedByTheNextCoordinatorWritesASecondFile) {
  const std::string state = dir_.File("state");
  auto cluster = LocalCluster::Start(state, 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  constexpr int kSteps = 300;  // about 3 s: long enough to kill the coordinator mid-run
  spec_["training"]["steps"] = kSteps;
  spec_["training"]["warmup_steps"] = 3;
  spec_["training"]["grad_clip_norm"] = 0.5;
  spec_["data"]["validate_every_steps"] = 50;
  spec_["checkpoint"]["every_steps"] = 0;
  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  ASSERT_FALSE(id.empty());
  WaitFor(c, id, [](const json& j) { return Number(j, "steps_done") >= 5; });
  ASSERT_TRUE(c.KillCoordinator(SIGKILL).ok());
  ASSERT_TRUE(c.StartCoordinatorAgain(0).ok());
  const json done = WaitFor(c, id, [](const json& j) {
    const std::string state = j.value("state", "");
    return state == "SUCCEEDED" || state == "FAILED" || state == "CANCELLED";
  });
  ASSERT_EQ(done.value("state", ""), "SUCCEEDED") << done.dump();
  ASSERT_EQ(done.value("recoveries", json::array()).size(), 1u) << done.dump();
  ExpectFilesMatchStatus(c, id, absl::StrCat(state, "/tensorboard/", id), 2, kSteps);
}

}  // namespace
}  // namespace pipetrain
