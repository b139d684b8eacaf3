// `pipetrain init --model JSON --seed S --out FILE`: writes a freshly initialised
// whole-model checkpoint (safetensors, Hugging Face GPT-2 names, config in metadata),
// the weights every stage of a job with that seed starts from.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunInit(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
