// meshrun-coordinator's limit flags (docs/limits.md), read into CoordinatorLimits.
#pragma once

#include "coordinator_service/coordinator_limits.h"

namespace meshrun::services {

CoordinatorLimits CoordinatorLimitsFromFlags();

}  // namespace meshrun::services
