// Host names in the order people expect: runs of digits compare as numbers, so "worker-2"
// sorts before "worker-10" (plain string order puts "worker-10" first). Used wherever hosts
// are listed or ranked (registry listings, mesh planning, straggler flags, the dashboard).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace meshrun {

// Strict weak order: compares a and b chunk by chunk, a digit run against a digit run by
// numeric value (leading zeros ignored; on equal value the shorter run first), everything
// else byte by byte. Equal strings compare equal.
bool NaturalLess(absl::string_view a, absl::string_view b);

// As a comparator type, e.g. std::map<std::string, T, NaturalOrder>.
struct NaturalOrder {
  bool operator()(absl::string_view a, absl::string_view b) const { return NaturalLess(a, b); }
};

// Sorts `names` in place in natural order.
void NaturalSort(std::vector<std::string>& names);

}  // namespace meshrun
