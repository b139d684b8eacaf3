// Comparing parameter maps byte for byte, for tests that round-trip checkpoints.
#pragma once

#include <cstring>

#include "common/model/checkpoint.h"

namespace pipetrain::testing {

// The same names, and under each the same dtype, shape and bytes.
inline bool IdenticalParams(const model::ParamMap& a, const model::ParamMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape() != t.shape() || it->second.dtype() != t.dtype() ||
        std::memcmp(it->second.bytes().data(), t.bytes().data(), t.num_bytes()) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace pipetrain::testing
