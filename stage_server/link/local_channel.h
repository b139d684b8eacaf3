// An in-memory TensorChannel pair: what one end sends, the other receives (a copy, as a
// network would deliver). For tests and for pipelines whose stages share a process.
#pragma once

#include <memory>
#include <utility>

#include "stage_server/link/tensor_channel.h"

namespace pipetrain::stage_server {

// first: the upstream end (sends activations, receives gradients); second: downstream.
std::pair<std::unique_ptr<TensorChannel>, std::unique_ptr<TensorChannel>> MakeLocalChannelPair();

}  // namespace pipetrain::stage_server
