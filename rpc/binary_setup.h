// Start-up shared by the three binaries: turns abseil's mutex deadlock detector off
// (common/mutex_checks.h), blocks SIGTERM/SIGINT (they are awaited with
// WaitForTerminationSignal), parses flags with --help limited to meshrun's own, and sets up
// logging from --log_level. Bad flags print one line naming the problem and exit 2.
// The two servers (any `program` but "meshrun") also narrow the process umask to at least
// 0077, so everything they create (state directories, the executable store and cache, the
// telemetry database, checkpoints) is private to their user: directories 0700, files 0600
// (docs/security.md, "File modes"). The CLI keeps the caller's umask.
//
// Call first thing in main, before any thread starts. Returns the positional arguments
// (argv[0] first).
#pragma once

#include <string>
#include <vector>

namespace meshrun::services {

std::vector<std::string> InitBinary(const char* program, const char* usage, int argc,
                                    char** argv);

// A flag given several times on the command line (`--data_root=a --data_root=b`): every value,
// joined with commas, where absl keeps only the last. `parsed` (the flag's value) is returned
// when the command line holds it at most once (e.g. it came from a --flagfile).
// Call after InitBinary.
std::string RepeatedFlagValues(const std::string& name, const std::string& parsed);

// Prints "<program>: error: <message>" on stderr and exits with `code`.
[[noreturn]] void ExitWithError(const std::string& message, int code);

}  // namespace meshrun::services
