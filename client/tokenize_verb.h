// `pipetrain tokenize --tokenizer bytes|gpt2|llama3 --out FILE.bin TEXT...`: encodes text
// files, in order and on N threads, into one llm.c token file (common/data/
// token_file_writer.h; Llama 3's uint32 layout for llama3), optionally with the
// begin-of-text token before each file and the end-of-text token between files; prints
// count and throughput.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunTokenize(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
