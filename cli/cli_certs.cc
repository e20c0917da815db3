#include "cli/cli_certs.h"

#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "rpc/binary_setup.h"
#include "rpc/cert_authority.h"
#include "cli/cli_common.h"

ABSL_FLAG(std::string, dir, "", "certs: the CA directory (ca.pem, ca.key, cluster)");
ABSL_FLAG(std::string, cluster, "meshrun", "certs init: the cluster name in every SPIFFE id");
ABSL_FLAG(std::string, role, "",
          "certs issue: worker, coordinator or client (certs token: admin, submit or view)");
ABSL_FLAG(std::string, name, "", "certs issue/token: the host (worker, coordinator) or user name");
ABSL_FLAG(std::string, roles, "view", "certs issue --role=client: admin, submit or view");
ABSL_FLAG(int, days, 365, "certs: validity in days (CA: ten times this)");
ABSL_FLAG(std::string, cert_out, "", "certs issue: certificate path (default <dir>/<name>.pem)");
ABSL_FLAG(std::string, key_out, "", "certs issue: key path (default <dir>/<name>.key)");
ABSL_FLAG(std::string, tokens_file, "",
          "certs token: append the token's hash line to this --auth_tokens_file");

namespace meshrun::services {

int RunCertsCommand(const std::vector<std::string>& args) {
  constexpr char kUsage[] =
      "usage: meshrun certs init --dir=D [--cluster=NAME]\n"
      "       meshrun certs issue --dir=D --role=worker|coordinator|client --name=N "
      "[--roles=admin|submit|view] [--days=365]\n"
      "       meshrun certs token --role=admin|submit|view|metrics --name=N [--tokens_file=F]";
  if (args.size() != 3) ExitWithError(kUsage, 2);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const std::string& sub = args[2];
  if (sub == "init") {
    if (dir.empty()) ExitWithError("certs init needs --dir", 2);
    absl::Status s = CreateClusterCa(dir, absl::GetFlag(FLAGS_cluster), absl::GetFlag(FLAGS_days) * 10);
    if (!s.ok()) ExitWithError(std::string(s.message()), 1);
    if (JsonOutput()) {
      PrintJsonObject({{"cluster", absl::GetFlag(FLAGS_cluster)}, {"ca_dir", dir},
                       {"ca_cert", dir + "/ca.pem"}});
      return 0;
    }
    std::printf("cluster CA \"%s\" in %s (keep ca.key secret; give ca.pem to every host)\n",
                absl::GetFlag(FLAGS_cluster).c_str(), dir.c_str());
    return 0;
  }
  if (sub == "issue") {
    if (dir.empty()) ExitWithError("certs issue needs --dir (the CA directory)", 2);
    IssueRequest request{.ca_dir = dir,
                         .role = absl::GetFlag(FLAGS_role),
                         .name = absl::GetFlag(FLAGS_name),
                         .days = absl::GetFlag(FLAGS_days),
                         .out_cert = absl::GetFlag(FLAGS_cert_out),
                         .out_key = absl::GetFlag(FLAGS_key_out)};
    if (request.role == "client") request.role = absl::GetFlag(FLAGS_roles);
    if (request.role != "worker" && request.role != "coordinator" && request.role != "admin" &&
        request.role != "submit" && request.role != "view") {
      ExitWithError("--role must be worker, coordinator or client (with --roles=admin, submit or "
                    "view)", 2);
    }
    absl::StatusOr<std::string> id = IssueCertificate(request);
    if (!id.ok()) ExitWithError(std::string(id.status().message()), 1);
    if (JsonOutput()) {
      PrintJsonObject({{"issued", *id}});
      return 0;
    }
    std::printf("issued %s\n", id->c_str());
    return 0;
  }
  if (sub == "token") {
    const std::string role = absl::GetFlag(FLAGS_role);
    const std::string name = absl::GetFlag(FLAGS_name);
    if ((role != "admin" && role != "submit" && role != "view" && role != "metrics") ||
        name.empty()) {
      ExitWithError("certs token needs --role=admin|submit|view|metrics and --name (metrics: a "
                    "scrape token good for /metrics only)", 2);
    }
    const std::string token = NewBearerToken();
    const std::string line = absl::StrCat(Sha256Hex(token), " ", role, " ", name);
    if (const std::string file = absl::GetFlag(FLAGS_tokens_file); !file.empty()) {
      std::ofstream out(file, std::ios::app);
      out << line << "\n";
      if (!out) ExitWithError(absl::StrCat("cannot append to ", file), 1);
    } else if (!JsonOutput()) {
      std::fprintf(stderr, "add to the --auth_tokens_file: %s\n", line.c_str());
    }
    if (JsonOutput()) {  // the hash line is part of the object: nothing on stderr to miss
      PrintJsonObject({{"token", token}, {"tokens_file_line", line}});
      return 0;
    }
    std::printf("%s\n", token.c_str());
    return 0;
  }
  ExitWithError(kUsage, 2);
}

}  // namespace meshrun::services
