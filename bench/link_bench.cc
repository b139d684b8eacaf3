#include "bench/link_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/server_runner.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "bench/link_processes.h"
#include "stage_server/link/exchange_service.h"
#include "stage_server/link/peer_link.h"

namespace pipetrain::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kTensorBytes = kLinkTensorBytes;
constexpr int kTensorsPerRep = kLinkTensorsPerStep;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Raw TCP on loopback: one connection, the sender writes kTensorsPerRep buffers, the
// receiver reads them into one warm buffer. Returns seconds until the last byte.
absl::StatusOr<double> RawTcpOnce(const std::vector<char>& src, std::vector<char>& dst) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return absl::InternalError("cannot listen on 127.0.0.1");
  }
  int out = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(out, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(out);
    close(listener);
    return absl::InternalError("cannot connect on 127.0.0.1");
  }
  int in = accept(listener, nullptr, nullptr);
  close(listener);
  const auto start = Clock::now();
  std::thread sender([&] {
    for (int i = 0; i < kTensorsPerRep; ++i) {
      size_t sent = 0;
      while (sent < src.size()) {
        ssize_t n = send(out, src.data() + sent, src.size() - sent, 0);
        if (n <= 0) return;
        sent += n;
      }
    }
  });
  size_t total = 0;
  const size_t want = src.size() * kTensorsPerRep;
  while (total < want) {
    ssize_t n = recv(in, dst.data() + (total % dst.size()),
                     std::min(dst.size() - total % dst.size(), want - total), 0);
    if (n <= 0) break;
    total += n;
  }
  const auto end = Clock::now();
  sender.join();
  close(in);
  close(out);
  if (total != want) return absl::InternalError("raw TCP transfer stopped early");
  return Seconds(start, end);
}


// One rep through an established link: kTensorsPerRep activations of one step, taken
// by the receiver as they arrive (as a stage's executor does). With `landing`, each
// received tensor is also copied into it (warm memory, as a stage copies an activation
// into its compute buffer) before it is dropped; without, the receiver drops each as it
// comes (it was in the network's buffers, or viewed in place in shared memory).
absl::StatusOr<double> LinkOnce(const std::string& job, stage_server::PeerLink& up,
                                stage_server::PeerLink& down,
                                std::shared_ptr<const common::Tensor> tensor, uint64_t step,
                                std::vector<std::byte>* landing) {
  up.BeginStep(step);
  down.BeginStep(step);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  const auto start = Clock::now();
  absl::Status received;
  std::thread receiver([&] {
    for (uint32_t mb = 0; mb < kTensorsPerRep && received.ok(); ++mb) {
      absl::StatusOr<common::PiecewiseTensor> t =
          down.Receive({job, step, mb, 0, common::TensorKind::kActivation}, deadline);
      if (!t.ok()) {
        received = t.status();
      } else if (landing) {
        t->CopyTo(*landing);
      }
    }
  });
  absl::Status sent;
  for (uint32_t mb = 0; mb < kTensorsPerRep && sent.ok(); ++mb) {
    sent = up.Send({job, step, mb, 0, common::TensorKind::kActivation}, tensor, deadline);
  }
  if (!sent.ok()) down.Close();  // the receiver stops waiting
  receiver.join();
  RETURN_IF_ERROR(sent);
  RETURN_IF_ERROR(received);
  return Seconds(start, Clock::now());
}

// One memcpy of kTensorsPerRep tensors' bytes into warm memory: the same-host path's
// ceiling.
double MemcpyOnce(const std::vector<char>& src, std::vector<char>& dst) {
  const auto start = Clock::now();
  for (int i = 0; i < kTensorsPerRep; ++i) std::memcpy(dst.data(), src.data(), src.size());
  return Seconds(start, Clock::now());
}

// The same bytes copied into a 64 MiB ring, four tensors' places in turn, as the
// same-host path's sender writes its region (which, unlike one 16 MiB destination,
// does not stay in this processor's last-level cache).
double MemcpyRingOnce(const std::vector<char>& src, std::vector<char>& ring) {
  const size_t places = ring.size() / src.size();
  const auto start = Clock::now();
  for (int i = 0; i < kTensorsPerRep; ++i) {
    std::memcpy(ring.data() + (i % places) * src.size(), src.data(), src.size());
  }
  return Seconds(start, Clock::now());
}

struct LinkPair {
  std::unique_ptr<stage_server::PeerLink> up, down;
};

// A link from stage 0 to stage 1 (this process's server) for job `job`.
absl::StatusOr<LinkPair> Connect(stage_server::LinkAcceptor& acceptor, const std::string& address,
                                 const std::string& job, const BenchOptions& options) {
  stage_server::PeerLinkOptions opts;
  opts.job_id = job;
  opts.local_stage = 1;
  opts.peer_stage = 0;
  opts.limits.max_tensor_bytes = kTensorBytes;
  acceptor.Expect(opts, "s");
  opts.local_stage = 0;
  opts.peer_stage = 1;
  opts.peer_address = address;
  auto channel = grpc::CreateCustomChannel(address, options.security.ChannelCredentials(),
                                           common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
  LinkPair pair;
  ASSIGN_OR_RETURN(pair.up, stage_server::ConnectPeerLink(channel, opts, "s",
                                                          absl::Now() + absl::Seconds(10)));
  ASSIGN_OR_RETURN(pair.down, acceptor.WaitForPeer(job, 0, absl::Now() + absl::Seconds(10)));
  return pair;
}

// --same-host: two stage processes (this one and a worker, link_processes.h) on the
// stream and on shared memory, against one memcpy, interleaved like the rest.
struct ProcessTimes {
  std::vector<double> memcpy_s, memcpy_ring, tcp, tcp_landed, shm, shm_landed;
  std::string path;
};

absl::StatusOr<ProcessTimes> TimeProcesses(int reps, const std::vector<char>& src,
                                           std::vector<char>& dst,
                                           std::shared_ptr<const common::Tensor> tensor) {
  const int steps = 1 + 2 * reps;  // a warm-up, then each repetition's two steps
  ASSIGN_OR_RETURN(LinkWorker tcp, LinkWorker::Start(false, steps));
  ASSIGN_OR_RETURN(LinkWorker shm, LinkWorker::Start(true, steps));
  ProcessTimes t;
  t.path = shm.path();
  std::vector<char> ring(4 * kTensorBytes, 0);
  RETURN_IF_ERROR(tcp.Step(0, tensor).status());
  RETURN_IF_ERROR(shm.Step(0, tensor).status());
  for (int r = 0; r < reps; ++r) {
    const uint64_t step = 1 + 2 * r;  // odd: the worker drops; even: it copies out
    t.memcpy_s.push_back(MemcpyOnce(src, dst));
    t.memcpy_ring.push_back(MemcpyRingOnce(src, ring));
    for (auto [worker, plain, landed] : {std::tuple{&tcp, &t.tcp, &t.tcp_landed},
                                         std::tuple{&shm, &t.shm, &t.shm_landed}}) {
      ASSIGN_OR_RETURN(double a, worker->Step(step, tensor));
      ASSIGN_OR_RETURN(double b, worker->Step(step + 1, tensor));
      plain->push_back(a);
      landed->push_back(b);
    }
  }
  RETURN_IF_ERROR(tcp.Finish());
  RETURN_IF_ERROR(shm.Finish());
  return t;
}

}  // namespace

absl::StatusOr<BenchResult> RunLinkBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 7;
  const std::vector<char> src = LinkBenchBytes();
  std::vector<char> dst(kTensorBytes);
  std::memset(dst.data(), 0, dst.size());
  auto tensor = std::make_shared<common::Tensor>();
  {
    ASSIGN_OR_RETURN(common::Tensor t, common::Tensor::Create(common::DType::kF32,
                                                              {4, 1024, 1024}));
    std::memcpy(t.bytes().data(), src.data(), kTensorBytes);
    *tensor = std::move(t);
  }

  stage_server::LinkAcceptor acceptor;
  stage_server::ExchangeService service(&acceptor);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  ASSIGN_OR_RETURN(common::RunningServer server,
                   common::StartServer(builder, {"127.0.0.1", 0}, "bench-stage",
                                       options.security));
  const std::string address = server.address.ToString();
  ASSIGN_OR_RETURN(LinkPair tcp, Connect(acceptor, address, "bench", options));
  stage_server::PeerLink& up = *tcp.up;
  stage_server::PeerLink& down = *tcp.down;

  std::vector<std::byte> landing(kTensorBytes, std::byte{0});
  // Warm-up: fills malloc's free lists and the connection's windows.
  RETURN_IF_ERROR(LinkOnce("bench", up, down, tensor, 0, &landing).status());
  RETURN_IF_ERROR(RawTcpOnce(src, dst).status());
  std::vector<double> t_tcp, t_link, t_landed;
  uint64_t step = 1;
  for (int r = 0; r < reps; ++r) {  // interleaved, so noise hits them all alike
    ASSIGN_OR_RETURN(double tcp, RawTcpOnce(src, dst));
    ASSIGN_OR_RETURN(double link, LinkOnce("bench", up, down, tensor, step, nullptr));
    ASSIGN_OR_RETURN(double landed, LinkOnce("bench", up, down, tensor, step + 1, &landing));
    t_tcp.push_back(tcp);
    t_link.push_back(link);
    t_landed.push_back(landed);
    step += 2;
  }
  if (std::memcmp(landing.data(), src.data(), kTensorBytes) != 0) {
    return absl::DataLossError("the bytes received through the peer link differ from those sent");
  }
  tcp.up->Close();
  tcp.down->Close();
  std::optional<ProcessTimes> processes;
  if (options.same_host) {
    ASSIGN_OR_RETURN(processes, TimeProcesses(reps, src, dst, tensor));
  }
  server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));

  const double gb = static_cast<double>(kTensorBytes) * kTensorsPerRep / 1e9;
  const double tcp_s = Median(t_tcp), link_s = Median(t_link), landed_s = Median(t_landed);
  BenchResult result;
  result.Label("transfer", "16 x 16 MiB activations per repetition, loopback, one process");
  result.Label("peer_link_transport", options.security.tls() ? "mutual TLS" : "plaintext");
  result.Add("repetitions", reps);
  result.Add("raw_tcp_gb_per_s", gb / tcp_s);
  result.Add("peer_link_gb_per_s", gb / link_s);
  result.Add("peer_link_over_raw_tcp", tcp_s / link_s);
  // Raw TCP reads straight into its destination; the link's receiver also copies each
  // tensor out of the network buffers into warm memory here (what a stage's compute
  // staging does with every received tensor).
  result.Add("peer_link_copied_out_gb_per_s", gb / landed_s);
  result.Add("peer_link_copied_out_over_raw_tcp", tcp_s / landed_s);
  if (processes) {
    // --same-host: between two stage processes, the stream (--same-host-transport off)
    // and shared memory, against one memcpy of the same bytes.
    ProcessTimes& p = *processes;
    const double memcpy_s = Median(p.memcpy_s), tcp2_s = Median(p.tcp), shm_s = Median(p.shm);
    const double tcp2_landed_s = Median(p.tcp_landed), shm_landed_s = Median(p.shm_landed);
    result.Label("same_host_transfer", "the same, between two stage processes");
    result.Label("same_host_path", p.path);
    result.Add("memcpy_gb_per_s", gb / memcpy_s);
    result.Add("memcpy_64mib_ring_gb_per_s", gb / Median(p.memcpy_ring));
    result.Add("processes_tcp_gb_per_s", gb / tcp2_s);
    result.Add("processes_tcp_copied_out_gb_per_s", gb / tcp2_landed_s);
    result.Add("same_host_gb_per_s", gb / shm_s);
    result.Add("same_host_over_memcpy", memcpy_s / shm_s);
    result.Add("same_host_over_memcpy_64mib_ring", Median(p.memcpy_ring) / shm_s);
    result.Add("same_host_over_tcp", tcp2_s / shm_s);
    result.Add("same_host_copied_out_gb_per_s", gb / shm_landed_s);
    result.Add("same_host_copied_out_over_memcpy", memcpy_s / shm_landed_s);
    result.Add("same_host_copied_out_over_tcp_copied_out", tcp2_landed_s / shm_landed_s);
  }
  return result;
}

}  // namespace pipetrain::bench
