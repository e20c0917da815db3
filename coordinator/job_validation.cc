#include "coordinator/job_validation.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::coordinator {
namespace {

constexpr int64_t kMaxProgramBytes = 256 << 20;
const std::set<std::string> kDTypes = {"pred", "s8",  "s16", "s32", "s64", "u8",  "u16",
                                       "u32",  "u64", "f16", "bf16", "f32", "f64"};

absl::Status Invalid(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, " ", problem));
}

absl::Status CheckTensors(const google::protobuf::RepeatedPtrField<v1::TensorSpec>& tensors,
                          const std::string& list) {
  std::set<std::string> names;
  for (int i = 0; i < tensors.size(); ++i) {
    const v1::TensorSpec& t = tensors[i];
    const std::string field = absl::StrCat(list, "[", i, "]");
    if (t.name().empty()) return Invalid(field + ".name", "is empty");
    if (!names.insert(t.name()).second) {
      return Invalid(field + ".name", absl::StrCat("\"", t.name(), "\" appears twice"));
    }
    if (!kDTypes.contains(t.dtype())) {
      return Invalid(field + ".dtype", absl::StrCat("\"", t.dtype(), "\" is not one of ",
                                                    absl::StrJoin(kDTypes, ", ")));
    }
    for (int64_t d : t.shape()) {
      if (d < 0) return Invalid(field + ".shape", "has a negative dimension");
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* CompileMode(v1::ModelFamily family) {
  return family == v1::MODEL_FAMILY_MOE ? "B" : "A";
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  if (spec.name().empty()) return Invalid("name", "is empty; name the job");
  std::set<std::string> roles;
  for (int i = 0; i < spec.programs_size(); ++i) {
    const v1::Program& p = spec.programs(i);
    const std::string field = absl::StrCat("programs[", i, "]");
    if (p.role() != "init" && p.role() != "step" && p.role() != "grad" && p.role() != "apply" &&
        p.role() != "eval") {
      return Invalid(field + ".role", absl::StrCat("\"", p.role(),
                                                   "\" is not init, step, grad, apply or eval"));
    }
    if (!roles.insert(p.role()).second) {
      return Invalid(field + ".role", absl::StrCat("\"", p.role(), "\" appears twice"));
    }
    if (p.stablehlo().empty()) return Invalid(field + ".stablehlo", "is empty");
    if (static_cast<int64_t>(p.stablehlo().size()) > kMaxProgramBytes) {
      return Invalid(field + ".stablehlo", absl::StrCat("is over ", kMaxProgramBytes, " bytes"));
    }
    if (absl::Status s = CheckTensors(p.inputs(), field + ".inputs"); !s.ok()) return s;
    if (absl::Status s = CheckTensors(p.outputs(), field + ".outputs"); !s.ok()) {
      return s;
    }
  }
  if (!roles.contains("init")) return Invalid("programs", "has no \"init\" program");
  const bool moe = spec.model_family() == v1::MODEL_FAMILY_MOE;
  if (moe && !(roles.contains("grad") && roles.contains("apply"))) {
    return Invalid("programs", "of an MoE job (compile mode B) need \"grad\" and \"apply\"");
  }
  if (!moe && !roles.contains("step")) {
    return Invalid("programs", "of a dense or Mamba job (compile mode A) need a \"step\" program");
  }
  if (moe && roles.contains("step")) {
    return Invalid("programs", "of an MoE job (compile mode B) run grad + apply; drop \"step\"");
  }
  if (moe && spec.grad_accumulation() < 1) {
    return Invalid("grad_accumulation",
                   absl::StrCat("is ", spec.grad_accumulation(), "; an MoE job (compile mode B) "
                                "runs N >= 1 grad micro-steps per step, set it to N"));
  }
  if (!moe && spec.grad_accumulation() != 0) {
    return Invalid("grad_accumulation", "is set but only MoE jobs (compile mode B) accumulate; "
                                        "leave it 0 or set model_family to MOE");
  }
  if (moe) {
    // apply(state, grad_acc): grad must take the state, the same accumulators and the batch.
    const v1::Program* grad = nullptr;
    const v1::Program* apply = nullptr;
    for (const v1::Program& p : spec.programs()) {
      if (p.role() == "grad") grad = &p;
      if (p.role() == "apply") apply = &p;
    }
    const int accumulators = apply->inputs_size() - spec.state_count();
    if (accumulators < 1 || grad->inputs_size() <= spec.state_count() + accumulators ||
        grad->outputs_size() < accumulators) {
      return Invalid("programs", absl::StrCat(
          "grad (", grad->inputs_size(), " inputs, ", grad->outputs_size(), " outputs) and apply (",
          apply->inputs_size(), " inputs) do not fit compile mode B with state_count ",
          spec.state_count(), ": apply takes state + accumulators, grad takes state + "
          "accumulators + batch and returns the accumulators first"));
    }
  }
  // Telemetry comes from the program that ends a step: "step" in mode A, "apply" in mode B.
  std::set<std::string> outputs;
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == (moe ? "apply" : "step")) {
      for (const v1::TensorSpec& t : p.outputs()) outputs.insert(t.name());
    }
  }
  std::set<std::string> series;
  for (int i = 0; i < spec.telemetry_size(); ++i) {
    const v1::TelemetryDeclaration& t = spec.telemetry(i);
    const std::string field = absl::StrCat("telemetry[", i, "]");
    if (!outputs.contains(t.name())) {
      return Invalid(field + ".name",
                     absl::StrCat("\"", t.name(), "\" is not an output of the ",
                                  moe ? "apply" : "step", " program"));
    }
    if (!series.insert(t.name()).second) {
      return Invalid(field + ".name", absl::StrCat("\"", t.name(), "\" is declared twice"));
    }
    if (t.combine() == v1::COMBINE_UNSPECIFIED) {
      return Invalid(field + ".combine", "is unset; use mean, max, min, sum or last");
    }
  }
  if (spec.telemetry_cadence() < 1) {
    return Invalid("telemetry_cadence", absl::StrCat("is ", spec.telemetry_cadence(),
                                                     "; it must be >= 1 (log every N steps)"));
  }
  if (spec.steps() < 1) return Invalid("steps", "must be >= 1");
  if (spec.data().source_case() == v1::DataSource::SOURCE_NOT_SET) {
    return Invalid("data", "has no source; give token shard files, or synthetic by name");
  }
  if (spec.data().has_token_shards_glob() && spec.data().token_shards_glob().empty()) {
    return Invalid("data.token_shards_glob", "is empty");
  }
  const v1::MeshRequest& mesh = spec.mesh();
  if (mesh.data_parallel() < 0 || mesh.tensor_parallel() < 0 || mesh.expert_parallel() < 0) {
    return Invalid("mesh", "has a negative size; use 0 for auto");
  }
  return absl::OkStatus();
}

}  // namespace meshrun::coordinator
