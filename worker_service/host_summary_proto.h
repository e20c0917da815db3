// A host's step summary as the wire message the uploader sends. Pure; thread-safe.
#pragma once

#include "meshrun/v1/coordinator.pb.h"
#include "worker/step_loop.h"

namespace meshrun::services {

v1::HostSummary ToProto(const worker::HostStepSummary& summary);

}  // namespace meshrun::services
