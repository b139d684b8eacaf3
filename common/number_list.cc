#include "common/number_list.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pipetrain::common {

std::vector<int> ParseNumberList(absl::string_view text) {
  std::set<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int lo = 0, hi = 0;
    if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], &lo) ||
        !absl::SimpleAtoi(ends.back(), &hi) || lo < 0 || hi < lo || hi - lo > 65536) {
      return {};
    }
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return {out.begin(), out.end()};
}

std::string NumberListText(const std::vector<int>& numbers, absl::string_view separator) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < numbers.size();) {
    size_t j = i;
    while (j + 1 < numbers.size() && numbers[j + 1] == numbers[j] + 1) ++j;
    parts.push_back(j > i ? absl::StrCat(numbers[i], "-", numbers[j]) : absl::StrCat(numbers[i]));
    i = j + 1;
  }
  return absl::StrJoin(parts, separator);
}

}  // namespace pipetrain::common
