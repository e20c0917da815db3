// A small cluster certificate authority on OpenSSL's library, for `meshrun certs` and tests.
//
// Files in the CA directory: ca.pem (certificate), ca.key (private key, mode 0600), cluster
// (the cluster name). Issued certificates carry one URI SAN spiffe://<cluster>/<role>/<name>
// (rpc/security_policy.h), a DNS SAN <name> when it is a plausible host name, and both
// serverAuth and clientAuth usages. Keys are ECDSA P-256. A coordinator's certificate also
// carries DNS:meshrun-coordinator (kCoordinatorDnsName), a name no other role may be issued:
// clients that can only check host names (the Python SDK) check that one.
//
// Thread-safety: the functions touch only the files they are given.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/security_policy.h"

struct x509_st;  // OpenSSL's X509

namespace meshrun::services {

inline constexpr char kCoordinatorDnsName[] = "meshrun-coordinator";

// Creates the CA in `dir` (created if missing). Errors: ALREADY_EXISTS (ca.pem there; pass
// another directory), INVALID_ARGUMENT (bad cluster name), INTERNAL (OpenSSL or file error).
absl::Status CreateClusterCa(const std::string& dir, const std::string& cluster, int days);

struct IssueRequest {
  std::string ca_dir;
  std::string role;  // coordinator, worker, admin, submit or view
  std::string name;  // the host for worker/coordinator; a person or program otherwise
  int days = 365;    // validity from now (negative: already expired, for tests)
  std::string out_cert;  // default <ca_dir>/<name>.pem
  std::string out_key;   // default <ca_dir>/<name>.key
};

// Issues a key and certificate signed by the CA. Returns the SPIFFE id written.
// Errors: NOT_FOUND (no CA in ca_dir), INVALID_ARGUMENT (role or name), INTERNAL.
absl::StatusOr<std::string> IssueCertificate(const IssueRequest& request);

// The spiffe:// identity of the PEM certificate at `pem_path` (its URI SAN, else a
// spiffe-shaped CN). Errors: NOT_FOUND (unreadable), INTERNAL (not a certificate),
// INVALID_ARGUMENT (no spiffe:// identity in it).
absl::StatusOr<Identity> ReadCertificateIdentity(const std::string& pem_path);

// The spiffe:// names a certificate carries (URI SANs, then the CN), unparsed; `cert` is an
// OpenSSL X509*. The caller checks the chain.
std::vector<std::string> SpiffeCandidates(const x509_st* cert);

// A fresh random bearer token (32 bytes, hex).
std::string NewBearerToken();

}  // namespace meshrun::services
