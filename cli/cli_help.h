// The meshrun command's help: one entry per command (its synopsis, what it does, the flags it
// reads), from which the global usage, `meshrun help <command>` and `meshrun <command> --help`
// are all printed. Pure functions over a static table; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace meshrun::services {

// The usage absl prints for a bad flag, and `meshrun help`: every command, one line each.
const char* GlobalUsage();

// "health, workers, submit, ...": every command's name, for errors.
std::string CommandList();

// When argv asks for help (`meshrun help [command]`, or `--help`/`-h` anywhere; `--helpfull`
// is left to absl: every flag),
// prints it to stdout and returns the exit code (0; 2 for an unknown command, naming the known
// ones). Returns -1 when argv does not ask for help. Reads the flags' help and defaults from
// absl's registry, so call it after every flag is linked in (from main).
int MaybePrintHelp(int argc, char** argv);

}  // namespace meshrun::services
