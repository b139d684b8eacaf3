// `pipetrain export-hf CHECKPOINT --out DIR`: a pipetrain checkpoint (a job's checkpoint
// folder or one whole-model safetensors file) written as a Hugging Face folder that
// GPT2LMHeadModel or LlamaForCausalLM.from_pretrained(DIR) loads. Runs no model, so it links no backend.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunExportHf(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
