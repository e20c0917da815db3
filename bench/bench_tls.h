// With MESHRUN_BENCH_TLS=1 in the environment, a bench runs every gRPC link with mutual TLS:
// a throw-away cluster CA and a certificate are made under `dir` and installed as the
// process's security (rpc/tls_credentials.h), so MakeChannel, StartGrpcServer and
// MakeServerCredentials all use them. bench/tls_bench.sh compares the two runs.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "rpc/cert_authority.h"
#include "rpc/tls_credentials.h"

namespace meshrun::bench {

// `role`: the certificate's role, as the access policy sees the bench's client calls.
inline absl::Status MaybeEnableTls(const std::string& dir, const std::string& role) {
  const char* env = std::getenv("MESHRUN_BENCH_TLS");
  if (env == nullptr || std::string(env) != "1") return absl::OkStatus();
  const std::string ca = dir + "/tls-ca";
  if (absl::Status s = services::CreateClusterCa(ca, "bench", 1); !s.ok()) return s;
  auto id = services::IssueCertificate({.ca_dir = ca, .role = role, .name = "bench"});
  if (!id.ok()) return id.status();
  services::SetProcessSecurity({.tls_cert = ca + "/bench.pem", .tls_key = ca + "/bench.key",
                                .tls_ca = ca + "/ca.pem"});
  std::printf("mutual TLS on every link (MESHRUN_BENCH_TLS=1)\n");
  return absl::OkStatus();
}

}  // namespace meshrun::bench
