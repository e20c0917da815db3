#include "worker_service/worker_checkpoints.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "rpc/server_support.h"

namespace meshrun::services {
namespace {

// Delivers a host's report, retrying briefly (with backoff while the coordinator is busy): the
// commit waits for every host's.
void SendReport(v1::Coordinator::Stub* coordinator, const v1::ReportCheckpointRequest& report) {
  absl::Duration backoff = absl::Milliseconds(250);
  for (int attempt = 0; attempt < 8; ++attempt) {
    v1::ReportCheckpointResponse response;
    auto context = ContextWithTimeout(absl::Seconds(30));
    grpc::Status status = coordinator->ReportCheckpoint(context.get(), report, &response);
    if (status.ok()) return;
    if (!RetryLater(status)) {
      spdlog::error("job {}: checkpoint of step {} refused: {}", report.job_id(), report.step(),
                    status.error_message());
      return;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(4));
  }
  spdlog::error("job {}: checkpoint of step {}: the coordinator did not take the report",
                report.job_id(), report.step());
}

}  // namespace

absl::StatusOr<std::shared_ptr<worker::CheckpointSaver>> ConfigureCheckpoints(
    const JobCheckpointContext& context, worker::StepLoop::Config& loop) {
  const v1::JobManifest& manifest = *context.manifest;
  const v1::JobSpec& spec = manifest.spec();
  std::vector<v1::TensorSpec> state(context.state_program->inputs().begin(),
                                    context.state_program->inputs().begin() + spec.state_count());
  const std::vector<std::string> axes(manifest.mesh().axis_names().begin(),
                                      manifest.mesh().axis_names().end());
  const std::vector<int64_t> shape(manifest.mesh().shape().begin(), manifest.mesh().shape().end());
  if (!spec.resume_from().empty()) {
    ASSIGN_OR_RETURN(v1::CheckpointManifest checkpoint,
                     checkpoint::ReadManifest(spec.resume_from()));
    RETURN_IF_ERROR(loop.batches->Skip(checkpoint.data_position()));
    loop.spec.first_step = checkpoint.step() + 1;
    loop.restore_state = [runtime = context.runtime, dir = spec.resume_from(), state, axes, shape,
                          metrics = context.metrics](const std::vector<int>& devices,
                                                     const std::vector<int64_t>& partitions) {
      return worker::RestoreState(*runtime, dir, state, axes, shape, devices, partitions, metrics);
    };
    spdlog::info("job {}: resuming after step {} from {}", manifest.job_id(), checkpoint.step(),
                 spec.resume_from());
  }
  if (!spec.has_checkpoint()) return std::shared_ptr<worker::CheckpointSaver>();
  ASSIGN_OR_RETURN(std::unique_ptr<worker::CheckpointSaver> saver,
                   worker::CheckpointSaver::Create(
                       {.runtime = context.runtime,
                        .job_id = manifest.job_id(),
                        .host = context.host,
                        .incarnation = context.incarnation,
                        .directory = spec.checkpoint().directory(),
                        .state = std::move(state),
                        .mesh_axes = axes,
                        .mesh_shape = shape,
                        .writes = context.writes,
                        .report = [stub = context.coordinator,
                                   attempt = manifest.attempts_size()](
                                      v1::ReportCheckpointRequest r) {
                          r.set_attempt(attempt);  // which run: a late one is refused
                          SendReport(stub, r);
                        },
                        .metrics = context.metrics}));
  std::shared_ptr<worker::CheckpointSaver> shared = std::move(saver);
  loop.checkpoint = shared->Hook();
  loop.checkpoint_every = spec.checkpoint().every_steps();
  return shared;
}

}  // namespace meshrun::services
