#include "telemetry/watch_hub.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::telemetry {
// ---------------------------------------------------------------------------------------------
// Watcher

Watcher::Watcher(HistoryStore* history, std::string job_id, int64_t since_step,
                 std::vector<std::string> names, bool host_detail, size_t capacity,
                 size_t batch)
    : history_(history),
      job_id_(std::move(job_id)),
      names_(std::move(names)),
      name_set_(names_.begin(), names_.end()),
      host_detail_(host_detail),
      capacity_(capacity),
      batch_(batch),
      next_step_(since_step) {}

Watcher::~Watcher() = default;

void Watcher::Shape(v1::GlobalSummary& summary) const {
  if (!host_detail_) summary.clear_host_detail();
  FilterValues(name_set_, *summary.mutable_values());
  for (v1::HostSummary& host : *summary.mutable_host_detail()) {
    FilterValues(name_set_, *host.mutable_values());
  }
}

Watcher::PopResult Watcher::TakeLiveLocked() {
  // A queued rewind event is always due (Rewind queues only those that are).
  while (!live_.empty() && !live_.front().summary->has_rewind() &&
         live_.front().summary->step() < next_step_) {
    live_.pop_front();
  }
  if (!live_.empty()) {
    PopResult result{Kind::kItem, std::move(live_.front().summary), absl::OkStatus(),
                     std::move(live_.front().serialized)};
    live_.pop_front();
    next_step_ = result.summary->step() + 1;
    return result;
  }
  if (ended_) {
    final_ = true;
    final_status_ = end_status_;
    return PopResult{Kind::kEnd, {}, final_status_};
  }
  armed_ = true;
  return PopResult{};
}

Watcher::PopResult Watcher::ShapeLive(PopResult result) const {
  if (result.kind == Kind::kItem && !names_.empty()) {  // copied and filtered outside mu_
    auto shaped = std::make_shared<v1::GlobalSummary>(*result.summary);
    Shape(*shaped);
    result.summary = std::move(shaped);
    result.serialized = nullptr;  // the shared bytes are the unfiltered summary
  }
  return result;
}

Watcher::PopResult Watcher::TryPop() {
  {
    // Live with the history delivered (the usual case): no history read can be due, so the
    // consumer lock is not needed.
    absl::MutexLock l(&mu_);
    if (final_) return PopResult{Kind::kEnd, {}, final_status_};
    if (mode_ == Mode::kLive && backfill_.empty()) return ShapeLive(TakeLiveLocked());
  }
  absl::MutexLock consumer(&pop_mu_);
  while (true) {
    int64_t from = 0;
    uint64_t rewinds_before = 0;
    std::optional<PopResult> live;
    {
      absl::MutexLock l(&mu_);
      if (final_) return PopResult{Kind::kEnd, {}, final_status_};
      if (!backfill_.empty()) {
        v1::GlobalSummary row = std::move(backfill_.front());
        backfill_.pop_front();
        next_step_ = row.step() + 1;
        Shape(row);
        return PopResult{Kind::kItem, std::make_shared<const v1::GlobalSummary>(std::move(row)),
                         absl::OkStatus()};
      }
      if (mode_ == Mode::kLive) {
        live = TakeLiveLocked();
      } else {
        from = next_step_;
        rewinds_before = rewinds_;
      }
    }
    if (live.has_value()) return ShapeLive(std::move(*live));
    // Backfilling: read one batch of history without holding mu_, so Publish never waits.
    HistoryStore::ReadRequest request;
    request.job_id = job_id_;
    request.since_step = from;
    request.limit = static_cast<int>(batch_);
    request.host_detail = host_detail_;
    absl::StatusOr<std::vector<v1::GlobalSummary>> rows = history_->Read(request);
    absl::MutexLock l(&mu_);
    if (final_) continue;
    if (rewinds_ != rewinds_before) continue;  // the rows may predate the rewind: read again
    if (!rows.ok()) {
      if (rows.status().code() != absl::StatusCode::kNotFound) {
        AbortLocked(rows.status());
        continue;
      }
      rows = std::vector<v1::GlobalSummary>();  // a job open in the hub with no history yet
    }
    // History holds every summary published before this read began (the read began after
    // registration); the live queue holds every one published after registration. So once
    // history is exhausted, or reaches the oldest queued live step, the live queue continues
    // it seamlessly.
    const bool reached_live =
        rows->size() < batch_ ||
        (!live_.empty() && !rows->empty() && rows->back().step() >= live_.front().summary->step());
    for (v1::GlobalSummary& row : *rows) backfill_.push_back(std::move(row));
    if (reached_live) mode_ = Mode::kLive;
  }
}

Watcher::PopResult Watcher::Pop(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    PopResult result = TryPop();
    if (result.kind != Kind::kEmpty) return result;
    absl::MutexLock l(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(this, &Watcher::NotArmed), deadline)) {
      return PopResult{};
    }
  }
}

void Watcher::SetNotify(std::function<void()> notify) {
  absl::MutexLock l(&notify_mu_);
  notify_ = std::move(notify);
}

void Watcher::Notify() {
  absl::MutexLock l(&notify_mu_);
  if (notify_) notify_();
}

bool Watcher::FireLocked() {
  if (!armed_) return false;
  armed_ = false;
  return true;
}

void Watcher::AbortLocked(absl::Status status) {
  final_ = true;
  final_status_ = std::move(status);
  live_.clear();
  backfill_.clear();
}

void Watcher::Close() {
  bool notify = false;
  {
    absl::MutexLock l(&mu_);
    if (final_ || ended_) return;
    if (mode_ == Mode::kBackfill) {
      final_ = true;  // still reading history: stop here
      final_status_ = absl::OkStatus();
      live_.clear();
      backfill_.clear();
    } else {
      ended_ = true;
      end_status_ = absl::OkStatus();
    }
    notify = FireLocked();
  }
  if (notify) Notify();
}

int64_t Watcher::resume_step() const {
  absl::MutexLock l(&mu_);
  return next_step_;
}

bool Watcher::closed() const {
  absl::MutexLock l(&mu_);
  return final_ || ended_;
}

bool Watcher::Push(const Shared& full, const Shared& no_detail, bool* closed) {
  absl::MutexLock l(&mu_);
  *closed = final_ || ended_;
  if (*closed) return false;
  if (live_.size() >= capacity_) {
    AbortLocked(absl::ResourceExhaustedError(absl::StrCat(
        "watcher of job ", job_id_, " fell behind (more than ", capacity_,
        " summaries queued); resume with since_step=", next_step_)));
    return FireLocked();
  }
  live_.push_back(host_detail_ ? full : no_detail);
  return FireLocked();
}

bool Watcher::Rewind(const Shared& event) {
  absl::MutexLock l(&mu_);
  if (final_ || ended_) return false;
  ++rewinds_;
  const int64_t step = event.summary->step();
  // Queued summaries after `step` are the ended run's, not delivered yet: they go.
  while (!live_.empty() && live_.back().summary->step() > step) live_.pop_back();
  while (!backfill_.empty() && backfill_.back().step() > step) backfill_.pop_back();
  // Told once it has delivered `step`: a restart that lost no step is still an event.
  if (next_step_ <= step) return false;
  if (mode_ == Mode::kLive) {
    live_.push_back(event);
  } else {  // next in line: the backfill delivers it first and goes on from step + 1
    backfill_.push_front(*event.summary);
  }
  return FireLocked();
}

bool Watcher::End(absl::Status status) {
  absl::MutexLock l(&mu_);
  if (final_ || ended_) return false;
  ended_ = true;
  end_status_ = std::move(status);
  return FireLocked();
}

bool Watcher::Abort(absl::Status status) {
  absl::MutexLock l(&mu_);
  if (final_) return false;
  AbortLocked(std::move(status));
  return FireLocked();
}

// ---------------------------------------------------------------------------------------------
// WatchHub

absl::StatusOr<std::unique_ptr<WatchHub>> WatchHub::Create(Config config) {
  if (config.history == nullptr) return absl::InvalidArgumentError("WatchHub: history is null");
  if (config.watcher_capacity == 0) {
    return absl::InvalidArgumentError("WatchHub: watcher_capacity must be >= 1");
  }
  if (config.backfill_batch == 0) {
    return absl::InvalidArgumentError("WatchHub: backfill_batch must be >= 1");
  }
  std::unique_ptr<WatchHub> hub(new WatchHub(config));
  hub->notifier_ = std::thread([hub = hub.get()] { hub->NotifyLoop(); });
  return hub;
}

WatchHub::~WatchHub() {
  std::vector<std::shared_ptr<Watcher>> notify;
  {
    absl::MutexLock l(&mu_);
    for (auto& [job_id, job] : jobs_) {
      for (const std::weak_ptr<Watcher>& weak : job.watchers) {
        if (std::shared_ptr<Watcher> watcher = weak.lock()) {
          if (watcher->Abort(absl::UnavailableError(absl::StrCat(
                  "telemetry of job ", job_id, " is shutting down; resume with since_step=",
                  watcher->resume_step())))) {
            notify.push_back(std::move(watcher));
          }
        }
      }
    }
    jobs_.clear();
  }
  Wake(std::move(notify));
  {
    absl::MutexLock l(&wake_mu_);
    stop_ = true;
  }
  notifier_.join();  // after it ran every callback queued
}

void WatchHub::Wake(std::vector<std::shared_ptr<Watcher>> watchers) {
  if (watchers.empty()) return;
  absl::MutexLock l(&wake_mu_);
  queued_ += watchers.size();
  if (wake_.empty()) {
    wake_ = std::move(watchers);
  } else {
    for (auto& watcher : watchers) wake_.push_back(std::move(watcher));
  }
}

void WatchHub::NotifyLoop() {
  std::vector<std::shared_ptr<Watcher>> batch;
  while (true) {
    {
      absl::MutexLock l(&wake_mu_);
      notified_ += batch.size();
      batch.clear();  // drops the references before the next wait
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) {
        return stop_ || !wake_.empty();
      };
      wake_mu_.Await(absl::Condition(&ready));
      if (wake_.empty()) return;  // stopping, and nothing left to run
      batch.swap(wake_);
    }
    for (const auto& watcher : batch) watcher->Notify();
  }
}

void WatchHub::FlushNotifications() {
  absl::MutexLock l(&wake_mu_);
  const uint64_t target = queued_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) {
    return notified_ >= target;
  };
  wake_mu_.Await(absl::Condition(&done));
}

absl::Status WatchHub::OpenJob(const std::string& job_id, std::vector<std::string> series) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock l(&mu_);
  if (jobs_.count(job_id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("telemetry of job ", job_id, " is already open"));
  }
  Job& job = jobs_[job_id];
  job.series.insert(series.begin(), series.end());
  return absl::OkStatus();
}

absl::Status WatchHub::Publish(v1::GlobalSummary summary) {
  // One immutable copy per variant, and its wire bytes, shared by every watcher without a
  // names filter: a fan-out to N watchers serializes each variant once, not N times. The
  // host summaries are moved, never copied: a step of 1024 hosts holds 1024 of them.
  Watcher::Shared no_detail;
  if (summary.host_detail_size() > 0) {
    google::protobuf::RepeatedPtrField<v1::HostSummary> hosts;
    hosts.Swap(summary.mutable_host_detail());
    no_detail.summary = std::make_shared<const v1::GlobalSummary>(summary);
    no_detail.serialized =
        std::make_shared<const std::string>(no_detail.summary->SerializeAsString());
    summary.mutable_host_detail()->Swap(&hosts);
  }
  Watcher::Shared full{std::make_shared<const v1::GlobalSummary>(std::move(summary)), nullptr};
  full.serialized = std::make_shared<const std::string>(full.summary->SerializeAsString());
  if (no_detail.summary == nullptr) no_detail = full;
  const v1::GlobalSummary& published = *full.summary;
  std::vector<std::shared_ptr<Watcher>> notify;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(published.job_id());
    if (it == jobs_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("telemetry of job ", published.job_id(), " is not open"));
    }
    Job& job = it->second;
    if (published.step() <= job.last_published) {
      return absl::InvalidArgumentError(absl::StrCat("step ", published.step(), " of job ",
                                                     published.job_id(),
                                                     " is not above the last published step ",
                                                     job.last_published));
    }
    job.last_published = published.step();
    auto& watchers = job.watchers;
    size_t kept = 0;
    for (size_t i = 0; i < watchers.size(); ++i) {
      std::shared_ptr<Watcher> watcher = watchers[i].lock();
      if (watcher == nullptr) continue;  // dropped: forget it
      bool closed = false;
      const bool wake = watcher->Push(full, no_detail, &closed);
      if (closed) continue;  // closed: forget it
      if (wake) notify.push_back(std::move(watcher));
      watchers[kept++] = watchers[i];
      // The notifier starts writing to the first watchers while the rest are queued to: with
      // a few hundred, waking it only at the end delayed every write by the whole loop.
      if (notify.size() == kWakeChunk) Wake(std::exchange(notify, {}));
    }
    watchers.resize(kept);
  }
  Wake(std::move(notify));
  return absl::OkStatus();
}

absl::Status WatchHub::Rewind(const std::string& job_id, int64_t step, v1::JobRewind rewind) {
  auto event = std::make_shared<v1::GlobalSummary>();
  event->set_job_id(job_id);
  event->set_step(step);
  *event->mutable_rewind() = std::move(rewind);
  Watcher::Shared shared{event, std::make_shared<const std::string>(event->SerializeAsString())};
  std::vector<std::shared_ptr<Watcher>> notify;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("telemetry of job ", job_id, " is not open"));
    }
    it->second.last_published = std::min(it->second.last_published, step);
    for (const std::weak_ptr<Watcher>& weak : it->second.watchers) {
      std::shared_ptr<Watcher> watcher = weak.lock();
      if (watcher != nullptr && watcher->Rewind(shared)) notify.push_back(watcher);
    }
  }
  Wake(std::move(notify));
  return absl::OkStatus();
}

absl::Status WatchHub::EndJob(const std::string& job_id) {
  std::vector<std::shared_ptr<Watcher>> notify;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("telemetry of job ", job_id, " is not open"));
    }
    for (const std::weak_ptr<Watcher>& weak : it->second.watchers) {
      if (std::shared_ptr<Watcher> watcher = weak.lock()) {
        if (watcher->End(absl::OkStatus())) notify.push_back(std::move(watcher));
      }
    }
    jobs_.erase(it);
  }
  Wake(std::move(notify));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Watcher>> WatchHub::Subscribe(const SubscribeRequest& request) {
  if (request.since_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("since_step ", request.since_step, " is negative"));
  }
  // History first, without the hub lock (Publish must never wait on SQLite).
  bool in_history = true;
  int64_t history_latest = 0;
  std::set<std::string> series;
  absl::StatusOr<int64_t> latest = config_.history->LatestStep(request.job_id);
  if (latest.ok()) {
    history_latest = *latest;
    ASSIGN_OR_RETURN(auto declared, config_.history->Series(request.job_id));
    for (const v1::TelemetryDeclaration& decl : declared) series.insert(decl.name());
  } else if (latest.status().code() == absl::StatusCode::kNotFound) {
    in_history = false;
  } else {
    return latest.status();
  }

  std::shared_ptr<Watcher> watcher;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(request.job_id);
    const bool open = it != jobs_.end();
    if (!open && !in_history) {
      return absl::NotFoundError(
          absl::StrCat("job \"", request.job_id, "\" has no telemetry (not running, no history)"));
    }
    int64_t newest = history_latest;
    if (open) {
      newest = std::max(newest, it->second.last_published);
      series.insert(it->second.series.begin(), it->second.series.end());
    }
    if (request.since_step > newest + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "since_step ", request.since_step, " is beyond the latest step ", newest, " of job ",
          request.job_id, "; use at most ", newest + 1));
    }
    for (const std::string& name : request.names) {
      if (series.count(name) == 0) {
        return UnknownSeriesError(name, request.job_id, {series.begin(), series.end()});
      }
    }
    watcher.reset(new Watcher(config_.history, request.job_id, request.since_step,
                              request.names, request.host_detail, config_.watcher_capacity,
                              config_.backfill_batch));
    if (open && !request.history_only) {
      it->second.watchers.push_back(watcher);
    } else {
      (void)watcher->End(absl::OkStatus());  // history only: backfill, then end of stream
    }
  }
  return watcher;
}

int WatchHub::WatcherCount(const std::string& job_id) const {
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return 0;
  int count = 0;
  for (const std::weak_ptr<Watcher>& weak : it->second.watchers) {
    std::shared_ptr<Watcher> watcher = weak.lock();
    if (watcher != nullptr && !watcher->closed()) ++count;
  }
  return count;
}

}  // namespace meshrun::telemetry
