#include "bench/executor_bench.h"

#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/server_runner.h"
#include "common/status_macros.h"
#include "coordinator/planner/planner.h"
#include "stage_server/runtime/stage_runtime.h"
#include "stage_server/stage_service.h"

namespace pipetrain::bench {
namespace {

constexpr int kStages = 4, kMicroBatches = 8, kRows = 4;
constexpr double kDeviceFlops = 5e11;    // emulated device: slow enough that actions take ms
constexpr double kLinkBytesPerS = 1e9;   // loopback gRPC, roughly (see `pipetrain-bench link`)

model::TransformerConfig Model() { return {256, 128, 512, 8, 8}; }

}  // namespace

absl::StatusOr<BenchResult> RunExecutorBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 5;
  planner::PlanOptions po;
  po.model = Model();
  po.stages = kStages;
  po.micro_batches = kMicroBatches;
  po.schedule = planner::ScheduleKind::kOneFOneB;
  po.batch_size = kRows * kMicroBatches;
  po.device_flops = kDeviceFlops;
  po.link_bytes_per_s = kLinkBytesPerS;
  ASSIGN_OR_RETURN(planner::Plan plan, planner::MakePlan(po));

  // Four stage servers in this process: real services, links and executors.
  std::vector<std::unique_ptr<stage_server::StageRuntime>> runtimes;
  std::vector<std::unique_ptr<stage_server::StageService>> services;
  std::vector<common::RunningServer> servers;
  for (int s = 0; s < kStages; ++s) {
    stage_server::RuntimeOptions ro;
    ro.device.kind = stage_server::DeviceSpec::Kind::kEmulated;
    ro.device.emulated = absl::StrCat(kDeviceFlops);
    runtimes.push_back(std::make_unique<stage_server::StageRuntime>(ro));
    services.push_back(std::make_unique<stage_server::StageService>(runtimes.back().get()));
    grpc::ServerBuilder builder;
    builder.RegisterService(services.back().get());
    ASSIGN_OR_RETURN(common::RunningServer server,
                     common::StartServer(builder, {"127.0.0.1", 0}, absl::StrCat("bench-stage-", s)));
    servers.push_back(std::move(server));
  }
  for (int s = 0; s < kStages; ++s) {
    stage_server::JobConfig c;
    c.job_id = "bench";
    c.stage = s;
    c.num_stages = kStages;
    c.model = Model();
    c.chunks = plan.stages[s].chunks;
    c.micro_batch_size = kRows;
    c.peer_secret = std::string("s");  // not = "s": GCC 12 warns falsely (-Wrestrict)
    if (s > 0) c.upstream_address = servers[s - 1].address.ToString();
    if (s + 1 < kStages) c.downstream_address = servers[s + 1].address.ToString();
    RETURN_IF_ERROR(runtimes[s]->Configure(c).status());
  }
  std::mt19937 rng(5);
  auto tokens = [&](int) {
    common::Tensor t = *common::Tensor::Create(common::DType::kI32, {kRows, Model().seq_len});
    for (int32_t& x : t.data<int32_t>()) x = rng() % Model().vocab_size;
    return t;
  };
  std::vector<double> times;
  for (int step = 0; step <= reps; ++step) {  // step 0 warms up (links, pools)
    std::vector<absl::Status> status(kStages);
    std::vector<stage_server::StepRequest> requests(kStages);
    for (int s = 0; s < kStages; ++s) {
      requests[s].job_id = "bench";
      requests[s].step = step;
      requests[s].program = plan.programs[s];
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        if (s == 0) requests[s].inputs.tokens.push_back(tokens(mb));
        if (s == kStages - 1) requests[s].inputs.targets.push_back(tokens(mb));
      }
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int s = 0; s < kStages; ++s) {
      threads.emplace_back([&, s] { status[s] = runtimes[s]->RunStep(std::move(requests[s])).status(); });
    }
    for (auto& t : threads) t.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const absl::Status& s : status) RETURN_IF_ERROR(s);
    if (step > 0) times.push_back(seconds);
  }
  runtimes.clear();
  for (auto& s : servers) s.server->Shutdown(std::chrono::system_clock::now());

  const double measured = Median(times), predicted = plan.simulation.step_time_s;
  BenchResult result;
  result.Label("device", "emulated (no arithmetic; each action sleeps its modelled time)");
  result.Label("pipeline", "1F1B, 4 stages, 8 micro-batches of 4 x 128 tokens, d_model 512, 8 blocks");
  result.Add("repetitions", reps);
  result.Add("predicted_step_s", predicted);
  result.Add("measured_step_s", measured);
  result.Add("measured_over_predicted", measured / predicted);
  result.Add("overhead_per_micro_batch_ms",
             (measured - predicted) / kMicroBatches * 1e3);
  return result;
}

}  // namespace pipetrain::bench
