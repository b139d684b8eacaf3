// Replicas that split the optimizer (pipeline.shard_optimizer) at the
// executor: each copy averages only its piece of every layer's gradients, steps only that
// piece, and gathers the others' updated pieces after the step. Against replicas that
// all-reduce, over the same in-process collective summing in replica order, the split
// must change nothing: the same losses, weights and (put together) moments, bit for bit.
#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/optimizer_split.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/exec/executor.h"
#include "tests/testing/in_process_copies.h"
#include "tests/testing/reference_training.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::InProcessCopies;
using ::testing::HasSubstr;

struct Copy {
  std::unique_ptr<compute::CpuBackend> backend = *compute::CpuBackend::Create(1);
  std::unique_ptr<Executor> executor;
  compute::ModelChunk* layers = nullptr;
};

struct SplitCase {
  int copies = 2;
  bool tied = false;
  bool bf16 = false;
  float clip = 0;
};
void PrintTo(const SplitCase& c, std::ostream* os) {
  *os << c.copies << " copies" << (c.tied ? ", tied" : "") << (c.bf16 ? ", bf16" : "");
}

// Replica `rank` of `setup.copies` on the whole tiny model, one micro-batch of 2 rows per
// step; split: its chunk keeps its pieces' moments and the executor gathers.
Copy MakeCopy(const SplitCase& setup, int rank, bool split, InProcessCopies& collective) {
  Copy c;
  const common::DType precision = setup.bf16 ? common::DType::kBF16 : common::DType::kF32;
  EXPECT_THAT(c.backend->SetProductOperands(precision), IsOk());
  const model::TransformerConfig config = ::pipetrain::testing::TinyModel(setup.tied);
  compute::ChunkOptions options{.boundary = precision};
  if (split) options.split = {.copies = setup.copies, .copy = rank};
  auto layers = *compute::ModelChunk::Create(config, 0, config.num_pipeline_layers(),
                                             c.backend.get(), options);
  EXPECT_THAT(layers->Initialize(::pipetrain::testing::kSeed), IsOk());
  c.layers = layers.get();
  auto pool = std::make_shared<common::BufferPool>();
  std::vector<std::unique_ptr<ChunkCompute>> chunks;
  chunks.push_back(*BackendChunk::Create(std::move(layers), 2, pool));
  ExecutorConfig ec;
  ec.job_id = "job-split";
  ec.recv_timeout = absl::Seconds(30);
  ec.optimizer = ::pipetrain::testing::TestAdam();
  ec.optimizer.grad_clip_norm = setup.clip;
  ec.tie_embeddings = setup.tied;
  ec.average_gradients = split ? collective.SplitAverageFor(rank) : collective.AllReduceFor(rank);
  if (split) ec.gather_weights = collective.GatherFor(rank);
  c.executor = std::make_unique<Executor>(ec, std::move(chunks), nullptr, nullptr, pool);
  return c;
}

schedule::StageProgram OneMicroBatch() {
  schedule::StageProgram p;
  p.num_micro_batches = 1;
  p.actions = *schedule::ParseActions("F0 B0 OPT");
  return p;
}

// One step of every copy at once, replica r on rows [2r, 2r + 2) of the step's batch;
// `norm` gives a deferred step's global norm from the copies' results (none: one phase).
std::vector<StepResult> StepAll(std::vector<Copy>& copies, uint64_t step,
                                std::function<double(const std::vector<StepResult>&)> norm = {}) {
  const model::TokenBatch batch = ::pipetrain::testing::RandomBatch(static_cast<int>(step));
  std::vector<absl::StatusOr<StepResult>> got(copies.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < copies.size(); ++r) {
    threads.emplace_back([&, r] {
      StepInputs in;
      in.step = step;
      in.tokens.push_back(::pipetrain::testing::Rows(batch.inputs, static_cast<int>(r), 2));
      in.targets.push_back(::pipetrain::testing::Rows(batch.targets, static_cast<int>(r), 2));
      in.defer_optimizer = static_cast<bool>(norm);
      got[r] = copies[r].executor->RunStep(OneMicroBatch(), std::move(in));
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<StepResult> out;
  for (auto& g : got) {
    EXPECT_THAT(g.status(), IsOk());
    out.push_back(g.ok() ? *std::move(g) : StepResult{});
  }
  if (!norm || out.size() != copies.size()) return out;
  const double global = norm(out);
  threads.clear();
  std::vector<absl::Status> applied(copies.size());
  for (size_t r = 0; r < copies.size(); ++r) {
    threads.emplace_back([&, r] {
      applied[r] = copies[r].executor->ApplyOptimizer(step, global, std::nullopt).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : applied) EXPECT_THAT(s, IsOk());
  return out;
}

std::vector<std::vector<float>> Weights(compute::ModelChunk& layers) {
  std::vector<std::vector<float>> out;
  for (const model::ParamSpec& p : layers.Params()) out.push_back(*layers.GetParam(p.name));
  return out;
}

// The copies' moments put together: each gives its piece and zeros elsewhere.
std::vector<float> SummedMoment(std::vector<Copy>& copies, const std::string& name, bool second) {
  std::vector<float> sum;
  for (Copy& c : copies) {
    const std::vector<float> m = *c.layers->GetOptimizerMoment(name, second);
    if (sum.empty()) sum.assign(m.size(), 0.0f);
    for (size_t i = 0; i < m.size(); ++i) sum[i] += m[i];
  }
  return sum;
}

void ExpectSameState(std::vector<Copy>& split, std::vector<Copy>& whole) {
  const auto want = Weights(*whole[0].layers);
  for (size_t r = 0; r < split.size(); ++r) {
    EXPECT_TRUE(Weights(*split[r].layers) == want) << "copy " << r << "'s weights";
    EXPECT_TRUE(Weights(*whole[r].layers) == want) << "replica " << r << "'s weights";
  }
  for (const model::ParamSpec& p : whole[0].layers->Params()) {
    for (bool second : {false, true}) {
      EXPECT_EQ(SummedMoment(split, p.name, second),
                *whole[0].layers->GetOptimizerMoment(p.name, second))
          << p.name << (second ? " second" : " first") << " moment";
    }
  }
}

// `setup.copies` replicas that all-reduce (`whole`) and as many copies that split
// (`split`), each group over its own collective, all from the same weights.
struct Groups {
  explicit Groups(const SplitCase& setup) : reduce(setup.copies), split_collective(setup.copies) {
    for (int r = 0; r < setup.copies; ++r) {
      whole.push_back(MakeCopy(setup, r, false, reduce));
      split.push_back(MakeCopy(setup, r, true, split_collective));
    }
  }
  InProcessCopies reduce, split_collective;
  std::vector<Copy> whole, split;
};

class ExecutorSplitTest : public ::testing::TestWithParam<SplitCase> {};

INSTANTIATE_TEST_SUITE_P(
    Copies, ExecutorSplitTest,
    ::testing::Values(SplitCase{.copies = 2}, SplitCase{.copies = 3},
                      SplitCase{.copies = 2, .tied = true, .bf16 = true},
                      SplitCase{.copies = 3, .tied = true}),
    [](const auto& info) {
      return absl::StrCat("R", info.param.copies, info.param.tied ? "_tied" : "",
                          info.param.bf16 ? "_bf16" : "");
    });

TEST_P(ExecutorSplitTest, SplittingCopiesTrainAsAllReducingReplicas) {
  const SplitCase setup = GetParam();
  Groups groups(setup);
  std::vector<Copy>& whole = groups.whole;
  std::vector<Copy>& split = groups.split;
  for (uint64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::vector<StepResult> want = StepAll(whole, step);
    const std::vector<StepResult> got = StepAll(split, step);
    ASSERT_EQ(got.size(), want.size());
    double pieces = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      // The forward reads the gathered weights (bf16: their products' copy, remade).
      EXPECT_EQ(got[r].losses, want[r].losses) << "replica " << r;
      pieces += got[r].grad_norm_sq;
    }
    // The copies' shares make the whole gradient's (summed in another grouping).
    EXPECT_NEAR(pieces, want[0].grad_norm_sq, 1e-12 * want[0].grad_norm_sq);
    ExpectSameState(split, whole);
  }
}

// Clipping needs the norm over every copy's pieces: with it (two phases, as the
// coordinator runs them) the copies clip exactly as the replicas do; without it a copy
// refuses to step, naming why.
TEST(ExecutorSplitClipTest, CopiesClipByTheNormOverAllTheirPieces) {
  const SplitCase setup{.copies = 3, .clip = 0.05f};
  Groups groups(setup);
  std::vector<Copy>& whole = groups.whole;
  std::vector<Copy>& split = groups.split;
  for (uint64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    double whole_norm = 0;
    StepAll(whole, step, [&](const std::vector<StepResult>& r) {
      whole_norm = std::sqrt(r[0].grad_norm_sq);
      return whole_norm;
    });
    double pieces = 0;
    StepAll(split, step, [&](const std::vector<StepResult>& r) {
      for (const StepResult& one : r) pieces += one.grad_norm_sq;
      // Both clip by the same number, so their updates must agree bit for bit.
      return whole_norm;
    });
    EXPECT_NEAR(std::sqrt(pieces), whole_norm, 1e-12 * whole_norm);
    EXPECT_GT(whole_norm, setup.clip) << "the step must clip for this to test anything";
    ExpectSameState(split, whole);
  }
  // One phase: a copy has only its pieces' norm.
  std::vector<absl::StatusOr<StepResult>> got(setup.copies);
  std::vector<std::thread> threads;
  const model::TokenBatch batch = ::pipetrain::testing::RandomBatch(3);
  for (int r = 0; r < setup.copies; ++r) {
    threads.emplace_back([&, r] {
      StepInputs in;
      in.step = 3;
      in.tokens.push_back(::pipetrain::testing::Rows(batch.inputs, r, 2));
      in.targets.push_back(::pipetrain::testing::Rows(batch.targets, r, 2));
      got[r] = split[r].executor->RunStep(OneMicroBatch(), std::move(in));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(got[0].status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("global")));
}

}  // namespace
}  // namespace pipetrain::stage_server
