#include "cli/cli_get.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace meshrun::services {
namespace {

std::string Time(int64_t unix_micros) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMicros(unix_micros),
                          absl::UTCTimeZone());
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.1f %s", bytes, units[u]);
}

void Line(std::string& out, const std::string& field, const std::string& value) {
  absl::StrAppendFormat(&out, "%-12s %s\n", field + ":", value);
}

std::string Mesh(const v1::JobManifest& job) {
  const v1::MeshAssignment& mesh = job.mesh();
  std::vector<std::string> axes;
  for (int i = 0; i < mesh.axis_names_size() && i < mesh.shape_size(); ++i) {
    axes.push_back(absl::StrCat(mesh.axis_names(i), "=", mesh.shape(i)));
  }
  std::string text = axes.empty() ? "not assigned yet" : absl::StrJoin(axes, " x ");
  if (mesh.replica_hosts_size() > 1) {
    absl::StrAppend(&text, ", as ", mesh.replica_hosts_size(), " host replicas (",
                    absl::StrJoin(mesh.replica_hosts(), ", "), "), each ",
                    mesh.device_ids_size(), " devices");
  } else if (mesh.device_hosts_size() > 0) {
    std::vector<std::string> hosts;  // in device order, each once
    for (const std::string& h : mesh.device_hosts()) {
      if (hosts.empty() || hosts.back() != h) hosts.push_back(h);
    }
    absl::StrAppend(&text, " on ", absl::StrJoin(hosts, ", "), " (", mesh.device_ids_size(),
                    " devices)");
  }
  return text;
}

std::string Data(const v1::JobManifest& job) {
  const v1::DataSource& data = job.spec().data();
  const v1::DataReceipt& receipt = job.data_receipt();
  std::string text;
  switch (data.source_case()) {
    case v1::DataSource::kTokenShardsGlob: text = "token shards " + data.token_shards_glob(); break;
    case v1::DataSource::kSynthetic: text = "SYNTHETIC tokens (not a real-data run)"; break;
    case v1::DataSource::kExampleBundle: text = "the bundle's batches " + data.example_bundle(); break;
    case v1::DataSource::kArrayFile: text = "array batches " + data.array_file(); break;
    default: text = "none"; break;
  }
  if (receipt.files_size() > 0 || receipt.tokens() > 0) {
    absl::StrAppend(&text, "\n             receipt: ", receipt.files_size(), " files, ",
                    Bytes(static_cast<double>(receipt.bytes())));
    if (receipt.tokens() > 0) {
      absl::StrAppend(&text, ", ", receipt.tokens(), " tokens, ", receipt.documents(),
                      " documents");
    }
    if (!receipt.sha256().empty()) absl::StrAppend(&text, ", sha256 ", receipt.sha256());
  }
  if (receipt.unchecked_layout()) {
    absl::StrAppend(&text, "\n             UNCHECKED: the file has no header, so its arrays were "
                           "not checked against the program (write it with meshrun.data."
                           "write_arrays)");
  }
  return text;
}

// "71.3% of 31.8 s; badput: compile 4.1 s, failure 2.9 s, rerun_steps 2.0 s": the three
// largest causes (docs/goodput.md), those of 0.1 s or more.
std::string Goodput(const v1::JobGoodput& goodput) {
  std::vector<std::pair<double, std::string>> causes;
  for (const auto& [cause, seconds] : goodput.badput_seconds()) {
    if (seconds >= 0.1) causes.emplace_back(seconds, cause);
  }
  std::sort(causes.rbegin(), causes.rend());
  if (causes.size() > 3) causes.resize(3);
  std::string out = absl::StrFormat("%.1f%% of %.1f s", 100 * goodput.ratio(),
                                    goodput.wall_seconds());
  for (size_t i = 0; i < causes.size(); ++i) {
    absl::StrAppendFormat(&out, "%s%s %.1f s", i == 0 ? "; badput: " : ", ", causes[i].second,
                          causes[i].first);
  }
  return out;
}

}  // namespace

std::string JobSummaryText(const v1::JobManifest& job) {
  std::string out;
  Line(out, "job", absl::StrCat(job.job_id(), "  ", job.spec().name()));
  std::string state = v1::JobState_Name(job.state());
  if (state.rfind("JOB_STATE_", 0) == 0) state = state.substr(std::strlen("JOB_STATE_"));
  Line(out, "state", state);
  if (!job.error().empty()) {
    Line(out, "error", job.failed_host().empty() ? job.error()
                                                 : job.failed_host() + ": " + job.error());
  }
  if (job.nonfinite_step() > 0) {
    const char* policy = job.spec().on_nonfinite() == v1::NONFINITE_WARN     ? "warn"
                         : job.spec().on_nonfinite() == v1::NONFINITE_IGNORE ? "ignore"
                                                                             : "fail";
    Line(out, "non-finite", absl::StrCat("series \"", job.nonfinite_series(),
                                         "\" is not finite from step ", job.nonfinite_step(),
                                         " (on_nonfinite=", policy, ")"));
  }
  // The user's resume (spec.resume_from) and the coordinator's restarts, told apart.
  std::string step = absl::StrCat(job.last_step(), " of ", job.spec().steps());
  // A restart rewrites spec.resume_from; the first run's start step says what the user asked.
  const int64_t resumed =
      job.attempts_size() > 0 ? job.attempts(0).start_step() : job.restored_step();
  if (!job.spec().resume_from().empty() && resumed > 0) {
    absl::StrAppend(&step, " (resumed from step ", resumed, ")");
  }
  if (job.attempts_size() > 0) {
    absl::StrAppend(&step, "; run ", job.attempts_size() + 1, " after ", job.attempts_size(),
                    job.attempts_size() == 1 ? " restart" : " restarts",
                    job.restored_step() > 0
                        ? absl::StrCat(", from the ",
                                       job.memory_restore().step() > 0 ? "in-memory " : "",
                                       "checkpoint of step ", job.restored_step())
                        : ", from the start");
  }
  Line(out, "step", step);
  if (job.created_unix_micros() > 0) {
    std::string times = "created " + Time(job.created_unix_micros());
    if (job.finished_unix_micros() > 0) {
      absl::StrAppend(&times, ", finished ", Time(job.finished_unix_micros()), " (",
                      absl::FormatDuration(absl::Microseconds(job.finished_unix_micros() -
                                                              job.created_unix_micros())),
                      ")");
    }
    Line(out, "time", times);
  }
  Line(out, "mesh", Mesh(job));
  if (!job.runtime().platform_name().empty()) {
    Line(out, "runtime", absl::StrCat(job.runtime().platform_name(), " ",
                                      job.runtime().platform_version(), ", PJRT API ",
                                      job.runtime().pjrt_api_major(), ".",
                                      job.runtime().pjrt_api_minor()));
  }
  if (!job.compile_mode().empty()) {
    std::string compile = absl::StrCat("mode ", job.compile_mode());
    if (job.cache_hit()) {
      absl::StrAppend(&compile, ", cache hit");
    } else {
      absl::StrAppendFormat(&compile, ", compiled in %.2f s", job.compile_seconds());
      if (!job.compiled_on().empty()) absl::StrAppend(&compile, " on ", job.compiled_on());
    }
    if (job.executable_bytes_sent() > 0) {
      absl::StrAppend(&compile, ", ", Bytes(static_cast<double>(job.executable_bytes_sent())),
                      " of executables sent");
    }
    Line(out, "compile", compile);
  }
  if (job.step_flops_per_device() > 0 || job.device_bytes() > 0) {
    std::string fit = job.compile_target().empty() ? "" : absl::StrCat("for ", job.compile_target(), ": ");
    if (job.device_bytes() > 0) {
      absl::StrAppend(&fit, Bytes(static_cast<double>(job.device_bytes())), " per device");
    }
    if (job.step_flops_per_device() > 0) {
      absl::StrAppendFormat(&fit, "%s%.4g FLOPs per step per device", job.device_bytes() > 0 ? ", " : "",
                            job.step_flops_per_device());
    }
    Line(out, "compiler", fit);
  }
  Line(out, "data", Data(job));
  if (job.goodput().wall_seconds() > 0) Line(out, "goodput", Goodput(job.goodput()));
  if (job.checkpoints_size() > 0) {
    const v1::CheckpointRecord& last = job.checkpoints(job.checkpoints_size() - 1);
    Line(out, "checkpoints",
         absl::StrCat(job.checkpoints_size(), ", last at step ", last.step(),
                      last.committed() ? " (committed) " : " (not committed) ", last.path(),
                      last.error().empty() ? "" : ": " + last.error()));
  }
  if (job.attempts_size() > 0) {  // each restart: which host, which tier, who took its place
    std::vector<std::string> restarts;
    for (const v1::JobAttempt& attempt : job.attempts()) {
      std::string told = absl::StrCat("step ", attempt.last_step(), " -> ",
                                      attempt.restored_step(), " from ",
                                      attempt.restored_from().empty() ? "disk"
                                                                      : attempt.restored_from());
      if (!attempt.host().empty()) absl::StrAppend(&told, " (", attempt.host(), ")");
      for (const auto& [gone, added] : attempt.replaced_hosts()) {
        absl::StrAppend(&told, ", ", added, " replaced ", gone);
      }
      restarts.push_back(std::move(told));
    }
    Line(out, "restarts", absl::StrCat(job.attempts_size(), ": ", absl::StrJoin(restarts, "; ")));
  }
  if (job.straggler_hosts_size() > 0) {
    Line(out, "stragglers", absl::StrJoin(job.straggler_hosts(), ", "));
  }
  return out;
}

}  // namespace meshrun::services
