// The directories a server may open files in on a client's behalf (--data_root): a path a
// client names (token shards, an example bundle, a checkpoint directory) is used only when,
// with symlinks and ".." resolved, it lies under one of them.
//
// Thread-safety: immutable after Create; safe to share.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun {

class PathRoots {
 public:
  // `roots`: absolute paths of existing directories (duplicates and empty entries ignored);
  // `flag` names where they came from in errors ("--data_root").
  // Errors: INVALID_ARGUMENT (a relative path, or not a directory), naming it and the flag.
  static absl::StatusOr<PathRoots> Create(const std::vector<std::string>& roots,
                                          const std::string& flag = "--data_root");

  // Comma-separated roots (a flag's value) plus `always` (e.g. the state directory).
  static absl::StatusOr<PathRoots> FromFlag(const std::string& comma_separated,
                                            const std::vector<std::string>& always,
                                            const std::string& flag = "--data_root");

  // The canonical form of `path` (which need not exist yet: its longest existing prefix is
  // resolved) when it lies under a root. `field` names the path in errors.
  // Errors: INVALID_ARGUMENT "<field> \"<path>\" is not an absolute path" or "... is outside the
  // directories this server reads (<roots>); put it under one of them or start the server with
  // <flag>=<a directory holding it>".
  absl::StatusOr<std::string> Resolve(const std::string& path, const std::string& field) const;

  // A glob pattern: its directory part before the first wildcard must resolve under a root and
  // the rest must not climb out with "..". Errors: as Resolve, naming the whole pattern.
  absl::Status CheckGlob(const std::string& pattern, const std::string& field) const;

  const std::vector<std::string>& roots() const { return roots_; }

 private:
  // Resolve, naming `shown` (what the client wrote, e.g. a whole glob) in errors.
  absl::StatusOr<std::string> ResolveAs(const std::string& path, const std::string& field,
                                        const std::string& shown) const;

  std::vector<std::string> roots_;  // canonical
  std::string flag_;
};

}  // namespace meshrun
