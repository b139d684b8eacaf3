// Where a job's R data-parallel replicas go: the order of its R x K stages (index r*K+s
// is stage position s of replica r) that puts the R copies of each stage position on
// as few hosts as possible, so that their gradient all-reduce stays on one machine's
// fastest link. Pure: the host is the host part of a stage's registered address.
#pragma once

#include <string>
#include <vector>

#include "coordinator/stages/stage_registry.h"

namespace pipetrain::coordinator {

// The host part of a registered address: "10.0.0.5:50051" -> "10.0.0.5",
// "[::1]:7000" -> "::1", "node3:50051" -> "node3"; an address that does not parse as
// HOST:PORT is its own host.
std::string StageHost(const std::string& address);

// `stages` (R x K of them, any order; their order is the tie-break, so callers pass
// them in registry order, or in the slots a run had) ordered r*K+s so that each stage
// position's R copies span as few hosts as possible. Greedy: each position in turn takes
// a host that can hold all R copies, else the hosts with the most stages left; a stage
// keeps its slot where its host serves that position, and when the greedy order spans
// no fewer hosts than the input order, the input order stays. Deterministic; unchanged
// with R == 1 or when stages.size() != R * K.
std::vector<StageRecord> PlaceReplicas(std::vector<StageRecord> stages, int replicas,
                                       int stages_per_replica);

// The stage positions of a placement (ordered r*K+s) whose copies are on more than one
// host, in position order.
std::vector<int> PositionsSpanningHosts(const std::vector<StageRecord>& placed, int replicas,
                                        int stages_per_replica);

// One line for the job's log: "replicas placed: stage position 0 on host 10.0.0.5
// (2 copies), stage position 1 on 10.0.0.6 (2 copies)"; a position whose copies span
// hosts reads "stage position 1 spans 2 hosts: 10.0.0.6 (1 copy), 10.0.0.7 (1 copy)",
// and the line ends by naming those positions.
std::string DescribePlacement(const std::vector<StageRecord>& placed, int replicas,
                              int stages_per_replica);

}  // namespace pipetrain::coordinator
