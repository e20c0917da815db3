// `meshrun certs ...`: the cluster CA, certificates and bearer tokens (rpc/cert_authority.h).
#pragma once

#include <string>
#include <vector>

namespace meshrun::services {

// args: the CLI's positional arguments ("meshrun", "certs", sub-command...). Returns the exit code.
int RunCertsCommand(const std::vector<std::string>& args);

}  // namespace meshrun::services
