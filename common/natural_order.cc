#include "common/natural_order.h"

#include <algorithm>
#include <cctype>

namespace meshrun {
namespace {

bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

}  // namespace

bool NaturalLess(absl::string_view a, absl::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (IsDigit(a[i]) && IsDigit(b[j])) {
      const size_t start_a = i, start_b = j;
      while (i < a.size() && IsDigit(a[i])) ++i;
      while (j < b.size() && IsDigit(b[j])) ++j;
      absl::string_view run_a = a.substr(start_a, i - start_a);
      absl::string_view run_b = b.substr(start_b, j - start_b);
      const size_t full_a = run_a.size(), full_b = run_b.size();
      while (run_a.size() > 1 && run_a.front() == '0') run_a.remove_prefix(1);
      while (run_b.size() > 1 && run_b.front() == '0') run_b.remove_prefix(1);
      if (run_a.size() != run_b.size()) return run_a.size() < run_b.size();
      if (run_a != run_b) return run_a < run_b;
      if (full_a != full_b) return full_a < full_b;  // "7" before "007"
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

void NaturalSort(std::vector<std::string>& names) {
  std::stable_sort(names.begin(), names.end(), NaturalOrder());
}

}  // namespace meshrun
