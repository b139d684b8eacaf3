// Lists of whole numbers as Linux writes CPU sets ("0-3,8"): ascending, runs of
// consecutive numbers as FIRST-LAST. A stage's CPUs, the stages that share a device.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pipetrain::common {

// "0-3,8" -> {0, 1, 2, 3, 8} (sorted, no repeats); empty for text that is not such a
// list, or a range of more than 65536 numbers.
std::vector<int> ParseNumberList(absl::string_view text);

// {0, 1, 2, 3, 8} -> "0-3,8", the parts joined by `separator`. `numbers` ascending.
std::string NumberListText(const std::vector<int>& numbers, absl::string_view separator = ",");

}  // namespace pipetrain::common
