// `pipetrain tokenize --tokenizer gpt2|bytes --out FILE.bin TEXT...`: encodes text files,
// in order and on N threads, into one llm.c token file (common/data/token_file_writer.h),
// optionally with GPT-2's end-of-text token between files; prints count and throughput.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunTokenize(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
