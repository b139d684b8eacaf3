// What each stage of a job is told before its first step, built from the job's plan
// alone: a pure function, used by the job runner and by the tests that drive stage
// servers directly, so the two cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/planner/planner.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain::coordinator {

// What a Configure request needs besides the plan.
struct StageWiring {
  std::string job_id;
  std::vector<std::string> addresses;  // every stage's address, in stage order
  std::string peer_secret;             // admits the job's stages to each other's links
  int recv_deadline_ms = 30000;        // a stage's longest wait for a peer's tensor
};

// AdamW and clipping as the job spec sets them (WithDefaults has filled the optional
// fields); eps is fixed at 1e-8, as PyTorch's default.
pipetrain::v1::OptimizerConfig OptimizerFromSpec(const pipetrain::v1::TrainingSpec& training);

// Stage `stage`'s request: its layer ranges (one per chunk), the model, seed and
// optimizer, its neighbours on the ring of stages (none with one stage), one yes/no per
// chunk for recomputation (as the plan resolved it) and the micro-batch size; with
// snapshots, the ring successor as snapshot peer and the plan's snapshot bytes as the
// stage's reserve.
pipetrain::v1::ConfigureRequest BuildConfigureRequest(
    const planner::Plan& plan, int stage, uint64_t seed,
    const pipetrain::v1::OptimizerConfig& optimizer, const StageWiring& wiring);

}  // namespace pipetrain::coordinator
