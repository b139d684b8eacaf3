// The coordinator's rendezvous RPCs on 127.0.0.1, for tests that connect the replicas of
// one stage position in threads (gradient_reducer_test, reducer_choice_test,
// nccl_reducer_test), and the options each replica passes.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/rendezvous/rendezvous_service.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "stage_server/collective/gradient_reducer.h"
#include "tests/testing/fake_coordinator.h"

namespace pipetrain::testing {

class ReducerRendezvous {
 public:
  ReducerRendezvous() : service_(&store_), server_(&service_) {}

  stage_server::collective::ReducerOptions Options(int replica, int replicas,
                                                   const std::string& prefix, int stage = 1) const {
    stage_server::collective::ReducerOptions o;
    o.job_id = "job-000042";
    o.stage = stage;
    o.replica = replica;
    o.replicas = replicas;
    o.rendezvous_prefix = prefix;
    o.coordinator_address = server_.address();
    o.connect_deadline = absl::Seconds(30);
    return o;
  }

  // Runs `body(r)` for r = 0 .. n - 1, each in its own thread, and joins them.
  static void InThreads(int n, const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
    for (std::thread& t : threads) t.join();
  }

  const std::string& address() const { return server_.address(); }
  coordinator::RendezvousStore& store() { return store_; }

 private:
  coordinator::RendezvousStore store_;
  coordinator::RendezvousService service_;
  TestServer server_;
};

}  // namespace pipetrain::testing
