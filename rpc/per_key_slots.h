// Caps on what is held at once (open streams), per key (an identity) and in all: one key cannot
// hold more than `per_key` slots, nor all keys together more than `total`, so one caller cannot
// take every slot. A slot is given back when its Slot is destroyed. Generic: the HTTP port
// uses it for its event streams, keyed by identity, one instance per class of traffic (admin
// apart from view); rpc/identity_slots.h builds the gRPC services' shares on it.
//
// Lifetime: a Slot shares the counters, so it may outlive its PerKeySlots.
// Thread-safety: every method, and a Slot's release, is safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace meshrun::services {

class PerKeySlots {
 private:
  struct Counts {
    absl::Mutex mu;
    int64_t total ABSL_GUARDED_BY(mu) = 0;
    std::map<std::string, int64_t> per_key ABSL_GUARDED_BY(mu);
  };

 public:
  // Held while the stream is open; gives its slot back when destroyed. Empty when default-made.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept = default;
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        Release();
        counts_ = std::move(other.counts_);
        key_ = std::move(other.key_);
      }
      return *this;
    }
    ~Slot() { Release(); }

   private:
    friend class PerKeySlots;
    Slot(std::shared_ptr<Counts> counts, std::string key)
        : counts_(std::move(counts)), key_(std::move(key)) {}
    void Release() {
      if (counts_ == nullptr) return;
      absl::MutexLock l(&counts_->mu);
      --counts_->total;
      auto it = counts_->per_key.find(key_);
      if (it != counts_->per_key.end() && --it->second <= 0) counts_->per_key.erase(it);
      counts_.reset();
    }
    std::shared_ptr<Counts> counts_;
    std::string key_;
  };

  // `total`, `per_key`: 0 is unlimited. `what` names the slots ("event streams"); the flags
  // name what sets each limit, for the refusal.
  PerKeySlots(int64_t total, int64_t per_key, std::string what, std::string total_flag,
              std::string per_key_flag)
      : total_(total),
        per_key_(per_key),
        what_(std::move(what)),
        total_flag_(std::move(total_flag)),
        per_key_flag_(std::move(per_key_flag)) {}

  // Errors: RESOURCE_EXHAUSTED when `key` holds `per_key` slots already ("<n> <what> of <key>
  // are open, the limit per identity; close one, or start the server with a larger
  // <per_key_flag>"); UNAVAILABLE when all keys hold `total` ("... the limit in all; retry
  // later, or ... <total_flag>").
  absl::StatusOr<Slot> Acquire(const std::string& key) {
    absl::MutexLock l(&counts_->mu);
    int64_t& mine = counts_->per_key[key];
    if (per_key_ > 0 && mine >= per_key_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          mine, " ", what_, " of ", key, " are open, the limit per identity; close one, or "
          "start the server with a larger ", per_key_flag_));
    }
    if (total_ > 0 && counts_->total >= total_) {
      if (mine == 0) counts_->per_key.erase(key);
      return absl::UnavailableError(absl::StrCat(
          counts_->total, " ", what_, " are open, the limit in all; close one, retry later, or "
          "start the server with a larger ", total_flag_));
    }
    ++mine;
    ++counts_->total;
    return Slot(counts_, key);
  }

  int64_t open() const {
    absl::MutexLock l(&counts_->mu);
    return counts_->total;
  }
  int64_t open(const std::string& key) const {
    absl::MutexLock l(&counts_->mu);
    auto it = counts_->per_key.find(key);
    return it == counts_->per_key.end() ? 0 : it->second;
  }

 private:
  const int64_t total_;
  const int64_t per_key_;
  const std::string what_;
  const std::string total_flag_;
  const std::string per_key_flag_;
  const std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
};

}  // namespace meshrun::services
