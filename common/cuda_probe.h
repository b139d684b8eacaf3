// Finds out whether a usable CUDA device is present. Every CUDA error counts as "no
// GPU" (on machines without a driver cudaGetDeviceCount itself fails), and the reason
// is logged once per process. Builds without CUDA answer "no GPU" too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::common {

struct CudaDevice {
  int index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  // The GPU's UUID as nvidia-smi prints it ("GPU-8-4-4-4-12 hex digits"): the same from
  // every process, whatever CUDA_VISIBLE_DEVICES numbers it.
  std::string uuid;
};

struct CudaProbe {
  std::vector<CudaDevice> devices;  // empty when there is no usable GPU
  std::string reason;               // why there is none, when empty
};

// Cached after the first call; the first call that finds no GPU logs the reason.
const CudaProbe& ProbeCuda();
inline bool HasCudaDevice() { return !ProbeCuda().devices.empty(); }

// Runs a small kernel on `device` (adds two random vectors, checks on the host):
// proves the toolkit's code runs on it. An error message says what failed.
bool CudaSmokeTest(int device, std::string* error);

}  // namespace pipetrain::common
