// A scratch folder for one test process, under gtest's TempDir. Header-only; tests only.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace meshrun::testing {

// Empties and creates TempDir()/<name>_<pid>, and returns its path. Emptied because an earlier
// process with the same pid may have left one: a coordinator state folder reused from it holds
// that run's jobs. Call it once per process and keep the path (a function-local static), since
// a second call empties the folder again.
inline std::string FreshScratchDir(const std::string& name) {
  std::string path = absl::StrCat(::testing::TempDir(), "/", name, "_", getpid());
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path;
}

}  // namespace meshrun::testing
