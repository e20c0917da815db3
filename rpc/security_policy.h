// Who may call what: the logic half of meshrun's access control (no gRPC here; the adapter in
// rpc/tls_credentials.h feeds it the peer's certificate identity and bearer token).
//
// Identities. A certificate names its holder with one URI SAN
//   spiffe://<cluster>/<role>/<name>
// where <role> is `coordinator`, `worker` (and <name> the host it may register as), or a
// person/program role `admin`, `submit` or `view`. A bearer token maps to a role and a name
// through the tokens file (see TokenStore).
//
// Roles: admin > submit > view (each includes the next); `worker` and `coordinator` are service
// identities that include no user role. Methods not in the table need `admin`.
//
// Thread-safety: free functions are pure; TokenStore is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun::services {

// kMetrics: a scrape token's role, good for the HTTP /metrics endpoint only.
enum class Role { kView, kSubmit, kAdmin, kWorker, kCoordinator, kAnyAuthenticated, kMetrics };

std::string RoleName(Role role);
// Parses "view", "submit", "admin", "worker", "coordinator", "metrics".
// Errors: INVALID_ARGUMENT naming the value and the accepted names.
absl::StatusOr<Role> ParseRole(const std::string& name);

struct Identity {
  Role role = Role::kView;
  std::string name;
  std::string source;   // "certificate" or "token"
  std::string peer;     // the caller's address ("ipv4:10.0.0.5:51234"); set by PeerIdentity
  std::string cluster;  // a certificate's <cluster>; empty for a token
};

// Parses "spiffe://<cluster>/<role>/<name>". Errors: INVALID_ARGUMENT saying what is wrong.
absl::StatusOr<Identity> ParseSpiffeId(const std::string& uri);

// OK when a certificate identity belongs to `cluster` (this process's own, from its certificate;
// empty: unknown, nothing to compare). Two clusters may share a CA; a certificate of one is no
// one in the other. Errors: PERMISSION_DENIED naming both clusters and the fix.
absl::Status CheckCluster(const Identity& identity, const std::string& cluster);

// The role a full gRPC method name ("/meshrun.v1.Coordinator/SubmitJob") needs.
Role RequiredRole(const std::string& method);

// OK when `identity` may call `method`. Errors: UNAUTHENTICATED (no identity),
// PERMISSION_DENIED naming the role the method needs and the caller's.
absl::Status Authorize(const std::string& method, const std::optional<Identity>& identity);

// Bearer tokens from a file of lines "<sha256 hex of the token> <role> <name>" ('#' starts a
// comment). Only hashes are stored; lookups compare in constant time. The file is re-read when
// its modification time or size changes (checked at most once per `recheck`), so a removed line
// revokes its token without a restart. A file that is gone (deleted, or no longer readable)
// revokes every token until it is back, logged as an error once; a file that no longer parses
// keeps the last good table, logged as a warning naming the line.
class TokenStore {
 public:
  // Errors: NOT_FOUND / INVALID_ARGUMENT naming the file and line.
  static absl::StatusOr<std::unique_ptr<TokenStore>> Create(const std::string& path,
                                                            absl::Duration recheck);
  // The identity the token grants, or nullopt.
  std::optional<Identity> Lookup(const std::string& token);

  const std::string& path() const { return path_; }

  // Parses the file's text. Errors: INVALID_ARGUMENT naming the line.
  struct Entry {
    std::string sha256_hex;
    Identity identity;
  };
  static absl::StatusOr<std::vector<Entry>> Parse(const std::string& text);

 private:
  TokenStore(std::string path, absl::Duration recheck) : path_(std::move(path)), recheck_(recheck) {}
  absl::Status Reload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecheckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const absl::Duration recheck_;
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t size_ ABSL_GUARDED_BY(mu_) = -1;
  bool missing_ ABSL_GUARDED_BY(mu_) = false;  // the file was gone at the last check
};

// Re-authorizes a long-lived call (a watch stream, an SSE stream) that a bearer token opened,
// so a token removed from the tokens file ends the streams it opened too. A default-made
// TokenRecheck (a certificate identity, or no policy) always passes.
//
// Thread-safety: Check() may be called from any thread. Lifetime: shares the TokenStore.
class TokenRecheck {
 public:
  TokenRecheck() = default;
  // `method`: the gRPC method whose role the caller must still hold (the HTTP side uses
  // ListJobs, its role view). Looks the token up at most once per `every`.
  TokenRecheck(std::shared_ptr<TokenStore> tokens, std::string token, std::string method,
               absl::Duration every = absl::Milliseconds(250));
  TokenRecheck(TokenRecheck&& other) noexcept;
  TokenRecheck& operator=(TokenRecheck&& other) noexcept;

  // Errors: UNAUTHENTICATED when the token is no longer in the tokens file,
  // PERMISSION_DENIED when its role no longer allows `method`.
  absl::Status Check();

 private:
  std::shared_ptr<TokenStore> tokens_;
  std::string token_;
  std::string method_;
  absl::Duration every_ = absl::Milliseconds(250);
  absl::Mutex mu_;
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status last_ ABSL_GUARDED_BY(mu_);
};

// Constant-time equality of two strings of equal length (false when lengths differ).
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace meshrun::services
