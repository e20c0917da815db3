// `meshrun workers`: the coordinator's workers, one a line (host, state, address, runtime,
// devices, heartbeat age, notes), filtered by --state, --slice and --on_job and a page at a time
// with --page_size, followed by the matches by slice; --expect waits until that many match
// ALIVE. With --output=json, the ListWorkersResponse.
#pragma once

#include <string>
#include <vector>

namespace meshrun::services {

// args: the CLI's positional arguments ("meshrun", "workers"). Returns the exit code; usage
// errors and failed calls end the process (cli_common.h's codes).
int Workers(const std::vector<std::string>& args);

}  // namespace meshrun::services
