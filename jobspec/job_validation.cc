#include "jobspec/job_validation.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/store.h"
#include "common/status_macros.h"
#include "jobspec/array_data.h"
#include "jobspec/spec_limits.h"
#include "worker/sparse/block_plan.h"
#include "worker/token_shards.h"

namespace meshrun::jobspec {
namespace {

const std::set<std::string> kDTypes = {"pred", "s8",  "s16", "s32", "s64", "u8",  "u16",
                                       "u32",  "u64", "f16", "bf16", "f32", "f64"};

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
// `batch.doc_ids` s32 [B, L'] (worker/batch_sources.h); the worker appends the sparse plan
// tables itself; any other batch input cannot be fed.
absl::Status CheckTokenBatchInputs(const v1::JobSpec& spec, const v1::Program& program,
                                   int index) {
  std::set<std::string> appended;
  if (spec.has_sparse_attention()) {
    for (const auto& [table, name] : SparseTableInputs(spec.sparse_attention())) {
      appended.insert(name);
    }
  }
  const std::string field = absl::StrCat("programs[", index, "].inputs");
  if (spec.state_count() < 0 || spec.state_count() > program.inputs_size()) {
    return Invalid("state_count", absl::StrCat("is ", spec.state_count(), "; the ", program.role(),
                                               " program has ", program.inputs_size(), " inputs"));
  }
  const v1::TensorSpec* tokens = nullptr;
  const v1::TensorSpec* doc_ids = nullptr;
  // Mode B: grad's accumulator inputs (apply's after the state) come before the batch.
  int first = spec.state_count();
  for (const v1::Program& p : spec.programs()) {
    if (program.role() == "grad" && p.role() == "apply") first = p.inputs_size();
  }
  for (int i = first; i < program.inputs_size(); ++i) {
    const v1::TensorSpec& t = program.inputs(i);
    const std::string input = absl::StrCat(field, "[", i, "]");
    if (appended.contains(t.name())) continue;
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
  const int64_t hosts = std::max(1, spec.mesh().host_replicas());
  if (data.global_batch() != 0 && data.global_batch() != tokens->shape(0) * hosts) {
    return Invalid("data.global_batch",
                   absl::StrCat("is ", data.global_batch(), "; the program takes batch.tokens of ",
                                tokens->shape(0), " rows",
                                hosts > 1 ? absl::StrCat(" on each of ", hosts, " hosts") : "",
                                " (or leave it 0)"));
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
  const char* role = IsModeB(spec) ? "grad" : "step";
  for (int i = 0; i < spec.programs_size(); ++i) {
    if (spec.programs(i).role() == role) {
      *index = i;
      return &spec.programs(i);
    }
  }
  return nullptr;
}

const v1::Program* FindStep(const v1::JobSpec& spec) {
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == "step") return &p;
  }
  return nullptr;
}

const v1::TensorSpec* FindInput(const v1::Program& program, const std::string& name, int* index) {
  for (int i = 0; i < program.inputs_size(); ++i) {
    if (program.inputs(i).name() == name) {
      *index = i;
      return &program.inputs(i);
    }
  }
  return nullptr;
}

// The contract must be legal, the doc ids a step input, and every named table one of the
// step's last inputs with exactly the layout the worker will build (plan_tables.h).
absl::Status CheckSparseAttention(const v1::SparseAttention& sparse, const v1::Program& step) {
  const worker::sparse::MaskContract contract = SparseContractOf(sparse);
  if (absl::Status s = contract.Validate(); !s.ok()) {
    return Invalid("sparse_attention", absl::StrCat("is not a legal mask contract: ", s.message()));
  }
  // One document spanning the sequence allows the most tiles (documents only remove tiles), so
  // if its plan fits, every batch's plan fits: refuse here rather than at the first batch.
  if (absl::Status s = worker::sparse::BuildBlockPlan(
          contract, std::vector<int32_t>(static_cast<size_t>(contract.seq_len), 0)).status();
      !s.ok()) {
    return Invalid("sparse_attention", std::string(s.message()));
  }
  int doc_index = -1;
  const v1::TensorSpec* doc_ids = FindInput(step, sparse.doc_ids_input(), &doc_index);
  if (doc_ids == nullptr) {
    return Invalid("sparse_attention.doc_ids_input",
                   absl::StrCat("\"", sparse.doc_ids_input(), "\" is not an input of the step"));
  }
  if (doc_ids->dtype() != "s32" || doc_ids->shape_size() != 2 ||
      doc_ids->shape(1) != contract.seq_len) {
    return Invalid("sparse_attention.doc_ids_input",
                   absl::StrCat("\"", doc_ids->name(), "\" must be s32 [rows, seq_len=",
                                contract.seq_len, "]"));
  }
  const auto tables = SparseTableInputs(sparse);
  if (tables.empty()) {
    return Invalid("sparse_attention", "names no plan table input; set e.g. data_next_input");
  }
  const int first_table = step.inputs_size() - static_cast<int>(tables.size());
  for (const auto& [table, name] : tables) {
    const std::string field =
        absl::StrCat("sparse_attention.", worker::sparse::PlanTableName(table), "_input");
    int index = -1;
    const v1::TensorSpec* input = FindInput(step, name, &index);
    if (input == nullptr) {
      return Invalid(field, absl::StrCat("\"", name, "\" is not an input of the step"));
    }
    if (index < first_table || index <= doc_index) {
      return Invalid(field, absl::StrCat("\"", name, "\" must be among the step's last ",
                                         tables.size(), " inputs (the worker appends the tables)"));
    }
    const worker::sparse::TableLayout layout =
        worker::sparse::LayoutOf(contract, table, doc_ids->shape(0));
    if (input->dtype() != layout.dtype ||
        !std::equal(input->shape().begin(), input->shape().end(), layout.dims.begin(),
                    layout.dims.end())) {
      return Invalid(field, absl::StrCat("\"", name, "\" is ", input->dtype(), " [",
                                         absl::StrJoin(input->shape(), ", "), "] but the contract",
                                         " makes it ", layout.dtype, " [",
                                         absl::StrJoin(layout.dims, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

// The checkpoint policy's directory is the coordinator's to commit into; resume_from must be a
// committed checkpoint holding every state array with the job's dtype and global shape.
absl::Status CheckCheckpointFields(const v1::JobSpec& spec) {
  namespace fs = std::filesystem;
  if (spec.has_checkpoint()) {
    const v1::CheckpointPolicy& policy = spec.checkpoint();
    if (policy.directory().empty() || !fs::path(policy.directory()).is_absolute()) {
      return Invalid("checkpoint.directory", absl::StrCat("\"", policy.directory(),
                                                          "\" is not an absolute path"));
    }
    if (!fs::is_directory(policy.directory()) ||
        ::access(policy.directory().c_str(), W_OK) != 0) {
      return Invalid("checkpoint.directory",
                     absl::StrCat(policy.directory(), " is not a writable directory here; "
                                  "create it on storage the coordinator and every host mount"));
    }
    if (policy.every_steps() < 1) {
      return Invalid("checkpoint.every_steps", absl::StrCat("is ", policy.every_steps(),
                                                            "; it must be >= 1"));
    }
    if (policy.keep_last() < 0) return Invalid("checkpoint.keep_last", "is negative; 0 keeps all");
    if (policy.memory_every_steps() < 0) {
      return Invalid("checkpoint.memory_every_steps",
                     absl::StrCat("is ", policy.memory_every_steps(),
                                  "; it must be >= 0 (0: no in-memory checkpoints)"));
    }
  }
  if (spec.resume_from().empty()) return absl::OkStatus();
  absl::StatusOr<v1::CheckpointManifest> manifest = checkpoint::ReadManifest(spec.resume_from());
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat("spec.resume_from: ", manifest.status().message()));
  }
  const v1::Program* state = nullptr;
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == (IsModeB(spec) ? "apply" : "step")) state = &p;
  }
  for (int i = 0; state != nullptr && i < spec.state_count(); ++i) {
    const v1::TensorSpec& input = state->inputs(i);
    const v1::CheckpointArray* array = nullptr;
    for (const v1::CheckpointArray& a : manifest->arrays()) {
      if (a.name() == input.name()) array = &a;
    }
    if (array == nullptr) {
      return Invalid("resume_from", absl::StrCat("holds no array ", input.name(),
                                                 " of the job's state"));
    }
    if (array->dtype() != input.dtype() || array->shape_size() != input.shape_size()) {
      return Invalid("resume_from", absl::StrCat(
          "array ", input.name(), " is ", array->dtype(), " of rank ", array->shape_size(),
          "; the job's state input is ", input.dtype(), " of rank ", input.shape_size()));
    }
    for (int d = 0; d < input.shape_size(); ++d) {
      if (array->shape(d) != input.shape(d)) {
        return Invalid("resume_from", absl::StrCat("array ", input.name(), " dimension ", d,
                                                   " is ", array->shape(d),
                                                   " in the checkpoint, ", input.shape(d),
                                                   " in the job"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::DataReceipt> ReadDataReceipt(const v1::JobSpec& spec,
                                               const PathRoots* roots) {
  v1::DataReceipt receipt;
  if (spec.data().synthetic()) receipt.set_synthetic(true);
  if (spec.data().has_array_file()) return ArrayFileReceipt(spec);  // sdk: array batches
  if (!spec.data().has_token_shards_glob()) return receipt;
  const std::string& glob = spec.data().token_shards_glob();
  absl::StatusOr<std::shared_ptr<const worker::TokenCorpus>> corpus =
      worker::TokenCorpus::Open(glob, roots);
  if (!corpus.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.data.token_shards_glob \"", glob,
                                                   "\": ", corpus.status().message()));
  }
  if (const int64_t vocab = spec.data().vocab_size(); vocab > 0 && (*corpus)->vocab_size() > vocab) {
    return Invalid("data.token_shards_glob",
                   absl::StrCat("\"", glob, "\" holds tokens of a ", (*corpus)->vocab_size(),
                                "-token vocabulary (its shards' header), but the program's "
                                "batch.tokens index a vocabulary of ", vocab,
                                " (the bundle's vocab_size): tokenize the data for this model"));
  }
  int index = 0;
  if (const v1::Program* program = BatchProgram(spec, &index); program != nullptr) {
    for (const v1::TensorSpec& t : program->inputs()) {
      if (t.name() == "batch.tokens" && t.shape_size() == 2 &&
          (*corpus)->WindowCount(t.shape(1)) == 0) {
        return Invalid("data.token_shards_glob",
                       absl::StrCat("\"", glob, "\" holds ", (*corpus)->num_tokens(),
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

absl::StatusOr<int64_t> RestoredStep(const v1::JobSpec& spec) {
  if (spec.resume_from().empty()) return 0;
  absl::StatusOr<v1::CheckpointManifest> manifest = checkpoint::ReadManifest(spec.resume_from());
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat("spec.resume_from: ", manifest.status().message()));
  }
  return manifest->step();
}

worker::sparse::MaskContract SparseContractOf(const v1::SparseAttention& sparse) {
  worker::sparse::MaskContract c;
  c.seq_len = sparse.seq_len();
  c.causal = sparse.causal();
  if (sparse.windowed()) c.window = worker::sparse::LocalWindow{sparse.window_left(),
                                                                sparse.window_right()};
  c.block_q = sparse.block_q();
  c.block_kv = sparse.block_kv();
  c.max_grid_width = sparse.max_grid_width();
  c.heads_per_plan = sparse.heads_per_plan();
  return c;
}

std::vector<std::pair<worker::sparse::PlanTable, std::string>> SparseTableInputs(
    const v1::SparseAttention& sparse) {
  using worker::sparse::PlanTable;
  std::vector<std::pair<PlanTable, std::string>> out;
  for (const auto& [table, name] :
       {std::pair{PlanTable::kBlockMask, sparse.block_mask_input()},
        std::pair{PlanTable::kDataNext, sparse.data_next_input()},
        std::pair{PlanTable::kMaskNext, sparse.mask_next_input()},
        std::pair{PlanTable::kGridWidth, sparse.grid_width_input()},
        std::pair{PlanTable::kPartialMasks, sparse.partial_masks_input()}}) {
    if (!name.empty()) out.emplace_back(table, name);
  }
  return out;
}

bool IsModeB(const v1::JobSpec& spec) {
  if (spec.model_family() == v1::MODEL_FAMILY_MOE || spec.mesh().host_replicas() > 1) return true;
  // sdk: any model exported with grad + apply (meshrun.export's compile mode B).
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == "grad") return true;
  }
  return false;
}

const char* CompileMode(const v1::JobSpec& spec) { return IsModeB(spec) ? "B" : "A"; }

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  if (spec.name().empty()) return Invalid("name", "is empty; name the job");
  RETURN_IF_ERROR(CheckSpecBounds(spec));
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
    if (p.stablehlo().empty() && p.stablehlo_sha256().empty()) {
      return Invalid(field + ".stablehlo",
                     "is empty: give the program's bytes, or its stablehlo_sha256 after "
                     "UploadProgram");
    }
    if (!p.stablehlo().empty() && !p.stablehlo_sha256().empty()) {
      return Invalid(field + ".stablehlo_sha256",
                     "is set beside stablehlo: give the bytes or their sha256, not both");
    }
    if (absl::Status s = CheckTensors(p.inputs(), field + ".inputs"); !s.ok()) return s;
    if (absl::Status s = CheckTensors(p.outputs(), field + ".outputs"); !s.ok()) {
      return s;
    }
  }
  if (!roles.contains("init")) return Invalid("programs", "has no \"init\" program");
  const bool mode_b = IsModeB(spec);
  const bool replicas = spec.mesh().host_replicas() > 1;
  if (replicas && !(roles.contains("grad") && roles.contains("apply"))) {
    return Invalid("mesh.host_replicas",
                   "needs compile mode B (grad and apply programs): the hosts average their "
                   "gradients between grad and apply, which one step program gives them no "
                   "point to do; export the step as grad + apply");
  }
  if (mode_b && !(roles.contains("grad") && roles.contains("apply"))) {
    return Invalid("programs", "of an MoE job (compile mode B) need \"grad\" and \"apply\"");
  }
  if (!mode_b && !roles.contains("step")) {
    return Invalid("programs", "of a dense or Mamba job (compile mode A) need a \"step\" program");
  }
  if (mode_b && roles.contains("step")) {
    return Invalid("programs", "of a compile mode B job run grad + apply; drop \"step\"");
  }
  if (mode_b && spec.grad_accumulation() < 1) {
    return Invalid("grad_accumulation",
                   absl::StrCat("is ", spec.grad_accumulation(), "; a compile mode B job "
                                "runs N >= 1 grad micro-steps per step, set it to N"));
  }
  if (!mode_b && spec.grad_accumulation() != 0) {
    return Invalid("grad_accumulation", "is set but only compile mode B jobs (MoE, or host "
                                        "replicas) accumulate; leave it 0");
  }
  // The state is the first inputs of the program that ends a step; every program must hold it.
  for (const v1::Program& p : spec.programs()) {
    if (p.role() != "init" && (spec.state_count() < 0 || spec.state_count() > p.inputs_size())) {
      return Invalid("state_count", absl::StrCat("is ", spec.state_count(), "; the ", p.role(),
                                                 " program has ", p.inputs_size(), " inputs"));
    }
  }
  if (mode_b) {
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
    if (p.role() == (mode_b ? "apply" : "step")) {
      for (const v1::TensorSpec& t : p.outputs()) outputs.insert(t.name());
    }
  }
  std::set<std::string> series;
  for (int i = 0; i < spec.telemetry_size(); ++i) {
    const v1::TelemetryDeclaration& t = spec.telemetry(i);
    const std::string field = absl::StrCat("telemetry[", i, "]");
    const std::string& output = TelemetryOutputName(t);
    if (!outputs.contains(output)) {
      return Invalid(field + (t.output().empty() ? ".name" : ".output"),
                     absl::StrCat("\"", output, "\" is not an output of the ",
                                  mode_b ? "apply" : "step", " program"));
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
  if (spec.data().has_array_file() && spec.data().array_file().empty()) {
    return Invalid("data.array_file", "is empty");
  }
  // The plan tables first: the token data check skips the inputs they name.
  if (spec.has_sparse_attention()) {
    if (mode_b) return Invalid("sparse_attention", "is supported for mode A (step) jobs only");
    if (absl::Status s = CheckSparseAttention(spec.sparse_attention(), *FindStep(spec)); !s.ok()) {
      return s;
    }
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
  RETURN_IF_ERROR(CheckCheckpointFields(spec));
  const v1::MeshRequest& mesh = spec.mesh();
  if (mesh.data_parallel() < 0 || mesh.tensor_parallel() < 0 || mesh.expert_parallel() < 0) {
    return Invalid("mesh", "has a negative size; use 0 for auto");
  }
  if (mesh.host_replicas() < 0) {
    return Invalid("mesh.host_replicas", "is negative; use 0 (or 1) for one host");
  }
  if (mesh.host_replicas() > 1) {
    // The hosts average gradients between grad and apply (worker/collectives), in f32.
    for (const v1::Program& p : spec.programs()) {
      for (int i = spec.state_count(); p.role() == "apply" && i < p.inputs_size(); ++i) {
        if (p.inputs(i).dtype() != "f32") {
          return Invalid("mesh.host_replicas",
                         absl::StrCat("needs f32 accumulators; apply input ", p.inputs(i).name(),
                                      " is ", p.inputs(i).dtype()));
        }
      }
    }
  }
  return CheckDeclarations(spec);
}

}  // namespace meshrun::jobspec
