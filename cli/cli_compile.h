// `meshrun compile <bundle> --target=v6e-8`: compiles a job's programs for a TPU slice on any
// machine with libtpu installed (no cluster, no TPU), and prints what each program needs of a
// device, its FLOPs per step, the executable's size and the compile time (docs/pjrt.md).
#pragma once

#include <string>
#include <vector>

namespace meshrun::services {

// Exit status: 0 every program fits, 1 one does not (its bytes and the chip's named) or the
// compile failed, 2 a usage error.
int RunCompileCommand(const std::vector<std::string>& args);

}  // namespace meshrun::services
