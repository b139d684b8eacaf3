#include "bench/allreduce_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/replica_step_bench.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "coordinator/rendezvous/rendezvous_service.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "stage_server/collective/coordinator_store.h"
#include "stage_server/collective/gradient_reducer.h"
#include "tests/testing/subprocess.h"

namespace pipetrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes of one element of the gradients the replicas reduce (f32).
int64_t GradientElementBytes() {
  return static_cast<int64_t>(common::DTypeSize(common::DType::kF32));
}
constexpr char kJob[] = "bench-allreduce";
constexpr absl::Duration kDeadline = absl::Seconds(120);

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Bytes each process sends (and receives) in a ring all-reduce of `bytes`.
int64_t RingBytes(int64_t bytes, int size) { return 2 * (size - 1) * bytes / size; }

bool WriteAll(int fd, const char* p, int64_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, static_cast<size_t>(std::min<int64_t>(n, 1 << 22)), MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= w;
  }
  return true;
}

bool ReadAll(int fd, char* p, int64_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, static_cast<size_t>(std::min<int64_t>(n, 1 << 22)), 0);
    if (r <= 0) return false;
    p += r;
    n -= r;
  }
  return true;
}

// The raw TCP ring: a connection to the right neighbour and one from the left, the
// ports published through the same rendezvous store.
absl::StatusOr<std::pair<int, int>> ConnectRawRing(stage_server::collective::CoordinatorStore& store,
                                                   int rank, int size) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return absl::UnavailableError("raw TCP: cannot listen on 127.0.0.1");
  }
  if (absl::Status s = store.Set(absl::StrCat("raw/", rank), std::to_string(ntohs(addr.sin_port)));
      !s.ok()) {
    close(listener);
    return s;
  }
  absl::StatusOr<std::string> port = store.Get(absl::StrCat("raw/", (rank + 1) % size), kDeadline);
  int p = 0;
  if (!port.ok() || !absl::SimpleAtoi(*port, &p)) {
    close(listener);
    return port.ok() ? absl::InternalError("raw TCP: bad port") : port.status();
  }
  int right = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(p));
  if (connect(right, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(listener);
    close(right);
    return absl::UnavailableError(absl::StrCat("raw TCP: cannot connect to port ", p));
  }
  int left = accept(listener, nullptr, nullptr);
  close(listener);
  if (left < 0) {
    close(right);
    return absl::UnavailableError("raw TCP: accept failed");
  }
  return std::make_pair(left, right);
}

absl::Status Worker(const std::string& address, const std::string& prefix, int rank, int size,
                    int64_t floats, int reps) {
  stage_server::collective::ReducerOptions o;
  o.job_id = kJob;
  o.replica = rank;
  o.replicas = size;
  o.rendezvous_prefix = prefix;
  o.coordinator_address = address;
  o.connect_deadline = kDeadline;
  absl::StatusOr<std::unique_ptr<stage_server::collective::GradientReducer>> reducer =
      stage_server::collective::CreateGlooReducer(o);
  if (!reducer.ok()) return reducer.status();
  std::vector<float> data(static_cast<size_t>(floats), 1.0f / static_cast<float>(size));
  float token = 0;
  auto barrier = [&] { return (*reducer)->AllReduceSum(std::span<float>(&token, 1), kDeadline); };
  std::vector<double> gloo_times, raw_times;
  // One untimed call first: gloo allocates its segments and the kernel grows its buffers.
  for (int i = 0; i <= reps; ++i) {
    if (absl::Status s = barrier(); !s.ok()) return s;
    const Clock::time_point t = Clock::now();
    if (absl::Status s = (*reducer)->AllReduceSum(data, kDeadline); !s.ok()) return s;
    if (i > 0) gloo_times.push_back(Since(t));
  }
  // The same bytes as the two halves copies that split the optimizer run: a
  // reduce-scatter, then an all-gather (gloo's alltoallv and allgatherv).
  std::vector<double> split_times;
  for (int i = 0; i <= reps; ++i) {
    if (absl::Status s = barrier(); !s.ok()) return s;
    const Clock::time_point t = Clock::now();
    if (absl::Status s = (*reducer)->ReduceScatterSum(data, kDeadline); !s.ok()) return s;
    if (absl::Status s = (*reducer)->AllGather(data, kDeadline); !s.ok()) return s;
    if (i > 0) split_times.push_back(Since(t));
  }
  stage_server::collective::CoordinatorStore store(address, common::RpcSecurity(), kJob,
                                                   prefix + "/", kDeadline);
  absl::StatusOr<std::pair<int, int>> ring = ConnectRawRing(store, rank, size);
  if (!ring.ok()) return ring.status();
  const auto [left, right] = *ring;
  const int64_t moved = RingBytes(floats * GradientElementBytes(), size);
  std::vector<char> out(static_cast<size_t>(moved), 1), in(static_cast<size_t>(moved));
  absl::Status failed;
  for (int i = 0; i <= reps && failed.ok(); ++i) {
    if (absl::Status s = barrier(); !s.ok()) return s;
    const Clock::time_point t = Clock::now();
    bool sent = false;
    std::thread sender([&] { sent = WriteAll(right, out.data(), moved); });
    const bool got = ReadAll(left, in.data(), moved);
    sender.join();
    if (!sent || !got) failed = absl::UnavailableError("raw TCP: the ring broke");
    if (i > 0) raw_times.push_back(Since(t));
  }
  close(left);
  close(right);
  if (!failed.ok()) return failed;
  std::cout << "times gloo=" << absl::StrJoin(gloo_times, ",") << " raw="
            << absl::StrJoin(raw_times, ",") << " split=" << absl::StrJoin(split_times, ",")
            << std::endl;
  return barrier();  // nobody closes its pairs while another still reads
}

absl::StatusOr<std::vector<double>> ParseTimes(const std::string& line, const std::string& name) {
  for (absl::string_view part : absl::StrSplit(line, ' ')) {
    if (!absl::ConsumePrefix(&part, name + "=")) continue;
    std::vector<double> out;
    for (absl::string_view v : absl::StrSplit(part, ',')) {
      double d = 0;
      if (!absl::SimpleAtod(v, &d)) return absl::InternalError(absl::StrCat("bad time ", v));
      out.push_back(d);
    }
    return out;
  }
  return absl::InternalError(absl::StrCat("no ", name, "= in '", line, "'"));
}

}  // namespace

int RunAllreduceWorker(int argc, char** argv) {
  int rank = 0, size = 0, reps = 0;
  int64_t floats = 0;
  if (argc != 8 || !absl::SimpleAtoi(argv[4], &rank) || !absl::SimpleAtoi(argv[5], &size) ||
      !absl::SimpleAtoi(argv[6], &floats) || !absl::SimpleAtoi(argv[7], &reps)) {
    std::cerr << "usage: pipetrain-bench --allreduce-worker ADDR PREFIX RANK SIZE FLOATS REPS\n";
    return 2;
  }
  absl::Status s = Worker(argv[2], argv[3], rank, size, floats, reps);
  if (!s.ok()) {
    std::cerr << "allreduce worker " << rank << ": " << s << "\n";
    return 1;
  }
  return 0;
}

absl::StatusOr<BenchResult> RunAllreduceBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 5;
  coordinator::RendezvousStore store;
  coordinator::RendezvousService service(&store);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return absl::UnavailableError("allreduce: cannot start the store server");
  const std::string address = absl::StrCat("127.0.0.1:", port);
  const std::string self = "/proc/self/exe";
  BenchResult result;
  result.Label("transport", "gloo tcp, loopback, processes");
  result.Label("bus_bandwidth", "2(R-1)/R x buffer bytes / seconds (per process)");
  result.Label("split", "split_*: a reduce-scatter then an all-gather of the same buffer (what "
                        "copies that split the optimizer run; the same bytes as the "
                        "all-reduce), in the same run; split_time_over_allreduce < 1 is faster");
  int run = 0;
  for (int size : {2, 4}) {
    for (int mib : {16, 64}) {
      const int64_t floats = (int64_t{mib} << 20) / GradientElementBytes();
      const std::string prefix = absl::StrCat("run-", run++);
      std::vector<testing::Subprocess> workers;
      for (int r = 0; r < size; ++r) {
        absl::StatusOr<testing::Subprocess> w = testing::Subprocess::Start(
            {self, "--allreduce-worker", address, prefix, std::to_string(r), std::to_string(size),
             std::to_string(floats), std::to_string(reps)});
        if (!w.ok()) return w.status();
        workers.push_back(*std::move(w));
      }
      // The slowest process per repetition.
      std::vector<double> gloo(reps, 0), raw(reps, 0), split(reps, 0);
      for (int r = 0; r < size; ++r) {
        absl::StatusOr<std::string> line =
            workers[r].WaitForLine("times ", std::chrono::seconds(300));
        if (!line.ok()) {
          return absl::UnavailableError(absl::StrCat("allreduce R=", size, " ", mib, " MiB: worker ",
                                                     r, ": ", line.status().message(), ": ",
                                                     workers[r].stderr_text()));
        }
        absl::StatusOr<std::vector<double>> g = ParseTimes(*line, "gloo");
        absl::StatusOr<std::vector<double>> t = ParseTimes(*line, "raw");
        absl::StatusOr<std::vector<double>> h = ParseTimes(*line, "split");
        if (!g.ok()) return g.status();
        if (!t.ok()) return t.status();
        if (!h.ok()) return h.status();
        for (int i = 0; i < reps && i < static_cast<int>(g->size()); ++i) {
          gloo[i] = std::max(gloo[i], (*g)[i]);
          raw[i] = std::max(raw[i], (*t)[i]);
        }
        for (int i = 0; i < reps && i < static_cast<int>(h->size()); ++i) {
          split[i] = std::max(split[i], (*h)[i]);
        }
      }
      for (int r = 0; r < size; ++r) {
        absl::StatusOr<int> code = workers[r].Wait(std::chrono::seconds(60));
        if (!code.ok() || *code != 0) {
          return absl::InternalError(absl::StrCat("allreduce worker ", r, " failed: ",
                                                  workers[r].stderr_text()));
        }
      }
      const double moved = static_cast<double>(RingBytes(floats * GradientElementBytes(), size));
      const double gloo_bw = moved / Median(gloo) / 1e9;
      const double raw_bw = moved / Median(raw) / 1e9;
      const std::string tag = absl::StrCat("R", size, "_", mib, "MiB");
      result.Add(absl::StrCat("gloo_busbw_GBps_", tag), gloo_bw);
      result.Add(absl::StrCat("raw_tcp_GBps_", tag), raw_bw);
      result.Add(absl::StrCat("gloo_vs_raw_", tag), gloo_bw / raw_bw);
      result.Add(absl::StrCat("split_busbw_GBps_", tag), moved / Median(split) / 1e9);
      result.Add(absl::StrCat("split_time_over_allreduce_", tag), Median(split) / Median(gloo));
      store.Forget(kJob);
    }
  }
  server->Shutdown();
  RETURN_IF_ERROR(AddReplicaStepFigures(options, result));
  return result;
}

}  // namespace pipetrain::bench
