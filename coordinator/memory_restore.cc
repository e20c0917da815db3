#include "coordinator/memory_restore.h"

#include <map>

namespace meshrun::coordinator {

std::optional<v1::MemoryRestore> PickMemoryRestore(const std::string& job_id,
                                                   const std::vector<std::string>& run_hosts,
                                                   const std::vector<SurvivingHost>& survivors,
                                                   bool replicas, int64_t at_least) {
  // step -> its holders (and the data position they agree on)
  std::map<int64_t, v1::MemoryRestore, std::greater<>> steps;
  for (const SurvivingHost& survivor : survivors) {
    for (const v1::MemoryCheckpointHeld& held : survivor.held) {
      if (held.job_id() != job_id || held.step() < at_least || held.step() <= 0) continue;
      v1::MemoryRestore& restore = steps[held.step()];
      restore.set_step(held.step());
      restore.set_data_position(held.data_position());
      v1::MemoryHolder* holder = restore.add_holders();
      holder->set_host(survivor.host);
      holder->set_address(survivor.address);
    }
  }
  for (auto& [step, restore] : steps) {
    bool covered = restore.holders_size() > 0;
    if (!replicas) {  // each host's own shards: every host of the run must hold its copy
      for (const std::string& host : run_hosts) {
        bool held = false;
        for (const v1::MemoryHolder& holder : restore.holders()) held |= holder.host() == host;
        covered &= held;
      }
    }
    if (covered) return restore;
  }
  return std::nullopt;
}

}  // namespace meshrun::coordinator
