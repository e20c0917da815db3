#include "worker_service/worker_checkpoints.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "jobspec/job_validation.h"
#include "jobspec/memory_tier.h"
#include "rpc/server_support.h"
#include "worker_service/memory_checkpoint_transfer.h"

namespace meshrun::services {
namespace {

// A restarted host fetching the state from a holder: generous for a large state, bounded so a
// holder that stopped answering fails the restore (the next restart reads the disk tier).
constexpr absl::Duration kFetchTimeout = absl::Seconds(120);
static_assert(worker::MemoryCheckpointStore::kKeptPerJob == jobspec::kMemoryCheckpointsKept,
              "the coordinator sizes host memory for the steps the store keeps");

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
  const worker::StateLayout layout{.state = state, .mesh_axes = axes, .mesh_shape = shape};
  const v1::MemoryRestore& memory = manifest.memory_restore();
  if (memory.step() > 0 && context.memory != nullptr) {
    RETURN_IF_ERROR(loop.batches->Skip(memory.data_position()));
    loop.spec.first_step = memory.step() + 1;
    loop.restore_state = [runtime = context.runtime, store = context.memory, layout, memory,
                          job_id = manifest.job_id(), host = context.host,
                          metrics = context.metrics](const std::vector<int>& devices,
                                                     const std::vector<int64_t>& partitions)
        -> absl::StatusOr<worker::StepLoop::DeviceBuffers> {
      absl::StatusOr<worker::StepLoop::DeviceBuffers> restored = absl::FailedPreconditionError(
          "this host holds no copy of the step");
      if (auto copies = store->Copies(job_id, memory.step()); !copies.empty()) {
        restored = worker::RestoreSnapshot(*runtime, layout, copies, devices, partitions, metrics);
      }
      if (!absl::IsFailedPrecondition(restored.status())) return restored;
      // A spare, the lost host back, or a host given other partitions: fetch what it lacks.
      ASSIGN_OR_RETURN(const auto needed, worker::BlocksNeeded(layout, partitions));
      ASSIGN_OR_RETURN(std::shared_ptr<worker::MemorySnapshot> fetched,
                       FetchMemoryCheckpoint(memory, job_id, host, needed, kFetchTimeout));
      store->Put(fetched);  // its own blocks in this run: it can serve them from now on
      return worker::RestoreSnapshot(*runtime, layout, {fetched}, devices, partitions, metrics);
    };
    spdlog::info("job {}: restarting after step {} from in-memory checkpoints",
                 manifest.job_id(), memory.step());
  } else if (!spec.resume_from().empty()) {
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
  const int64_t memory_every = jobspec::MemoryCheckpointEvery(spec.checkpoint());
  if (memory_every > 0 && context.memory != nullptr) {
    loop.memory_checkpoint_every = memory_every;
    // A program spanning hosts: keep a copy of the ring predecessor's, so one lost host loses
    // no block.
    std::shared_ptr<RingPeerCopier> ring;
    if (const std::string peer = jobspec::RingPredecessor(manifest.mesh(), context.host);
        !peer.empty() && !context.ring_peer_address.empty()) {
      ring = std::make_shared<RingPeerCopier>(context.memory, manifest.job_id(), peer,
                                              context.ring_peer_address);
    }
    loop.memory_checkpoint = [runtime = context.runtime, store = context.memory, layout, ring,
                              job_id = manifest.job_id(), metrics = context.metrics](
                                 int64_t step, const worker::StepLoop::DeviceBuffers& state,
                                 const std::vector<int64_t>& partitions, int64_t data_position) {
      absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> snapshot = worker::TakeSnapshot(
          *runtime, layout, job_id, step, data_position, state, partitions, metrics);
      if (!snapshot.ok()) {  // the disk tier still holds: the job goes on
        spdlog::warn("job {}: in-memory checkpoint of step {}: {}", job_id, step,
                     snapshot.status().ToString());
        return;
      }
      if (metrics != nullptr) metrics->AddBytes(worker::kMemoryCheckpointBytes, (*snapshot)->Bytes());
      store->Put(*std::move(snapshot));
      if (ring != nullptr) ring->Copied(step);
    };
  }
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
