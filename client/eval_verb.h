// `pipetrain eval --checkpoint FILE --text FILE --batch B [--grads-out FILE] [--json]`:
// the mean loss of a whole-model checkpoint on the first B rows of T + 1 bytes of a text
// and, optionally, its gradient for every parameter: how anyone checks the numbers
// against another implementation (in-process, on the cpu reference backend).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunEval(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
