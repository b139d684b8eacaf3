// `pipetrain generate --checkpoint CKPT --prompt TEXT [flags]`: continues a prompt with a
// whole-model checkpoint (a file, or a job's checkpoint folder), in-process on the cpu or
// a cuda backend, printing each token as it is drawn (compute/token_generator.h).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunGenerate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
