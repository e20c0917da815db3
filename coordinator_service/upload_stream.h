// UploadTelemetry's server side: one reactor per worker's telemetry stream. Each host summary is
// fenced (the caller must be the summary's host, a member of its job) and combined; it is
// acknowledged with the host's persisted step once committed, mostly when its step is (through
// the stream's ack route, CoordinatorTelemetry::RouteAcks). One ack write is in flight at a
// time; newer acks of a job replace older queued ones, so a slow reader costs nothing but
// coalesced acks. Acks still owed when the stream ends are not sent: the worker resends those
// summaries on its next stream.
//
// Lifetime: `telemetry` and `membership` must outlive every reactor (the coordinator drains its
// server before destroying them). Thread-safety: gRPC's callbacks may run concurrently; the
// reactor serializes them.
#pragma once

#include <grpcpp/grpcpp.h>

#include "coordinator/coordinator_telemetry.h"
#include "coordinator_service/job_membership.h"
#include "meshrun/v1/coordinator.pb.h"
#include "rpc/identity_slots.h"

namespace meshrun::services {

// `slot` counts the stream against --max_upload_streams; refused, the stream ends at once with
// its RESOURCE_EXHAUSTED. A summary the fence or the history refuses ends the stream with that
// error.
grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* StartUploadStream(
    CoordinatorTelemetry* telemetry, const JobMembership* membership,
    grpc::CallbackServerContext* context, absl::StatusOr<IdentitySlots::Slot> slot);

}  // namespace meshrun::services
