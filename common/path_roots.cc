#include "common/path_roots.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace meshrun {
namespace fs = std::filesystem;

absl::StatusOr<PathRoots> PathRoots::Create(const std::vector<std::string>& roots,
                                            const std::string& flag) {
  PathRoots out;
  out.flag_ = flag;
  for (const std::string& root : roots) {
    if (root.empty()) continue;
    std::error_code error;
    if (!fs::path(root).is_absolute() || !fs::is_directory(root, error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": \"", root, "\" is not an absolute path of an existing directory"));
    }
    std::string canonical = fs::canonical(root, error).string();
    if (error) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", root, "\": ", error.message()));
    }
    if (std::find(out.roots_.begin(), out.roots_.end(), canonical) == out.roots_.end()) {
      out.roots_.push_back(std::move(canonical));
    }
  }
  return out;
}

absl::StatusOr<PathRoots> PathRoots::FromFlag(const std::string& comma_separated,
                                              const std::vector<std::string>& always,
                                              const std::string& flag) {
  std::vector<std::string> roots = always;
  for (absl::string_view root : absl::StrSplit(comma_separated, ',', absl::SkipEmpty())) {
    roots.emplace_back(root);
  }
  return Create(roots, flag);
}

absl::StatusOr<std::string> PathRoots::Resolve(const std::string& path,
                                               const std::string& field) const {
  return ResolveAs(path, field, path);
}

absl::StatusOr<std::string> PathRoots::ResolveAs(const std::string& path, const std::string& field,
                                                 const std::string& shown) const {
  if (path.empty() || !fs::path(path).is_absolute()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", shown, "\" is not an absolute path"));
  }
  std::error_code error;
  const fs::path resolved = fs::weakly_canonical(path, error);
  if (!error) {
    const std::string s = resolved.string();
    for (const std::string& root : roots_) {
      if (s == root || (s.size() > root.size() && s.compare(0, root.size(), root) == 0 &&
                        (root.back() == '/' || s[root.size()] == '/'))) {
        return s;
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " \"", shown, "\" is outside the directories this server reads (",
      roots_.empty() ? std::string("none") : absl::StrJoin(roots_, ", "),
      "); put it under one of them or start the server with ", flag_,
      "=<a directory holding it>"));
}

absl::Status PathRoots::CheckGlob(const std::string& pattern, const std::string& field) const {
  const size_t wildcard = pattern.find_first_of("*?[");
  for (absl::string_view part : absl::StrSplit(pattern, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", pattern, "\" climbs with \"..\"; name the directory"));
    }
  }
  std::string fixed = pattern.substr(0, wildcard == std::string::npos ? pattern.size() : wildcard);
  if (wildcard != std::string::npos) fixed = fixed.substr(0, fixed.rfind('/') + 1);
  if (fixed.empty()) fixed = pattern;  // relative: Resolve names it
  while (fixed.size() > 1 && fixed.back() == '/') fixed.pop_back();
  return ResolveAs(fixed, field, pattern).status();
}

}  // namespace meshrun
