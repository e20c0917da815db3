#include "coordinator/memory_restore.h"

#include <map>

namespace meshrun::coordinator {

std::optional<v1::MemoryRestore> PickMemoryRestore(const std::string& job_id,
                                                   const std::vector<std::string>& run_hosts,
                                                   const std::vector<SurvivingHost>& survivors,
                                                   bool replicas, int64_t at_least,
                                                   int64_t at_most) {
  // step -> its holders (and the data position they agree on)
  std::map<int64_t, v1::MemoryRestore, std::greater<>> steps;
  for (const SurvivingHost& survivor : survivors) {
    std::map<int64_t, v1::MemoryHolder*> holder_of_step;  // one holder entry per step
    for (const v1::MemoryCheckpointHeld& held : survivor.held) {
      if (held.job_id() != job_id || held.step() < at_least || held.step() > at_most ||
          held.step() <= 0) {
        continue;
      }
      v1::MemoryRestore& restore = steps[held.step()];
      v1::MemoryHolder*& holder = holder_of_step[held.step()];
      if (holder == nullptr) {
        restore.set_step(held.step());
        restore.set_data_position(held.data_position());
        holder = restore.add_holders();
        holder->set_host(survivor.host);
        holder->set_address(survivor.address);
      }
      holder->add_blocks_of(held.of_host().empty() ? survivor.host : held.of_host());
    }
  }
  for (auto& [step, restore] : steps) {
    bool covered = restore.holders_size() > 0;
    if (!replicas) {  // each host's own shards: a survivor must hold each host's, or its copy
      for (const std::string& host : run_hosts) {
        bool held = false;
        for (const v1::MemoryHolder& holder : restore.holders()) {
          for (const std::string& of : holder.blocks_of()) held |= of == host;
        }
        covered &= held;
      }
    }
    if (covered) return restore;
  }
  return std::nullopt;
}

}  // namespace meshrun::coordinator
