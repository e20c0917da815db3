// WatchTelemetry's and WatchTelemetryBatches' server side on raw bytes (the methods are
// registered as raw callback methods): one reactor per watcher, fed from the watch hub's
// bounded per-watcher queue.
//
// Each summary a watcher without a names filter receives is written as the bytes the hub
// serialized once when it was published (telemetry::Watcher::PopResult::serialized), wrapped
// in a grpc::Slice that shares them: a fan-out to N watchers serializes and copies nothing
// per watcher. History rows and filtered summaries are serialized per watcher. A batched
// stream frames what is queued for it as one GlobalSummaryBatch (the shared bytes copied once
// into the message): a reader that is behind pays a share of one write per summary instead of
// a whole write. (Writes carry no buffer hint: a hinted write may wait for a later one to flush
// it, and a watcher with one write in flight would then stall.)
//
// Ordering, no gap / no duplicate and the slow-watcher policy are the hub's (watch_hub.h); the
// stream ends with the watcher's end status (RESOURCE_EXHAUSTED names the step to resume from).
//
// Lifetime: the hub must outlive every reactor (the coordinator drains its server before
// destroying the hub). Thread-safety: gRPC and the hub's notifier thread call in concurrently;
// the reactor serializes them.
#pragma once

#include <grpcpp/grpcpp.h>

#include "rpc/identity_slots.h"
#include "rpc/security_policy.h"
#include "telemetry/watch_hub.h"

namespace meshrun::services {

enum class WatchFraming {
  kOnePerMessage,  // WatchTelemetry: a GlobalSummary per message
  kBatches,        // WatchTelemetryBatches: a GlobalSummaryBatch of what is queued
};

// Parses `request` (a WatchTelemetryRequest) and subscribes; a bad request or a refused
// subscription ends the stream at once with the reason (INVALID_ARGUMENT unparsable request or
// empty job_id; the hub's Subscribe errors; `slot`'s error: RESOURCE_EXHAUSTED past
// --max_watch_streams). The stream holds `slot` until it ends. Before each write it runs
// `recheck` (rpc/tls_credentials.h RecheckCaller): once the bearer token that opened the stream
// is revoked, the stream ends with that error (UNAUTHENTICATED) instead of delivering more.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartWatchStream(
    telemetry::WatchHub& hub, const grpc::ByteBuffer& request,
    absl::StatusOr<IdentitySlots::Slot> slot, WatchFraming framing, TokenRecheck recheck = {});

}  // namespace meshrun::services
