"""Client.watch against an in-process coordinator servicer on loopback whose
WatchTelemetryBatches streams follow a script: a stream dropped mid-job (UNAVAILABLE) resumes
from the step after the last one yielded, with no duplicate (also inside a batch); a recovery
restart's rewind event is yielded and the steps run again after it come through."""
from concurrent import futures

import grpc
import pytest

import meshrun
from meshrun.v1 import coordinator_pb2, coordinator_pb2_grpc, telemetry_pb2


DROP = grpc.StatusCode.UNAVAILABLE


def summary(step, loss=None):
    s = telemetry_pb2.GlobalSummary(job_id="job-1", step=step)
    s.values.add(name="metrics.loss", values=[loss if loss is not None else 1.0 / step])
    return s


def rewind(step, attempt=2, steps_lost=2):
    return telemetry_pb2.GlobalSummary(job_id="job-1", step=step, rewind=telemetry_pb2.JobRewind(
        attempt=attempt, cause="worker-0 died", host="worker-0", steps_lost=steps_lost))


class ScriptedCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """Stream i sends scripts[i]: summaries, then the end or a grpc.StatusCode (or a (code,
    message) pair) it fails with (UNAVAILABLE: a dropped stream). Summaries go in batches of
    up to two, as a coordinator packs what a reader has not taken yet."""

    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.since_steps = []

    def WatchTelemetryBatches(self, request, context):
        self.since_steps.append(request.since_step)
        batch = coordinator_pb2.GlobalSummaryBatch()
        for item in self.scripts.pop(0):
            if isinstance(item, telemetry_pb2.GlobalSummary):
                batch.summaries.append(item)
                if len(batch.summaries) < 2:
                    continue
            if batch.summaries:
                yield batch
                batch = coordinator_pb2.GlobalSummaryBatch()
            if isinstance(item, grpc.StatusCode):
                context.abort(item, f"scripted {item.name}")
            if isinstance(item, tuple):
                context.abort(*item)
        if batch.summaries:
            yield batch


@pytest.fixture
def serve():
    servers = []

    def start(scripts):
        servicer = ScriptedCoordinator(scripts)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return servicer, meshrun.Client(f"127.0.0.1:{port}", timeout=10)

    yield start
    for server in servers:
        server.stop(None)


def seen(summaries):
    return [("rewind" if s.HasField("rewind") else "step", s.step) for s in summaries]


def test_dropped_stream_resumes_without_gap_or_duplicate(serve):
    # The second stream resends step 3 (as a coordinator may after a restart): yielded once.
    servicer, client = serve([[summary(1), summary(2), summary(3), DROP],
                              [summary(3), summary(4), summary(5)]])
    got = list(client.watch("job-1"))
    assert seen(got) == [("step", s) for s in (1, 2, 3, 4, 5)]
    assert servicer.since_steps == [0, 4]


def test_rewind_is_yielded_and_rerun_steps_come_through(serve):
    # Steps 5 and 6 ran, the job restarted from the checkpoint of step 4, and ran 5..7 again;
    # the stream then drops and resumes after the re-run's step 6, not the first run's.
    servicer, client = serve([
        [summary(4), summary(5), summary(6), rewind(4), summary(5, 0.5), summary(6, 0.4),
         DROP],
        [summary(6, 0.4), summary(7, 0.3)]])
    got = list(client.watch("job-1", since_step=4))
    assert seen(got) == [("step", 4), ("step", 5), ("step", 6), ("rewind", 4), ("step", 5),
                         ("step", 6), ("step", 7)]
    event = got[3].rewind
    assert (event.attempt, event.steps_lost, event.host) == (2, 2, "worker-0")
    assert not got[3].values
    assert [s.values[0].values[0] for s in got[4:]] == pytest.approx([0.5, 0.4, 0.3])
    assert servicer.since_steps == [4, 7]


def test_a_reader_that_fell_behind_resumes(serve):
    # The coordinator closes a watcher whose queue overflowed (telemetry/watch_hub.cc); the
    # missed steps come from the history on the next stream.
    behind = (grpc.StatusCode.RESOURCE_EXHAUSTED,
              "watcher of job job-1 fell behind (more than 256 summaries queued); "
              "resume with since_step=3")
    servicer, client = serve([[summary(1), summary(2), behind], [summary(3), summary(4)]])
    assert seen(client.watch("job-1")) == [("step", s) for s in (1, 2, 3, 4)]
    assert servicer.since_steps == [0, 3]


def test_other_errors_are_raised(serve):
    # A NOT_FOUND is the caller's to handle, not a reason to reconnect; nor is a cap on streams.
    servicer, client = serve([[summary(1), grpc.StatusCode.NOT_FOUND]])
    with pytest.raises(grpc.RpcError) as error:
        list(client.watch("job-9"))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND and servicer.since_steps == [0]
    servicer, client = serve([[(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "256 WatchTelemetry streams are open; retry later")]])
    with pytest.raises(grpc.RpcError) as error:
        list(client.watch("job-9"))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
