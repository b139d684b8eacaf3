// `pipetrain-bench link --same-host`'s two stage processes: this process sends as stage
// 0, a hidden worker (`pipetrain-bench --link-worker auto|off REPS`) receives as stage
// 1 behind its own gRPC server, on the same-host path (auto) or the stream (off). Per
// step the sender sends 16 x 16 MiB activations; the worker takes each as it arrives
// (on even steps also copying it into warm memory, as a stage stages an activation for
// its compute), checks the bytes, and answers with a 4-byte gradient, which ends the
// sender's clock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/benchmark.h"
#include "common/tensor.h"
#include "stage_server/link/peer_link.h"
#include "tests/testing/subprocess.h"

namespace pipetrain::bench {

inline constexpr size_t kLinkTensorBytes = size_t{16} << 20;
inline constexpr int kLinkTensorsPerStep = 16;

// The bytes every link bench tensor carries (the worker checks them).
std::vector<char> LinkBenchBytes();

// A worker and the link to it.
class LinkWorker {
 public:
  // Starts the worker for `steps` steps (numbered 0 ..) and connects; with `same_host`,
  // waits until the offer is answered and fails unless shared memory was taken.
  static absl::StatusOr<LinkWorker> Start(bool same_host, int steps);
  // Seconds from the first send of step `step` to the worker's answer. Landing (the
  // worker copies each tensor out) on even steps.
  absl::StatusOr<double> Step(uint64_t step, std::shared_ptr<const common::Tensor> tensor);
  // Waits for the worker's exit: an error names what it said.
  absl::Status Finish();
  std::string path() const { return link_->sending_path(); }

 private:
  std::unique_ptr<testing::Subprocess> process_;
  std::unique_ptr<stage_server::PeerLink> link_;
};

// The worker's main (argv: pipetrain-bench --link-worker auto|off STEPS).
int RunLinkWorker(int argc, char** argv);

}  // namespace pipetrain::bench
