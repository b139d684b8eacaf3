// Build of common/cuda_probe.h without the CUDA toolkit: there is never a GPU.
#include <mutex>

#include "common/cuda_probe.h"
#include "common/logging.h"

namespace pipetrain::common {

const CudaProbe& ProbeCuda() {
  static CudaProbe probe{{}, "pipetrain was built without CUDA (PIPETRAIN_WITH_CUDA=OFF)"};
  static std::once_flag once;
  std::call_once(once, [] { LogInfo("cuda", probe.reason); });
  return probe;
}

bool CudaSmokeTest(int device, std::string* error) {
  *error = ProbeCuda().reason;
  return false;
}

}  // namespace pipetrain::common
