// Fuzzes a stage's Configure validation (stage_server): the bytes parsed as a
// ConfigureRequest, as gRPC hands it to StageService::Configure, translated by
// JobConfigFromProto and configured on a StageRuntime, which must refuse a bad request
// with a status before it allocates. Two runtimes are reused across inputs, as a stage
// is reconfigured job after job: an emulated device, and the CPU backend with a small
// memory limit (so that what passes the checks stays within the fuzzer's memory).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "google/protobuf/stubs/logging.h"
#include "pipetrain/v1/stage.pb.h"
#include "stage_server/runtime/stage_runtime.h"
#include "stage_server/stage_service.h"

namespace stage_server = pipetrain::stage_server;

namespace {

stage_server::StageRuntime& Runtime(bool cpu) {
  static stage_server::StageRuntime* const runtimes[2] = {
      [] {
        stage_server::RuntimeOptions o;
        o.device.kind = stage_server::DeviceSpec::Kind::kEmulated;
        o.device.emulated = "h100";
        o.memory_limit_bytes = uint64_t{1} << 30;
        return new stage_server::StageRuntime(o);
      }(),
      [] {
        stage_server::RuntimeOptions o;
        o.device.kind = stage_server::DeviceSpec::Kind::kCpu;
        o.memory_limit_bytes = uint64_t{16} << 20;
        return new stage_server::StageRuntime(o);
      }(),
  };
  return *runtimes[cpu ? 1 : 0];
}

}  // namespace

// Protobuf logs every string field that is not UTF-8; the parse failing is the test.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the runtime; the rest is the request.
  const bool cpu = data[0] & 1;
  pipetrain::v1::ConfigureRequest request;
  if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  auto config = stage_server::JobConfigFromProto(request);
  if (!config.ok()) return 0;
  (void)stage_server::StateBytes(*config);
  stage_server::StageRuntime& runtime = Runtime(cpu);
  auto result = runtime.Configure(*config);
  if (result.ok() && !runtime.configured()) __builtin_trap();
  (void)runtime.Stats();
  return 0;
}
