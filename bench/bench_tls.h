// Mutual TLS for benches. MakeBenchTls makes a throw-away cluster CA and one certificate under
// `dir` and returns the SecurityConfig that presents it; MaybeEnableTls installs such a config
// as the process's security (rpc/tls_credentials.h) when MESHRUN_BENCH_TLS=1 is in the
// environment, so MakeChannel, StartGrpcServer and MakeServerCredentials all use it.
// Errors: those of CreateClusterCa and IssueCertificate (the directory cannot be written).
// Thread-safety: MaybeEnableTls sets the process's security: call it before any channel or
// server exists.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/cert_authority.h"
#include "rpc/tls_credentials.h"

namespace meshrun::bench {

// `role`: the certificate's role, as the access policy sees the bench's client calls (the
// same certificate serves the bench's servers).
inline absl::StatusOr<services::SecurityConfig> MakeBenchTls(const std::string& dir,
                                                             const std::string& role) {
  const std::string ca = dir + "/tls-ca";
  if (absl::Status s = services::CreateClusterCa(ca, "bench", 1); !s.ok()) return s;
  auto id = services::IssueCertificate({.ca_dir = ca, .role = role, .name = "bench"});
  if (!id.ok()) return id.status();
  return services::SecurityConfig{.tls_cert = ca + "/bench.pem", .tls_key = ca + "/bench.key",
                                  .tls_ca = ca + "/ca.pem"};
}

inline absl::Status MaybeEnableTls(const std::string& dir, const std::string& role) {
  const char* env = std::getenv("MESHRUN_BENCH_TLS");
  if (env == nullptr || std::string(env) != "1") return absl::OkStatus();
  absl::StatusOr<services::SecurityConfig> tls = MakeBenchTls(dir, role);
  if (!tls.ok()) return tls.status();
  services::SetProcessSecurity(*std::move(tls));
  std::printf("mutual TLS on every link (MESHRUN_BENCH_TLS=1)\n");
  return absl::OkStatus();
}

}  // namespace meshrun::bench
