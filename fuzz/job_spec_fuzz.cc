// JobSpec validation (jobspec/job_validation.h) on any JobSpec a gRPC client can send:
// the input is a serialized meshrun.v1.JobSpec. Seeds: the example bundles' specs (programs'
// bytes cut short: validation never parses them). Property: no crash, and a refusal is
// INVALID_ARGUMENT.
#include <cstddef>
#include <cstdint>

#include "jobspec/job_validation.h"
#include "fuzz/fuzz_support.h"
#include "bundle/job_bundle.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace meshrun;
  fuzz::QuietLogs();
  std::vector<std::string> seeds;
  for (const std::string& bundle : fuzz::ExampleBundles()) {
    absl::StatusOr<v1::JobSpec> spec = client::JobSpecFromBundle(bundle, {});
    if (!spec.ok()) continue;
    for (v1::Program& p : *spec->mutable_programs()) p.set_stablehlo("ML\xefR");
    seeds.push_back(spec->SerializeAsString());
  }
  fuzz::MaybeWriteSeeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshrun;
  v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return -1;  // not a JobSpec: not kept
  const absl::Status status = jobspec::ValidateJobSpec(spec);
  fuzz::ExpectDocumentedError(status, "ValidateJobSpec", {absl::StatusCode::kInvalidArgument});
  if (status.ok()) {
    // What the launcher derives from an accepted spec must be safe to compute too.
    (void)jobspec::CompileMode(spec);
    (void)jobspec::SparseContractOf(spec.sparse_attention());
    (void)jobspec::SparseTableInputs(spec.sparse_attention());
  }
  return 0;
}
