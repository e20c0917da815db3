// Process-wide logging setup on spdlog: one stderr logger whose lines carry the program name.
//
// Call InitLogging once at the top of main, before other threads start. After that, use
// spdlog::info/warn/error (thread-safe). spdlog cannot format absl::string_view: log std::string.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace meshrun {

// `level` is one of trace, debug, info, warn, error, off. Timestamps are UTC (ending in Z).
// `format` "text": "2026-01-02T03:04:05.678Z I program] message"; "json": one JSON object a
// line, {"time", "level", "program", "thread", "message"}, for log pipelines.
// Errors: INVALID_ARGUMENT naming the level or format and the accepted ones.
absl::Status InitLogging(const std::string& program, const std::string& level,
                         const std::string& format = "text");

}  // namespace meshrun
