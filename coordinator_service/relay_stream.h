// RelayTelemetry's server side (docs/scale.md, "Telemetry relays"): one reactor per relay's
// stream. A batch's summaries are taken one by one as UploadTelemetry takes a summary, after
// checking that the caller is the relay the job names for each summary's host
// (JobMembership::CheckRelayed). Acks name their host and go out together: whatever is due when
// the last write ends goes in the next, one write in flight. A refused summary is answered by
// an ack carrying the refusal for its host; the stream goes on for the other hosts.
//
// Lifetime: `telemetry` and `membership` must outlive every reactor (the coordinator drains its
// server before destroying them). Thread-safety: gRPC's callbacks may run concurrently; the
// reactor serializes them.
#pragma once

#include <grpcpp/grpcpp.h>

#include "coordinator/coordinator_telemetry.h"
#include "coordinator_service/job_membership.h"
#include "meshrun/v1/telemetry.pb.h"
#include "rpc/identity_slots.h"

namespace meshrun::services {

// `slot` counts the stream against --max_upload_streams; refused, the stream ends at once with
// its RESOURCE_EXHAUSTED.
grpc::ServerBidiReactor<v1::HostSummaryBatch, v1::UploadTelemetryAckBatch>* StartRelayStream(
    CoordinatorTelemetry* telemetry, const JobMembership* membership,
    grpc::CallbackServerContext* context, absl::StatusOr<IdentitySlots::Slot> slot);

}  // namespace meshrun::services
