#include "rpc/cert_authority.h"

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/security_policy.h"

namespace meshrun::services {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;

absl::Status OpensslError(const std::string& what) {
  char buffer[256] = "unknown error";
  if (unsigned long code = ERR_get_error(); code != 0) ERR_error_string_n(code, buffer, sizeof buffer);
  return absl::InternalError(absl::StrCat(what, ": ", buffer));
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 200) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.' && c != '_') return false;
  }
  return true;
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpensslError("generating an EC P-256 key");
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, Free> ext(
      X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpensslError(absl::StrCat("adding extension ", OBJ_nid2sn(nid), "=", value));
  }
  return absl::OkStatus();
}

absl::StatusOr<Cert> NewCert(EVP_PKEY* key, const std::string& common_name, int days) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(BN_bin2bn(serial, sizeof serial, nullptr), BN_free);
  BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get()));
  const long not_after = long{days} * 86400;
  const long not_before = std::min(-3600L, not_after - 3600);  // clocks drift; expired stays so
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), not_before);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), not_after);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("meshrun"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0);
  return cert;
}

absl::Status WritePem(const std::string& path, bool is_key, EVP_PKEY* key, X509* cert) {
  const std::string temp = path + ".tmp";
  // A key is 0600 from its first byte (never created readable, then narrowed): a fresh file,
  // never a leftover or a link someone else placed.
  unlink(temp.c_str());
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      is_key ? 0600 : 0644);
  FILE* f = fd < 0 ? nullptr : fdopen(fd, "w");
  if (f == nullptr) {
    if (fd >= 0) close(fd);
    return absl::InternalError(absl::StrCat("cannot write ", temp));
  }
  const int ok = is_key ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr)
                        : PEM_write_X509(f, cert);
  std::fclose(f);
  if (ok != 1) return OpensslError(absl::StrCat("writing ", path));
  // Renamed into place so a file-watching reader never sees half a file.
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", temp, " to ", path));
  }
  return absl::OkStatus();
}

template <typename T, typename Reader>
absl::StatusOr<std::unique_ptr<T, Free>> ReadPem(const std::string& path, Reader reader) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read it; run meshrun certs init first"));
  }
  T* value = reader(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (value == nullptr) return OpensslError(absl::StrCat("parsing ", path));
  return std::unique_ptr<T, Free>(value);
}

}  // namespace

std::vector<std::string> SpiffeCandidates(const x509_st* cert) {
  std::vector<std::string> candidates;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_STRING* uri = name->d.uniformResourceIdentifier;
    candidates.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                            ASN1_STRING_length(uri));
  }
  GENERAL_NAMES_free(names);
  char cn[256] = {0};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) > 0) {
    candidates.emplace_back(cn);
  }
  std::erase_if(candidates, [](const std::string& c) { return !absl::StartsWith(c, "spiffe://"); });
  return candidates;
}

absl::StatusOr<Identity> ReadCertificateIdentity(const std::string& pem_path) {
  auto cert = ReadPem<X509>(pem_path, PEM_read_X509);
  if (!cert.ok()) return cert.status();
  std::string problem = "it has no spiffe:// URI SAN";
  for (const std::string& candidate : SpiffeCandidates(cert->get())) {
    absl::StatusOr<Identity> identity = ParseSpiffeId(candidate);
    if (identity.ok()) return *identity;
    problem = std::string(identity.status().message());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      pem_path, ": ", problem, "; issue certificates with meshrun certs issue"));
}

absl::Status CreateClusterCa(const std::string& dir, const std::string& cluster, int days) {
  if (!ValidName(cluster)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster=", cluster, ": use letters, digits, '-', '.' and '_' only"));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("--dir=", dir, ": ", ec.message()));
  if (std::filesystem::exists(dir + "/ca.pem")) {
    return absl::AlreadyExistsError(absl::StrCat(
        dir, "/ca.pem exists; a new CA would orphan every certificate it signed. Pass another "
        "--dir"));
  }
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert = NewCert(key->get(), absl::StrCat("meshrun cluster CA ", cluster), days);
  if (!cert.ok()) return cert.status();
  X509_set_issuer_name(cert->get(), X509_get_subject_name(cert->get()));
  for (const auto& [nid, value] : std::vector<std::pair<int, std::string>>{
           {NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
           {NID_key_usage, "critical,keyCertSign,cRLSign"},
           {NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(cert->get(), cert->get(), nid, value); !s.ok()) return s;
  }
  if (X509_sign(cert->get(), key->get(), EVP_sha256()) == 0) return OpensslError("signing the CA");
  if (absl::Status s = WritePem(dir + "/ca.key", true, key->get(), nullptr); !s.ok()) return s;
  if (absl::Status s = WritePem(dir + "/ca.pem", false, nullptr, cert->get()); !s.ok()) return s;
  std::ofstream(dir + "/cluster") << cluster << "\n";
  return absl::OkStatus();
}

absl::StatusOr<std::string> IssueCertificate(const IssueRequest& request) {
  if (absl::StatusOr<Role> role = ParseRole(request.role); !role.ok()) return role.status();
  if (!ValidName(request.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--name=", request.name, ": use letters, digits, '-', '.' and '_' only"));
  }
  // DNS names match without case and with a trailing dot: "MESHRUN-COORDINATOR" or
  // "meshrun-coordinator." would pass a client's check for the coordinator.
  if (request.name.front() == '.' || request.name.back() == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("--name=", request.name, ": a name may not start or end with '.'"));
  }
  if (absl::EqualsIgnoreCase(request.name, kCoordinatorDnsName) &&
      request.role != "coordinator") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--name=", request.name, ": ", kCoordinatorDnsName,
        " (in any case) is reserved for the coordinator's certificate"));
  }
  std::ifstream cluster_file(request.ca_dir + "/cluster");
  std::string cluster;
  if (!(cluster_file >> cluster)) {
    return absl::NotFoundError(absl::StrCat(request.ca_dir, "/cluster: cannot read it; run "
                                            "meshrun certs init --dir=", request.ca_dir, " first"));
  }
  auto ca_cert = ReadPem<X509>(request.ca_dir + "/ca.pem", PEM_read_X509);
  if (!ca_cert.ok()) return ca_cert.status();
  auto ca_key = ReadPem<EVP_PKEY>(request.ca_dir + "/ca.key", PEM_read_PrivateKey);
  if (!ca_key.ok()) return ca_key.status();
  auto key = NewKey();
  if (!key.ok()) return key.status();
  const std::string spiffe = absl::StrCat("spiffe://", cluster, "/", request.role, "/", request.name);
  auto cert = NewCert(key->get(), spiffe, request.days);
  if (!cert.ok()) return cert.status();
  X509_set_issuer_name(cert->get(), X509_get_subject_name(ca_cert->get()));
  std::string san = absl::StrCat("URI:", spiffe);
  if (request.role == "worker" || request.role == "coordinator") {
    absl::StrAppend(&san, ",DNS:", request.name);
  }
  if (request.role == "coordinator") absl::StrAppend(&san, ",DNS:", kCoordinatorDnsName);
  for (const auto& [nid, value] : std::vector<std::pair<int, std::string>>{
           {NID_basic_constraints, "critical,CA:FALSE"},
           {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
           {NID_ext_key_usage, "serverAuth,clientAuth"},
           {NID_subject_key_identifier, "hash"},
           {NID_authority_key_identifier, "keyid"},
           {NID_subject_alt_name, san}}) {
    if (absl::Status s = AddExtension(cert->get(), ca_cert->get(), nid, value); !s.ok()) return s;
  }
  if (X509_sign(cert->get(), ca_key->get(), EVP_sha256()) == 0) {
    return OpensslError("signing the certificate");
  }
  const std::string out_cert =
      request.out_cert.empty() ? absl::StrCat(request.ca_dir, "/", request.name, ".pem") : request.out_cert;
  const std::string out_key =
      request.out_key.empty() ? absl::StrCat(request.ca_dir, "/", request.name, ".key") : request.out_key;
  // The CA's own files are never overwritten (--name=ca, or --cert_out/--key_out naming them).
  for (const std::string& out : {out_cert, out_key}) {
    for (const char* own : {"ca.pem", "ca.key", "cluster"}) {
      std::error_code ec;
      if (std::filesystem::equivalent(out, request.ca_dir + "/" + own, ec)) {
        return absl::InvalidArgumentError(absl::StrCat(
            out, " is the CA's ", own, ": give the certificate another --name (or --cert_out/"
            "--key_out)"));
      }
    }
  }
  // Key first: a watcher that sees the new certificate finds its key already in place.
  if (absl::Status s = WritePem(out_key, true, key->get(), nullptr); !s.ok()) return s;
  if (absl::Status s = WritePem(out_cert, false, nullptr, cert->get()); !s.ok()) return s;
  return spiffe;
}

std::string NewBearerToken() {
  unsigned char bytes[32];
  RAND_bytes(bytes, sizeof bytes);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

}  // namespace meshrun::services
