// Least-recently-used eviction by bytes, for the on-disk stores (common/content_store.h, under
// the worker's executable store and the coordinator's program store).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace meshrun {

// The keys of `entries` (a map whose values have `int64_t bytes` and `absl::Time last`) to drop,
// least recently used first, until their bytes are at most `max_bytes`. An entry used at or
// after `keep_after` is never picked, so the total may stay over until it ages.
template <typename Map>
std::vector<typename Map::key_type> LruEvictions(const Map& entries, int64_t max_bytes,
                                                 absl::Time keep_after) {
  int64_t total = 0;
  std::vector<const typename Map::value_type*> old;
  for (const auto& entry : entries) {
    total += entry.second.bytes;
    if (entry.second.last < keep_after) old.push_back(&entry);
  }
  std::sort(old.begin(), old.end(),
            [](const auto* a, const auto* b) { return a->second.last < b->second.last; });
  std::vector<typename Map::key_type> out;
  for (const auto* entry : old) {
    if (total <= max_bytes) break;
    total -= entry->second.bytes;
    out.push_back(entry->first);
  }
  return out;
}

}  // namespace meshrun
