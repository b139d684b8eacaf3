// Contiguous split of the model's pipeline layers (embedding, blocks, head) over parts
// (stages, or virtual stages for interleaved schedules): by count, or by a per-layer
// cost vector (parameters, FLOPs or measured times) minimising the slowest part,
// optionally under a per-part memory cap.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::planner {

struct Partition {
  std::vector<int> bounds;  // parts + 1 entries; part p holds layers [bounds[p], bounds[p+1])
  int parts() const { return static_cast<int>(bounds.size()) - 1; }
  int begin(int p) const { return bounds[p]; }
  int end(int p) const { return bounds[p + 1]; }
  bool operator==(const Partition&) const = default;
};

// Memory of a part: its layers' weight bytes (weights, gradients, optimizer state), what
// the part holds once for its layers together (chunk_bytes: the tables they share), plus
// the activation bytes one micro-batch keeps in its layers times how many micro-batches
// the part holds at peak, which depends on its position (1F1B's first stage holds K).
struct MemoryLimit {
  std::vector<double> weight_bytes;      // per layer
  std::vector<double> activation_bytes;  // per layer, per micro-batch held
  std::vector<int> in_flight;            // per part
  double cap_bytes = 0;                  // per part
  std::function<double(int begin, int end)> chunk_bytes;  // per part; none when empty
};
double PartMemory(const MemoryLimit& limit, int part, int begin, int end);

// Equal layer counts, the first (layers % parts) parts one layer more.
absl::StatusOr<Partition> PartitionByCount(int num_layers, int parts);

// Minimises the largest per-part time, a part's sum of `cost` over its `speed` (per part,
// > 0; none: 1 each), exactly, by dynamic programming over the split points, among
// splits that respect `limit` when it is given. When none does, the error says how much
// memory the best split needs against the cap.
absl::StatusOr<Partition> PartitionByCost(const std::vector<double>& cost, int parts,
                                          const MemoryLimit* limit = nullptr,
                                          const std::vector<double>* speed = nullptr);

// Largest per-part sum of cost under a partition.
double MaxPartCost(const std::vector<double>& cost, const Partition& partition);

}  // namespace pipetrain::planner
