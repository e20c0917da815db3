#include "coordinator/worker_registry.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/natural_order.h"

namespace meshrun::coordinator {

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kAlive: return "ALIVE";
    case WorkerState::kDead: return "DEAD";
    case WorkerState::kLeft: return "LEFT";
  }
  return "UNKNOWN";
}

namespace {

// "host:port" or "[v6]:port" with a port in 1..65535: where the coordinator will call.
absl::Status CheckAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535 ||
      address.find_first_of(" \t\r\n/") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "registration.address \"", address, "\" is not host:port (e.g. 10.0.0.5:7071)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(Config config) {
  if (config.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_timeout must be positive");
  }
  if (config.clock == nullptr) return absl::InvalidArgumentError("clock must not be null");
  return std::unique_ptr<WorkerRegistry>(new WorkerRegistry(config));
}

absl::Status WorkerRegistry::Register(const WorkerInfo& info) {
  for (const auto& [field, value] : {std::pair<const char*, const std::string&>{"host", info.host},
                                     {"address", info.address},
                                     {"incarnation", info.incarnation}}) {
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("registration.", field, " is empty"));
    }
  }
  if (absl::Status address = CheckAddress(info.address); !address.ok()) return address;
  absl::MutexLock lock(&mu_);
  if (incarnation_host_.contains(info.incarnation)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "incarnation ", info.incarnation, " of host ", incarnation_host_[info.incarnation],
        " registered before; a restarted worker must register with a fresh incarnation"));
  }
  ExpireOverdueLocked();
  // Another process claiming a live host's name from another address while the live one still
  // heartbeats (a second worker with the same --host, or a spoof) would fence the live one and
  // kill its job: refused until the live one goes quiet. A restart at the same address is the
  // same worker and replaces it at once.
  if (auto live = by_host_.find(info.host);
      live != by_host_.end() && live->second.state == WorkerState::kAlive &&
      live->second.info.address != info.address &&
      config_.clock->Now() - live->second.last_heartbeat < heartbeat_interval() * 3 / 2) {
    return absl::AlreadyExistsError(absl::StrCat(
        "host ", info.host, " is alive at ", live->second.info.address, " (incarnation ",
        live->second.info.incarnation, ", heartbeating); a second worker cannot take its name: "
        "give it another --host, or stop the first"));
  }
  if (auto owner = address_owner_.find(info.address);
      owner != address_owner_.end() && owner->second != info.host) {
    if (auto held = by_host_.find(owner->second);
        held != by_host_.end() && held->second.state == WorkerState::kAlive) {
      return absl::AlreadyExistsError(absl::StrCat(
          "address ", info.address, " belongs to host ", owner->second, " (alive, incarnation ",
          held->second.info.incarnation, "); host ", info.host,
          " cannot register there: give it its own --listen address, or drain ", owner->second,
          " first"));
    }
  }
  incarnation_host_[info.incarnation] = info.host;
  WorkerEntry& entry = by_host_[info.host];
  if (entry.state == WorkerState::kAlive && !entry.info.incarnation.empty()) {
    WorkerEntry replaced = entry;
    replaced.state = WorkerState::kDead;
    replaced.state_reason = absl::StrCat("replaced by new incarnation ", info.incarnation);
    newly_dead_.push_back(std::move(replaced));
  }
  if (!entry.info.incarnation.empty()) {
    replaced_.emplace_back(config_.clock->Now(), entry.info.incarnation);
  }
  if (!entry.info.address.empty() && entry.info.address != info.address) {
    ReleaseAddressLocked(entry.info.address, info.host);
  }
  address_owner_[info.address] = info.host;
  entry = WorkerEntry{.info = info,
                      .state = WorkerState::kAlive,
                      .last_heartbeat = config_.clock->Now(),
                      .state_reason = ""};
  return absl::OkStatus();
}

absl::StatusOr<WorkerEntry*> WorkerRegistry::FindCurrent(const std::string& host,
                                                         const std::string& incarnation) {
  auto it = by_host_.find(host);
  if (it == by_host_.end()) {
    return absl::NotFoundError(absl::StrCat("host ", host, " is not registered; register first"));
  }
  WorkerEntry& entry = it->second;
  if (entry.info.incarnation != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incarnation ", incarnation, " of host ", host, " was replaced by ",
        entry.info.incarnation, "; register a fresh incarnation"));
  }
  if (entry.state != WorkerState::kAlive) {
    return absl::FailedPreconditionError(absl::StrCat(
        "host ", host, " incarnation ", incarnation, " is ", WorkerStateName(entry.state), " (",
        entry.state_reason, "); register a fresh incarnation"));
  }
  return &entry;
}

absl::Status WorkerRegistry::Heartbeat(const std::string& host, const std::string& incarnation) {
  absl::MutexLock lock(&mu_);
  ExpireHostIfOverdueLocked(host);
  auto entry = FindCurrent(host, incarnation);
  if (!entry.ok()) return entry.status();
  (*entry)->last_heartbeat = config_.clock->Now();
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckCurrent(const std::string& host,
                                          const std::string& incarnation) {
  absl::MutexLock lock(&mu_);
  ExpireHostIfOverdueLocked(host);
  return FindCurrent(host, incarnation).status();
}

absl::Status WorkerRegistry::AddExecutable(const std::string& host,
                                           const std::string& incarnation,
                                           const std::string& fingerprint) {
  absl::MutexLock lock(&mu_);
  auto entry = FindCurrent(host, incarnation);
  if (!entry.ok()) return entry.status();
  std::vector<std::string>& held = (*entry)->info.executable_fingerprints;
  if (std::find(held.begin(), held.end(), fingerprint) == held.end()) held.push_back(fingerprint);
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Deregister(const std::string& host, const std::string& incarnation) {
  absl::MutexLock lock(&mu_);
  auto entry = FindCurrent(host, incarnation);
  if (!entry.ok()) return entry.status();
  (*entry)->state = WorkerState::kLeft;
  (*entry)->state_reason = "deregistered (drained)";
  ReleaseAddressLocked((*entry)->info.address, host);
  return absl::OkStatus();
}

void WorkerRegistry::ExpireOverdueLocked() {
  const absl::Time now = config_.clock->Now();
  for (auto& [host, entry] : by_host_) ExpireIfOverdueLocked(entry, now);
  ForgetLocked(now);
}

void WorkerRegistry::ExpireHostIfOverdueLocked(const std::string& host) {
  if (auto it = by_host_.find(host); it != by_host_.end()) {
    ExpireIfOverdueLocked(it->second, config_.clock->Now());
  }
}

void WorkerRegistry::ExpireIfOverdueLocked(WorkerEntry& entry, absl::Time now) {
  if (entry.state == WorkerState::kAlive &&
      now - entry.last_heartbeat > config_.heartbeat_timeout) {
    entry.state = WorkerState::kDead;
    entry.state_reason = absl::StrCat("no heartbeat for ",
                                      absl::FormatDuration(now - entry.last_heartbeat),
                                      " (timeout ",
                                      absl::FormatDuration(config_.heartbeat_timeout), ")");
    newly_dead_.push_back(entry);
  }
}

void WorkerRegistry::ForgetLocked(absl::Time now) {
  if (config_.forget_after <= absl::ZeroDuration()) return;
  while (!replaced_.empty() && now - replaced_.front().first >= config_.forget_after) {
    incarnation_host_.erase(replaced_.front().second);
    replaced_.pop_front();
  }
  for (auto it = by_host_.begin(); it != by_host_.end();) {
    if (it->second.state != WorkerState::kAlive &&
        now - it->second.last_heartbeat >= config_.forget_after) {
      incarnation_host_.erase(it->second.info.incarnation);
      ReleaseAddressLocked(it->second.info.address, it->first);
      it = by_host_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<WorkerEntry> WorkerRegistry::ExpireOverdue() {
  absl::MutexLock lock(&mu_);
  ExpireOverdueLocked();
  std::vector<WorkerEntry> dead;
  dead.swap(newly_dead_);
  return dead;
}

void WorkerRegistry::ReleaseAddressLocked(const std::string& address, const std::string& host) {
  if (auto owner = address_owner_.find(address);
      owner != address_owner_.end() && owner->second == host) {
    address_owner_.erase(owner);
  }
}

std::vector<WorkerEntry> WorkerRegistry::List() {
  absl::MutexLock lock(&mu_);
  ExpireOverdueLocked();
  std::vector<WorkerEntry> entries;
  entries.reserve(by_host_.size());
  for (const auto& [host, entry] : by_host_) entries.push_back(entry);
  // Grouped by slice, then hosts in natural order (worker-2 before worker-10).
  std::stable_sort(entries.begin(), entries.end(), [](const WorkerEntry& a, const WorkerEntry& b) {
    if (a.info.slice_id != b.info.slice_id) return a.info.slice_id < b.info.slice_id;
    return NaturalLess(a.info.host, b.info.host);
  });
  return entries;
}

std::vector<std::pair<std::string, std::string>> WorkerRegistry::AliveAddresses() {
  absl::MutexLock lock(&mu_);
  ExpireOverdueLocked();
  std::vector<std::pair<std::string, std::string>> alive;
  for (const auto& [host, entry] : by_host_) {
    if (entry.state == WorkerState::kAlive) alive.emplace_back(host, entry.info.address);
  }
  return alive;
}

}  // namespace meshrun::coordinator
