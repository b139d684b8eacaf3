#include "coordinator/planner/partitioner.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

absl::Status CheckParts(int num_layers, int parts) {
  if (parts < 1)
    return absl::InvalidArgumentError(absl::StrCat("parts must be >= 1 (got ", parts, ")"));
  if (parts > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split ", num_layers, " pipeline layers into ", parts,
        " parts: every stage needs at least one layer (use at most ", num_layers, " stages)"));
  }
  return absl::OkStatus();
}

std::string Gib(double bytes) {
  return absl::StrFormat("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}

// Minimises max over parts of part_cost(p, b, e) by dynamic programming; returns the
// split and its value, or kInf when every split has an infinite part.
std::pair<Partition, double> MinMax(int n, int parts,
                                    const std::function<double(int, int, int)>& part_cost) {
  // best[p][i]: the least worst part over splits of layers [0, i) into p parts.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> from(parts + 1, std::vector<int>(n + 1, -1));
  best[0][0] = 0;
  for (int p = 1; p <= parts; ++p) {
    for (int i = p; i <= n - (parts - p); ++i) {
      for (int j = p - 1; j < i; ++j) {
        if (best[p - 1][j] == kInf) continue;
        const double v = std::max(best[p - 1][j], part_cost(p - 1, j, i));
        if (v < best[p][i]) {
          best[p][i] = v;
          from[p][i] = j;
        }
      }
    }
  }
  Partition out;
  out.bounds.assign(parts + 1, 0);
  if (best[parts][n] == kInf) return {out, kInf};
  int i = n;
  for (int p = parts; p > 0; --p) {
    out.bounds[p] = i;
    i = from[p][i];
  }
  return {out, best[parts][n]};
}

}  // namespace

double PartMemory(const MemoryLimit& limit, int part, int begin, int end) {
  double w = 0, a = 0;
  for (int l = begin; l < end; ++l) {
    w += limit.weight_bytes[l];
    a += limit.activation_bytes[l];
  }
  const double once = limit.chunk_bytes ? limit.chunk_bytes(begin, end) : 0;
  return w + once + a * limit.in_flight[part];
}

absl::StatusOr<Partition> PartitionByCount(int num_layers, int parts) {
  if (absl::Status s = CheckParts(num_layers, parts); !s.ok()) return s;
  Partition out;
  out.bounds.push_back(0);
  for (int p = 0; p < parts; ++p) {
    out.bounds.push_back(out.bounds.back() + num_layers / parts + (p < num_layers % parts ? 1 : 0));
  }
  return out;
}

absl::StatusOr<Partition> PartitionByCost(const std::vector<double>& cost, int parts,
                                          const MemoryLimit* limit,
                                          const std::vector<double>* speed) {
  const int n = static_cast<int>(cost.size());
  if (absl::Status s = CheckParts(n, parts); !s.ok()) return s;
  if (limit != nullptr && (static_cast<int>(limit->weight_bytes.size()) != n ||
                           static_cast<int>(limit->activation_bytes.size()) != n ||
                           static_cast<int>(limit->in_flight.size()) != parts)) {
    return absl::InvalidArgumentError("memory limit: sizes do not match the layers and parts");
  }
  if (speed != nullptr && (static_cast<int>(speed->size()) != parts ||
                          std::any_of(speed->begin(), speed->end(),
                                      [](double v) { return !(v > 0 && v < kInf); }))) {
    return absl::InvalidArgumentError(
        absl::StrCat("part speeds: ", speed->size(), " for ", parts,
                     " parts; each must be finite and > 0"));
  }
  for (int l = 0; l < n; ++l) {
    if (!(cost[l] >= 0 && cost[l] < kInf)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " has cost ", cost[l], "; costs must be finite and >= 0"));
    }
  }
  std::vector<double> prefix(n + 1, 0);
  for (int l = 0; l < n; ++l) prefix[l + 1] = prefix[l] + cost[l];
  auto compute = [&](int p, int b, int e) {
    if (limit != nullptr && limit->cap_bytes > 0 &&
        PartMemory(*limit, p, b, e) > limit->cap_bytes) {
      return kInf;
    }
    return (prefix[e] - prefix[b]) / (speed != nullptr ? (*speed)[p] : 1.0);
  };
  auto [partition, value] = MinMax(n, parts, compute);
  if (value != kInf) return partition;
  // Nothing fits: report the split that needs the least memory on its fullest part.
  auto memory = [&](int p, int b, int e) { return PartMemory(*limit, p, b, e); };
  auto [tight, need] = MinMax(n, parts, memory);
  int worst = 0;
  for (int p = 0; p < parts; ++p) {
    if (memory(p, tight.begin(p), tight.end(p)) >= need) {
      worst = p;
      break;
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("the model does not fit in ", parts, " stages of ", Gib(limit->cap_bytes),
                   ": the split that needs least memory still needs ", Gib(need), " on stage ",
                   worst, " (layers ", tight.begin(worst), "..", tight.end(worst) - 1, ", holding ",
                   limit->in_flight[worst], " micro-batches of activations); available ",
                   Gib(limit->cap_bytes), " per stage"));
}

double MaxPartCost(const std::vector<double>& cost, const Partition& partition) {
  double worst = 0;
  for (int p = 0; p < partition.parts(); ++p) {
    double sum = 0;
    for (int l = partition.begin(p); l < partition.end(p); ++l) sum += cost[l];
    worst = std::max(worst, sum);
  }
  return worst;
}

}  // namespace pipetrain::planner
