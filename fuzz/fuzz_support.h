// Shared pieces of the libFuzzer targets in fuzz/ (scripts/fuzz.sh, docs/fuzzing.md): scratch
// directories, the example bundles the seeds come from, and the seed-writing mode.
//
// Seeds are derived from examples/ when a target starts with MESHRUN_FUZZ_SEEDS=<dir>: it
// writes one file per seed there and exits, so the seed corpus always matches the checked-in
// examples. Regression inputs of fixed crashes live in fuzz/regressions/<target>/.
//
// Thread-safety: call from LLVMFuzzerInitialize / LLVMFuzzerTestOneInput (one thread).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace meshrun::fuzz {

// A fresh empty directory <TMPDIR>/meshrun-fuzz-<pid>/<name>, removed when the process exits.
std::string ScratchDir(const std::string& name);

// Every examples/*/*/job.json of the source tree, sorted.
std::vector<std::string> ExampleBundles();

// Writes (or replaces) a whole file; aborts when it cannot (the fuzzer's own setup failed).
void WriteFile(const std::string& path, absl::string_view bytes);

// When MESHRUN_FUZZ_SEEDS names a directory: writes seeds[i] to <dir>/seed-<i> and exits 0.
// Otherwise does nothing. Aborts when there is no seed (the examples are missing).
void MaybeWriteSeeds(const std::vector<std::string>& seeds);

// Silences logging: the targets reject most inputs, and the log would drown libFuzzer's.
void QuietLogs();

// The property every target checks: a refusal is one of the codes the API documents, never
// INTERNAL/UNKNOWN. Aborts (a crash libFuzzer reports) naming `what` otherwise.
void ExpectDocumentedError(const absl::Status& status, const char* what,
                           std::initializer_list<absl::StatusCode> allowed);

}  // namespace meshrun::fuzz
