// `pipetrain train-local --model JSON --text FILE --steps N --batch B [flags]`: trains
// the whole model in this process on the cpu backend (compute::Trainer) and prints every
// step's loss, time and tokens/s: the single-device baseline a cluster run compares with.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunTrainLocal(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
