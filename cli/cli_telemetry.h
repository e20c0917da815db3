// `meshrun watch <job>` (live telemetry with sparklines; --since_step, --series) and
// `meshrun export <job>` (the history as csv, jsonl or a TensorBoard event file; --format,
// --out, --since_step, --series). With --output=json, watch prints one summary per line and
// export writes JSON lines.
#pragma once

#include <string>
#include <vector>

namespace meshrun::services {

// args: the CLI's positional arguments ("meshrun", command, job id). Return the exit code;
// usage errors, failed calls and write errors end the process (cli_common.h's codes).
int Watch(const std::vector<std::string>& args);
int Export(const std::vector<std::string>& args);

}  // namespace meshrun::services
