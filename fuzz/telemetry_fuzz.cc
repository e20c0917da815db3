// The telemetry combiner and the history store's input (telemetry/step_combiner.h,
// telemetry/history_store.h) on any host reports. The input is a serialized
// meshrun.v1.GlobalSummary: each of its host_detail entries is one host's report, added to a
// combiner set up with the example job's declared telemetry and two hosts, and stored with
// HistoryStore::AppendHost; the summary itself goes to HistoryStore::Append, as do the
// combined summaries the combiner emits (its grace ended by a fake clock). Seeds: reports of
// steps 1-3 with every example series at its declared shape. Property: no crash, refusals are
// INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/clock.h"
#include "fuzz/fuzz_support.h"
#include "bundle/job_bundle.h"
#include "telemetry/history_store.h"
#include "telemetry/step_combiner.h"

namespace {
using namespace meshrun;

struct State {
  FakeClock clock;
  std::vector<v1::TelemetryDeclaration> declarations;
  std::unique_ptr<telemetry::HistoryStore> history;
  std::vector<v1::GlobalSummary> emitted;  // by the combiner's sink, stored after each input
};
State* state = nullptr;

constexpr absl::StatusCode kRefusals[] = {absl::StatusCode::kInvalidArgument,
                                          absl::StatusCode::kNotFound,
                                          absl::StatusCode::kFailedPrecondition};

void Expect(const absl::Status& status, const char* what) {
  fuzz::ExpectDocumentedError(status, what, {kRefusals[0], kRefusals[1], kRefusals[2]});
}

v1::GlobalSummary Seed(int64_t steps, bool second_host) {
  v1::GlobalSummary out;
  out.set_job_id("fuzz-job");
  out.set_step(steps);
  for (int64_t step = 1; step <= steps; ++step) {
    for (const char* host : {"host-a", "host-b"}) {
      if (!second_host && std::string(host) == "host-b") continue;
      v1::HostSummary* h = out.add_host_detail();
      h->set_job_id("fuzz-job");
      h->set_step(step);
      h->set_host(host);
      h->set_replica_count(1);
      h->set_step_time_seconds(0.25);
      for (const v1::TelemetryDeclaration& d : state->declarations) {
        v1::TelemetryValue* v = h->add_values();
        v->set_name(d.name());
        int64_t n = 1;
        for (int64_t dim : d.shape()) {
          v->add_shape(dim);
          n *= dim;
        }
        for (int64_t i = 0; i < n && i < 4096; ++i) v->add_values(0.5f * float(i) + float(step));
      }
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::QuietLogs();
  state = new State;
  for (const std::string& bundle : fuzz::ExampleBundles()) {
    if (bundle.find("transformer_lm/dp1/") == std::string::npos) continue;
    absl::StatusOr<v1::JobSpec> spec = client::JobSpecFromBundle(bundle, {});
    if (spec.ok()) state->declarations.assign(spec->telemetry().begin(), spec->telemetry().end());
  }
  if (state->declarations.empty()) {  // examples absent: the loss alone
    v1::TelemetryDeclaration loss;
    loss.set_name("loss");
    loss.set_combine(v1::COMBINE_MEAN);
    state->declarations.push_back(loss);
  }
  fuzz::MaybeWriteSeeds({Seed(1, false).SerializeAsString(), Seed(3, true).SerializeAsString()});
  auto history = telemetry::HistoryStore::Create({.path = fuzz::ScratchDir("history") + "/h.db",
                                                  .synchronous_full = false,
                                                  .max_steps_per_job = 64,
                                                  .clock = &state->clock});
  if (!history.ok()) __builtin_trap();
  state->history = std::move(*history);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::GlobalSummary input;
  if (!input.ParseFromArray(data, static_cast<int>(size))) return -1;
  auto combiner = telemetry::StepCombiner::Create(
      {.grace = absl::Seconds(5),
       .max_pending_steps = 8,
       .clock = &state->clock,
       .sink = [](v1::GlobalSummary s) { state->emitted.push_back(std::move(s)); }});
  if (!combiner.ok()) __builtin_trap();
  const std::string job = input.job_id();
  Expect((*combiner)->StartJob({.job_id = job,
                                .hosts = {{"host-a", 1}, {"host-b", 1}},
                                .declarations = state->declarations}),
         "StepCombiner::StartJob");
  for (const v1::HostSummary& host : input.host_detail()) {
    Expect((*combiner)->Add(host).status(), "StepCombiner::Add");
    Expect(state->history->AppendHost(host).status(), "HistoryStore::AppendHost");
    (*combiner)->Poll();
  }
  state->clock.Advance(absl::Seconds(6));  // every pending step's grace ends
  (*combiner)->Poll();
  Expect((*combiner)->AbandonJob(job).status(), "StepCombiner::AbandonJob");
  Expect(state->history->Append(input), "HistoryStore::Append");
  for (const v1::GlobalSummary& s : state->emitted) {
    Expect(state->history->Append(s), "HistoryStore::Append (combined)");
  }
  state->emitted.clear();
  if (!job.empty()) {
    Expect(state->history->Read({.job_id = job}).status(), "HistoryStore::Read");
  }
  Expect(state->history->Prune().status(), "HistoryStore::Prune");
  return 0;
}
