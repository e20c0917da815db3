#include "cli/cli_help.h"

#include <cstdio>
#include <cstring>

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace meshrun::services {
namespace {

struct Command {
  const char* name;
  const char* synopsis;     // what follows "meshrun " in the usage line
  const char* summary;      // one line for the global usage
  const char* description;  // the command's own help
  std::vector<const char*> flags;
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"health", "health [HOST:PORT]", "print SERVING, or why the server is not serving",
       "Asks a coordinator or worker for its gRPC health. Without an address it asks the "
       "coordinator (--coordinator, $MESHRUN_COORDINATOR). Exit 0 when SERVING, else 1.",
       {}},
      {"workers", "workers", "list the workers: state, runtime, heartbeat age, exclusions",
       "Lists the coordinator's workers with their state, runtime and heartbeat age, and why a "
       "job's runtime pin excludes a host. --state, --slice and --on_job filter them; "
       "--page_size lists a page at a time and prints the next page's --page_token, then "
       "the matches by slice (alive, dead, left, devices).",
       {"job", "state", "slice", "on_job", "page_size", "page_token", "expect", "wait"}},
      {"submit", "submit <bundle>", "submit an exported bundle (its directory or job.json)",
       "Submits a bundle (meshrun.export, meshrun.torch) and prints the job id. With --follow "
       "it waits until the job ends and prints the summary `meshrun get` prints "
       "(--output=json: the whole manifest); exit 4 when the job ended FAILED or CANCELLED, "
       "5 when it still runs after --wait. Warnings the coordinator accepted the job despite "
       "(e.g. an array file without a header) go to stderr.",
       {"steps", "cadence", "data", "host_replicas", "on_nonfinite", "follow", "wait",
        "checkpoint_dir", "checkpoint_every", "memory_checkpoint_every", "keep_checkpoints",
        "resume_from", "max_restarts"}},
      {"get", "get <job-id>", "a job's summary (--output=json: the whole manifest)",
       "Prints a job's state, mesh, runtime, compile, data, steps, checkpoints, goodput and "
       "error. --output=json prints the manifest as JSON, --output=textproto as text proto.",
       {}},
      {"list", "list", "list jobs", "Lists the coordinator's jobs, one a line.", {}},
      {"cancel", "cancel <job-id>", "cancel a job on every worker",
       "Cancels a job: every worker stops it after the step in flight.", {}},
      {"checkpoint", "checkpoint <job-id>", "save a running job's state now",
       "Asks every host of a running job to checkpoint after its current step (the job needs "
       "--checkpoint_dir).",
       {}},
      {"watch", "watch <job-id>", "live telemetry table with sparklines",
       "Prints a job's telemetry as it arrives, one row per logging step, until the job ends. "
       "An unknown --series name is refused, listing the job's series.",
       {"since_step", "series"}},
      {"export", "export <job-id>", "the job's telemetry history as csv, jsonl or tensorboard",
       "Writes a job's telemetry history (running or finished).",
       {"format", "out", "since_step", "series"}},
      {"metrics", "metrics [host]", "each worker's metrics (compile, load, execute, transfers)",
       "Prints each worker's metrics report, or one host's.", {}},
      {"memory", "memory <host> [device]", "device memory by runtime name (cpu:0, TPU:3)",
       "Prints a host's device memory: in use, peak and limit, per device.", {}},
      {"compile", "compile <bundle>", "compile a job for a TPU slice here, no cluster needed",
       "Compiles each program of a bundle for a TPU slice through libtpu, with no cluster and "
       "no TPU, and prints bytes per device, FLOPs per step and executable size; exit 1 when a "
       "program does not fit a chip (docs/pjrt.md).",
       {"target", "compiler_plugin", "hlo_out"}},
      {"drain", "drain <host>", "have a worker finish, leave and exit as on SIGTERM (admin)",
       "Asks a worker to drain as on SIGTERM: it finishes or checkpoints the step in flight, "
       "leaves and exits. Role admin.",
       {}},
      {"certs", "certs init|issue|token", "cluster CA, certificates, bearer tokens",
       "certs init --dir=D [--cluster=NAME]: a cluster CA. certs issue --dir=D "
       "--role=worker|coordinator|client --name=N [--roles=admin|submit|view]: a certificate "
       "and key. certs token --role=admin|submit|view|metrics --name=N [--tokens_file=F]: a "
       "bearer token (docs/security.md).",
       {"dir", "cluster", "role", "name", "roles", "days", "cert_out", "key_out", "tokens_file"}},
      {"version", "version", "print this build's version and protocol range",
       "Prints this build's version and the protocol versions it speaks.", {}},
  };
  return *commands;
}

constexpr char kGlobalFlags[] =
    "global flags: --coordinator (default $MESHRUN_COORDINATOR, else 127.0.0.1:7070), "
    "--timeout=5s, --output=text|json|textproto, --tls_ca/--tls_cert/--tls_key, --token_file "
    "(docs/security.md)\n"
    "exit codes: 0 ok, 1 refused or failed call, 2 usage error, 3 coordinator unreachable,\n"
    "4 the followed job ended FAILED or CANCELLED (submit --follow), 5 still running after --wait\n";

std::string FlagLine(const char* name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return absl::StrCat("  --", name, "\n");
  const std::string value = flag->DefaultValue();
  return absl::StrCat("  --", name, value.empty() ? "" : absl::StrCat("=", value), "\n      ",
                      flag->Help(), "\n");
}

const Command* Find(const std::string& name) {
  for (const Command& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

int PrintCommand(const std::string& name) {
  const Command* command = Find(name);
  if (command == nullptr) {
    std::fprintf(stderr, "meshrun: unknown command \"%s\"; commands: %s\n", name.c_str(),
                 CommandList().c_str());
    return 2;
  }
  std::string text = absl::StrCat("usage: meshrun [flags] ", command->synopsis, "\n\n",
                                  command->description, "\n");
  if (!command->flags.empty()) absl::StrAppend(&text, "\nflags:\n");
  for (const char* flag : command->flags) absl::StrAppend(&text, FlagLine(flag));
  absl::StrAppend(&text, "\n", kGlobalFlags);
  std::fputs(text.c_str(), stdout);
  return 0;
}

// --helpfull stays absl's: every flag of the binary, which tools read.
bool IsHelpFlag(const char* arg) {
  for (const char* help : {"--help", "-help", "-h", "--helpshort"}) {
    if (std::strcmp(arg, help) == 0) return true;
  }
  return false;
}

}  // namespace

std::string CommandList() {
  std::vector<std::string> names;
  for (const Command& c : Commands()) names.push_back(c.name);
  return absl::StrJoin(names, ", ");
}

const char* GlobalUsage() {
  static const std::string* usage = [] {
    auto* text = new std::string("meshrun [flags] <command> [args]\n\ncommands:\n");
    for (const Command& c : Commands()) {
      absl::StrAppendFormat(text, "  %-22s %s\n", c.synopsis, c.summary);
    }
    absl::StrAppend(text, "\n`meshrun help <command>` or `meshrun <command> --help`: that "
                          "command's flags\n", kGlobalFlags);
    return text;
  }();
  return usage->c_str();
}

int MaybePrintHelp(int argc, char** argv) {
  std::vector<std::string> words;  // the arguments that are not flags or flag values
  bool asked = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (IsHelpFlag(argv[i])) {
      asked = true;
    } else if (arg[0] != '-') {
      words.push_back(arg);
    } else if (arg.find('=') == std::string::npos && i + 1 < argc) {
      // "--flag value": a flag that is not a bool takes the next argument.
      const absl::CommandLineFlag* flag =
          absl::FindCommandLineFlag(arg.substr(arg.find_first_not_of('-')));
      if (flag != nullptr && !flag->IsOfType<bool>()) ++i;
    }
  }
  if (!words.empty() && words[0] == "help") {
    asked = true;
    words.erase(words.begin());
  }
  if (!asked) return -1;
  if (words.empty()) {
    std::fputs(GlobalUsage(), stdout);
    return 0;
  }
  return PrintCommand(words[0]);
}

}  // namespace meshrun::services
