#include "coordinator/job_validation.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/token_shards.h"

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

// Token shards and synthetic data fill `batch.tokens` s32 [B, L] and optionally
// `batch.doc_ids` s32 [B, L'] (worker/batch_sources.h); any other batch input cannot be fed.
absl::Status CheckTokenBatchInputs(const v1::JobSpec& spec, const v1::Program& program,
                                   int index) {
  const std::string field = absl::StrCat("programs[", index, "].inputs");
  if (spec.state_count() < 0 || spec.state_count() > program.inputs_size()) {
    return Invalid("state_count", absl::StrCat("is ", spec.state_count(), "; the ", program.role(),
                                               " program has ", program.inputs_size(), " inputs"));
  }
  const v1::TensorSpec* tokens = nullptr;
  const v1::TensorSpec* doc_ids = nullptr;
  for (int i = spec.state_count(); i < program.inputs_size(); ++i) {
    const v1::TensorSpec& t = program.inputs(i);
    const std::string input = absl::StrCat(field, "[", i, "]");
    if (t.name() != "batch.tokens" && t.name() != "batch.doc_ids") {
      return Invalid(input + ".name",
                     absl::StrCat("\"", t.name(), "\" is a batch input token data cannot fill; "
                                  "data.token_shards_glob and data.synthetic fill batch.tokens "
                                  "and batch.doc_ids only"));
    }
    if (t.dtype() != "s32" || t.shape_size() != 2) {
      return Invalid(input, absl::StrCat("\"", t.name(), "\" is ", t.dtype(), " of rank ",
                                         t.shape_size(), "; token data fills s32 [B, L]"));
    }
    (t.name() == "batch.tokens" ? tokens : doc_ids) = &t;
  }
  if (tokens == nullptr) {
    return Invalid(field, "has no batch.tokens s32 [B, L] for token data to fill");
  }
  if (doc_ids != nullptr &&
      (doc_ids->shape(0) != tokens->shape(0) || doc_ids->shape(1) > tokens->shape(1))) {
    return Invalid(field, "batch.doc_ids must be [B, L'] with the B of batch.tokens and "
                          "L' <= its L");
  }
  const v1::DataSource& data = spec.data();
  if (data.global_batch() != 0 && data.global_batch() != tokens->shape(0)) {
    return Invalid("data.global_batch", absl::StrCat("is ", data.global_batch(), "; the program "
                                                     "takes batch.tokens of ", tokens->shape(0),
                                                     " rows (or leave it 0)"));
  }
  if (data.sequence_length() != 0 && data.sequence_length() != tokens->shape(1)) {
    return Invalid("data.sequence_length",
                   absl::StrCat("is ", data.sequence_length(), "; the program takes batch.tokens "
                                "of length ", tokens->shape(1), " (or leave it 0)"));
  }
  return absl::OkStatus();
}

// The program that takes the batch: "step" in compile mode A, "grad" in mode B.
const v1::Program* BatchProgram(const v1::JobSpec& spec, int* index) {
  const char* role = spec.model_family() == v1::MODEL_FAMILY_MOE ? "grad" : "step";
  for (int i = 0; i < spec.programs_size(); ++i) {
    if (spec.programs(i).role() == role) {
      *index = i;
      return &spec.programs(i);
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<v1::DataReceipt> ReadDataReceipt(const v1::JobSpec& spec) {
  v1::DataReceipt receipt;
  if (spec.data().synthetic()) receipt.set_synthetic(true);
  if (!spec.data().has_token_shards_glob()) return receipt;
  const std::string& glob = spec.data().token_shards_glob();
  absl::StatusOr<std::shared_ptr<const worker::TokenCorpus>> corpus =
      worker::TokenCorpus::Open(glob);
  if (!corpus.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.data.token_shards_glob \"", glob,
                                                   "\": ", corpus.status().message()));
  }
  int index = 0;
  if (const v1::Program* program = BatchProgram(spec, &index); program != nullptr) {
    for (const v1::TensorSpec& t : program->inputs()) {
      if (t.name() == "batch.tokens" && t.shape_size() == 2 &&
          (*corpus)->WindowCount(t.shape(1)) == 0) {
        return Invalid("data.token_shards_glob",
                       absl::StrCat("\"", glob, "\" holds ", (*corpus)->tokens().size(),
                                    " tokens: no document starts a window of ", t.shape(1),
                                    " tokens (batch.tokens length)"));
      }
    }
  }
  const worker::DataReceipt& read = (*corpus)->receipt();
  for (size_t i = 0; i < read.files.size(); ++i) {
    receipt.add_files(read.files[i]);
    receipt.add_file_sha256(read.file_sha256[i]);
  }
  receipt.set_bytes(read.bytes);
  receipt.set_sha256(read.sha256);
  receipt.set_tokens(read.tokens);
  receipt.set_documents(read.documents);
  return receipt;
}

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
                     absl::StrCat("\"", t.name(), "\" is not an output of the step program"));
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
  if (spec.data().has_token_shards_glob() || spec.data().has_synthetic()) {
    if (spec.data().has_synthetic() && !spec.data().synthetic()) {
      return Invalid("data.synthetic", "is false; set it true to ask for random tokens by name");
    }
    int index = 0;
    if (const v1::Program* program = BatchProgram(spec, &index); program != nullptr) {
      RETURN_IF_ERROR(CheckTokenBatchInputs(spec, *program, index));
    }
  }
  const v1::MeshRequest& mesh = spec.mesh();
  if (mesh.data_parallel() < 0 || mesh.tensor_parallel() < 0 || mesh.expert_parallel() < 0) {
    return Invalid("mesh", "has a negative size; use 0 for auto");
  }
  return absl::OkStatus();
}

}  // namespace meshrun::coordinator
