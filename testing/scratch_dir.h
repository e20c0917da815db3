// A scratch folder for one test process, under gtest's TempDir. Header-only; tests only.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace meshrun::testing {

// TempDir()/<name>_<pid>, emptied and created on the first call for `name`; later calls return
// the same path. Emptied because an earlier process with the same pid may have left one: a
// coordinator state folder reused from it holds that run's jobs. The caller keeps one static
// copy (thread-safety: call it from a static initializer, as below, or one thread).
inline std::string FreshScratchDir(const std::string& name) {
  std::string path = absl::StrCat(::testing::TempDir(), "/", name, "_", getpid());
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path;
}

}  // namespace meshrun::testing
