#include "bench/link_processes.h"

#include <chrono>
#include <cstring>
#include <iostream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/rpc_security.h"
#include "common/server_runner.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "stage_server/link/exchange_service.h"

namespace pipetrain::bench {
namespace {

constexpr char kJob[] = "bench-processes";
constexpr char kSecret[] = "bench-secret";
using Clock = std::chrono::steady_clock;

common::FrameTag Activation(uint64_t step, uint32_t mb) {
  return {kJob, step, mb, 0, common::TensorKind::kActivation};
}
common::FrameTag Answer(uint64_t step) {
  return {kJob, step, 0, 0, common::TensorKind::kGradient};
}

stage_server::PeerLinkOptions LinkOptions(bool same_host, int local, int peer) {
  stage_server::PeerLinkOptions o;
  o.job_id = kJob;
  o.local_stage = local;
  o.peer_stage = peer;
  o.same_host = same_host;
  o.limits.max_tensor_bytes = kLinkTensorBytes;
  return o;
}

// The worker's steps: receive, land on even steps, check, answer.
absl::Status ServeSteps(stage_server::PeerLink& link, int steps) {
  const std::vector<char> want = LinkBenchBytes();
  std::vector<std::byte> landing(kLinkTensorBytes);
  ASSIGN_OR_RETURN(common::Tensor one, common::Tensor::Create(common::DType::kF32, {1}));
  auto answer = std::make_shared<const common::Tensor>(std::move(one));
  for (int step = 0; step < steps; ++step) {
    link.BeginStep(step);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (uint32_t mb = 0; mb < kLinkTensorsPerStep; ++mb) {
      ASSIGN_OR_RETURN(common::PiecewiseTensor t, link.Receive(Activation(step, mb), deadline));
      if (step % 2 != 0) continue;
      t.CopyTo(landing);
      if (mb == 0 && std::memcmp(landing.data(), want.data(), want.size()) != 0) {
        return absl::DataLossError(absl::StrCat("step ", step, ": the bytes received differ"));
      }
    }
    RETURN_IF_ERROR(link.Send(Answer(step), answer, deadline));
  }
  return link.Flush(absl::Now() + absl::Seconds(10));
}

absl::Status Work(bool same_host, int steps) {
  stage_server::LinkAcceptor acceptor;
  stage_server::ExchangeService service(&acceptor);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  acceptor.Expect(LinkOptions(same_host, 1, 0), kSecret);
  ASSIGN_OR_RETURN(common::RunningServer server,
                   common::StartServer(builder, {"127.0.0.1", 0}, "bench-link-worker",
                                       common::RpcSecurity()));
  std::cout << "link-worker-address " << server.address.ToString() << std::endl;
  ASSIGN_OR_RETURN(std::unique_ptr<stage_server::PeerLink> link,
                   acceptor.WaitForPeer(kJob, 0, absl::Now() + absl::Seconds(30)));
  absl::Status served = ServeSteps(*link, steps);
  // The sender closes first once it has every answer.
  link->Receive(Answer(steps), absl::Now() + absl::Seconds(10)).IgnoreError();
  link->Close();
  server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return served;
}

}  // namespace

std::vector<char> LinkBenchBytes() {
  std::vector<char> bytes(kLinkTensorBytes);
  std::mt19937 rng(3);
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

int RunLinkWorker(int argc, char** argv) {
  int steps = 0;
  if (argc != 4 || (std::string(argv[2]) != "auto" && std::string(argv[2]) != "off") ||
      !absl::SimpleAtoi(argv[3], &steps) || steps < 1) {
    std::cerr << "usage: pipetrain-bench --link-worker auto|off STEPS\n";
    return 2;
  }
  absl::Status s = Work(std::string(argv[2]) == "auto", steps);
  if (!s.ok()) {
    std::cerr << "link worker: " << s << "\n";
    return 1;
  }
  return 0;
}

absl::StatusOr<LinkWorker> LinkWorker::Start(bool same_host, int steps) {
  LinkWorker w;
  ASSIGN_OR_RETURN(testing::Subprocess process,
                   testing::Subprocess::Start({"/proc/self/exe", "--link-worker",
                                               same_host ? "auto" : "off", std::to_string(steps)}));
  w.process_ = std::make_unique<testing::Subprocess>(std::move(process));
  absl::StatusOr<std::string> line = w.process_->WaitForLine("link-worker-address ", std::chrono::seconds(30));
  if (!line.ok()) {
    return absl::UnavailableError(absl::StrCat("link worker did not start: ", line.status().message(),
                                               ": ", w.process_->stderr_text()));
  }
  const std::string address = line->substr(line->find("link-worker-address ") + 20);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                           common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
  stage_server::PeerLinkOptions o = LinkOptions(same_host, 0, 1);
  o.peer_address = address;
  ASSIGN_OR_RETURN(w.link_, stage_server::ConnectPeerLink(channel, o, kSecret,
                                                          absl::Now() + absl::Seconds(10)));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (same_host && w.path().find("not answered") != std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (same_host && w.path().find("shared memory") != 0) {
    return absl::UnavailableError(
        absl::StrCat("link bench: the same-host path was not taken: ", w.path()));
  }
  return w;
}

absl::StatusOr<double> LinkWorker::Step(uint64_t step, std::shared_ptr<const common::Tensor> tensor) {
  link_->BeginStep(step);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  const auto start = Clock::now();
  for (uint32_t mb = 0; mb < kLinkTensorsPerStep; ++mb) {
    RETURN_IF_ERROR(link_->Send(Activation(step, mb), tensor, deadline));
  }
  absl::StatusOr<common::PiecewiseTensor> answer = link_->Receive(Answer(step), deadline);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!answer.ok()) {
    return absl::UnavailableError(absl::StrCat("link worker, step ", step, ": ",
                                               answer.status().message(), ": ",
                                               process_->stderr_text()));
  }
  return seconds;
}

absl::Status LinkWorker::Finish() {
  link_->Close();
  absl::StatusOr<int> code = process_->Wait(std::chrono::seconds(30));
  if (!code.ok() || *code != 0) {
    return absl::InternalError(absl::StrCat("link worker failed: ", process_->stderr_text()));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::bench
