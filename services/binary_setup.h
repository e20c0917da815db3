// Start-up shared by the three binaries: blocks SIGTERM/SIGINT (they are awaited with
// WaitForTerminationSignal), parses flags with --help limited to meshrun's own, and sets up
// logging from --log_level. Bad flags print one line naming the problem and exit 2.
//
// Call first thing in main, before any thread starts. Returns the positional arguments
// (argv[0] first).
#pragma once

#include <string>
#include <vector>

namespace meshrun::services {

std::vector<std::string> InitBinary(const char* program, const char* usage, int argc,
                                    char** argv);

// Prints "<program>: error: <message>" on stderr and exits with `code`.
[[noreturn]] void ExitWithError(const std::string& message, int code);

}  // namespace meshrun::services
