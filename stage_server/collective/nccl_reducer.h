// GradientReducer on NCCL, for CUDA stages on GPUs of their own (reducer_choice.h
// decides). The buffers it is given are in host memory, as every reducer's are: each
// call stages them through pinned host memory into device memory on the stage's GPU,
// runs NCCL's own all-reduce, reduce-scatter or all-gather there, and copies the result
// back. The communicator is non-blocking, so every call keeps its deadline: a replica
// that never comes, or one lost mid-call, ends in DEADLINE_EXCEEDED or UNAVAILABLE, the
// communicator aborted and the reducer broken for good (as a gloo one is).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "stage_server/collective/coordinator_store.h"
#include "stage_server/collective/gradient_reducer.h"

namespace pipetrain::stage_server::collective {

// Whether this build has NCCL (the CUDA toolkit's libnccl was found at configure time).
bool NcclBuilt();

// Connects this replica to the others of its stage position on `cuda_device`: replica
// 0 publishes NCCL's unique id in `store`, every replica creates its rank of the
// communicator, all by `deadline` (options.connect_deadline is not read: the caller
// has spent some of it choosing the library). FAILED_PRECONDITION in a build
// without NCCL; UNAVAILABLE or DEADLINE_EXCEEDED naming the job, stage and replica when
// the device or a peer fails. Two replicas on one GPU are refused by NCCL itself
// (INVALID_ARGUMENT): ChooseCollective keeps them on gloo.
absl::StatusOr<std::unique_ptr<GradientReducer>> CreateNcclReducer(const ReducerOptions& options,
                                                                   int cuda_device,
                                                                   CoordinatorStore& store,
                                                                   absl::Time deadline);

}  // namespace pipetrain::stage_server::collective
