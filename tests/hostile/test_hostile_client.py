"""Hostile-client suite (issue 16; labels fault, security): malformed, oversized, out-of-range
and out-of-order calls to every RPC of the Coordinator and Worker services, written as an
outside client would with grpcio and stubs generated from proto/. After each call: the code and
message are the documented ones, both servers still answer health, and nothing changed."""
import hashlib
import os
import time

import grpc
import pytest

from meshrun.bundle import job_spec_from_bundle
from meshrun.v1 import coordinator_pb2 as cpb
from meshrun.v1 import job_pb2
from meshrun.v1 import telemetry_pb2 as tpb
from meshrun.v1 import worker_pb2 as wpb

from conftest import TIMEOUT

C = grpc.StatusCode
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLE = os.path.join(ROOT, "examples", "transformer_lm", "dp1")


def refused(cluster, call, code, *words):
    """Runs call(); it must fail with `code` and a message holding every one of `words`;
    then both servers answer health and the observable state is unchanged."""
    before = cluster.state()
    try:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)  # a server stream: its status comes at the end
    except grpc.RpcError as e:
        got = e
    else:
        if getattr(result, "job_id", ""):  # an accepted job must not disturb the next cases
            cluster.coordinator.CancelJob(cpb.CancelJobRequest(job_id=result.job_id),
                                          timeout=TIMEOUT)
            cluster.wait_idle()
        pytest.fail(f"accepted, expected {code}: {result}")
    codes = code if isinstance(code, tuple) else (code,)
    assert got.code() in codes, f"{got.code()} {got.details()!r}"
    for w in words:
        assert w.lower() in got.details().lower(), f"{w!r} not in {got.details()!r}"
    assert cluster.running(), "a server exited:\n" + cluster.logs()
    assert cluster.both_healthy(), "a server stopped answering health:\n" + cluster.logs()
    assert cluster.state() == before
    return got.details()


def spec(**changes):
    s = job_spec_from_bundle(os.path.join(BUNDLE, "job.json"), steps=5, cadence=1)
    for k, v in changes.items():
        setattr(s, k, v)
    return s


def submit(cluster, s):
    return cluster.coordinator.SubmitJob(cpb.SubmitJobRequest(spec=s), timeout=TIMEOUT)


# ------------------------------------------------------------------------ Coordinator: jobs
@pytest.mark.parametrize("count,words", [(-1, ["state_count", "-1"]),
                                         (-2147483648, ["state_count"]),
                                         (2147483647, ["state_count", "2147483647"])])
def test_submit_state_count_out_of_range(cluster, count, words):
    refused(cluster, lambda: submit(cluster, spec(state_count=count)), C.INVALID_ARGUMENT, *words)


# Submit-time signature checks (issue 16 item 1): each lie is refused, naming the field.
def test_submit_lying_signatures(cluster):
    s = spec()
    step = next(p for p in s.programs if p.role == "step")
    step.donated_inputs.append(len(step.inputs) + 5)  # past the inputs
    refused(cluster, lambda: submit(cluster, s), C.INVALID_ARGUMENT, "donated_inputs")
    # A declared input list shorter than the program's is found when the program compiles, not
    # at submit: the job fails at LOADING naming the input (the runtime conformance test
    # InputsDisagreeingWithProgramAreRefusedAtCompileAndLoad).
    s = spec()
    s.programs[0].inputs[0].shape[:] = [-4, 1 << 62]
    refused(cluster, lambda: submit(cluster, s), C.INVALID_ARGUMENT, "shape")


def test_submit_malformed(cluster):
    refused(cluster, lambda: submit(cluster, job_pb2.JobSpec()), C.INVALID_ARGUMENT, "name")
    refused(cluster, lambda: submit(cluster, spec(steps=-5)), C.INVALID_ARGUMENT, "steps")
    refused(cluster, lambda: submit(cluster, spec(telemetry_cadence=0)), C.INVALID_ARGUMENT,
            "telemetry_cadence")
    s = spec()
    s.data.token_shards_glob = "/dev/zer*"
    refused(cluster, lambda: submit(cluster, s), C.INVALID_ARGUMENT, "token_shards_glob")
    s = spec()
    s.telemetry.add(name="not_an_output")
    refused(cluster, lambda: submit(cluster, s), C.INVALID_ARGUMENT, "telemetry")


def test_jobs_unknown_or_empty_ids(cluster):
    co = cluster.coordinator
    refused(cluster, lambda: co.GetJob(cpb.GetJobRequest(job_id="job-404"), timeout=TIMEOUT),
            C.NOT_FOUND, "job-404")
    refused(cluster, lambda: co.CancelJob(cpb.CancelJobRequest(job_id="job-404"),
                                          timeout=TIMEOUT), C.NOT_FOUND, "job-404")
    refused(cluster, lambda: co.CancelJob(cpb.CancelJobRequest(), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, "job_id")
    refused(cluster, lambda: co.CheckpointJob(cpb.CheckpointJobRequest(), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, "job_id")
    refused(cluster, lambda: co.CheckpointJob(cpb.CheckpointJobRequest(job_id="job-404"),
                                              timeout=TIMEOUT), C.NOT_FOUND, "job-404")


def test_removed_fetch_executable_stays_refused(cluster):
    # FetchExecutable was declared in proto/ but never served (the coordinator pushes
    # executables with Worker.LoadExecutable), and is removed from it; a client that still
    # calls it by its name, with any bytes, gets UNIMPLEMENTED and changes nothing.
    fetch = cluster.cchan.unary_stream("/meshrun.v1.Coordinator/FetchExecutable",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
    for request in (b"",
                    b"\x0a\x10../../etc/passwd",      # fingerprint (field 1)
                    b"\x10" + b"\xff" * 9 + b"\x01"):  # offset -1 (field 2)
        refused(cluster, lambda: fetch(request, timeout=TIMEOUT), C.UNIMPLEMENTED)


# ----------------------------------------------------------------- Coordinator: membership
def live_registration(cluster):
    reg = cpb.WorkerRegistration()
    reg.CopyFrom(cluster.registration())
    reg.protocol.version = cluster.coordinator.GetSupportedVersions(
        cpb.GetSupportedVersionsRequest(), timeout=TIMEOUT).max_version
    return reg


def test_reregistration_of_a_live_host(cluster):
    reg = live_registration(cluster)
    reg.incarnation = "spoofed-incarnation"
    reg.address = "127.0.0.1:1"
    refused(cluster, lambda: cluster.coordinator.RegisterWorker(
        cpb.RegisterWorkerRequest(registration=reg), timeout=TIMEOUT),
        C.ALREADY_EXISTS, "host-a")


def test_register_malformed(cluster):
    co = cluster.coordinator
    refused(cluster, lambda: co.RegisterWorker(cpb.RegisterWorkerRequest(), timeout=TIMEOUT),
            C.INVALID_ARGUMENT)
    reg = live_registration(cluster)
    reg.host = "host-evil"
    reg.address = "not an address"
    reg.incarnation = "x"
    refused(cluster, lambda: co.RegisterWorker(cpb.RegisterWorkerRequest(registration=reg),
                                               timeout=TIMEOUT), C.INVALID_ARGUMENT, "address")


def test_spoofed_heartbeat_and_deregister(cluster):
    co = cluster.coordinator
    refused(cluster, lambda: co.Heartbeat(cpb.HeartbeatRequest(host="host-404", incarnation="i"),
                                          timeout=TIMEOUT), C.NOT_FOUND, "host-404")
    refused(cluster, lambda: co.Heartbeat(cpb.HeartbeatRequest(host="host-a", incarnation="old"),
                                          timeout=TIMEOUT), C.FAILED_PRECONDITION, "incarnation")
    refused(cluster, lambda: co.DeregisterWorker(
        cpb.DeregisterWorkerRequest(host="host-a", incarnation="old"), timeout=TIMEOUT),
        C.FAILED_PRECONDITION, "incarnation")


def test_spoofed_and_replayed_reports(cluster):
    co = cluster.coordinator
    inc = cluster.registration().incarnation
    for host, incarnation in (("host-a", "old"), ("host-a", inc), ("host-404", "i")):
        refused(cluster, lambda: co.ReportJobProgress(cpb.ReportJobProgressRequest(
            job_id="job-404", host=host, incarnation=incarnation,
            state=job_pb2.JOB_STATE_SUCCEEDED, last_step=10), timeout=TIMEOUT), C.NOT_FOUND)
        refused(cluster, lambda: co.ReportCheckpoint(cpb.ReportCheckpointRequest(
            job_id="job-404", host=host, incarnation=incarnation, step=3), timeout=TIMEOUT),
            C.NOT_FOUND)
    refused(cluster, lambda: co.ReportJobProgress(cpb.ReportJobProgressRequest(),
                                                  timeout=TIMEOUT), C.INVALID_ARGUMENT)


def test_telemetry_for_nothing(cluster):
    co = cluster.coordinator
    summary = tpb.HostSummary(job_id="job-404", step=-3, host="host-404")
    refused(cluster, lambda: co.UploadTelemetry(iter([summary]), timeout=TIMEOUT),
            C.NOT_FOUND, "job-404")
    # A registered host's summaries must carry its live incarnation: a stale one (a zombie)
    # or none (a spoof) is fenced.
    for incarnation in ("", "stale-incarnation"):
        summary = tpb.HostSummary(job_id="job-404", step=1, host="host-a", incarnation=incarnation)
        refused(cluster, lambda: co.UploadTelemetry(iter([summary]), timeout=TIMEOUT),
                C.FAILED_PRECONDITION, "incarnation")
    for watch in (co.WatchTelemetry, co.WatchTelemetryBatches):
        refused(cluster, lambda: watch(cpb.WatchTelemetryRequest(job_id="job-404"),
                                       timeout=TIMEOUT), C.NOT_FOUND, "job-404")
        refused(cluster, lambda: watch(cpb.WatchTelemetryRequest(), timeout=TIMEOUT),
                C.INVALID_ARGUMENT, "job_id")
    refused(cluster, lambda: co.GetMetrics(cpb.GetMetricsRequest(host="host-404"),
                                           timeout=TIMEOUT), C.NOT_FOUND, "host-404")
    refused(cluster, lambda: co.GetDeviceMemory(cpb.GetDeviceMemoryRequest(host="host-404"),
                                                timeout=TIMEOUT), C.NOT_FOUND, "host-404")


# --------------------------------------------------------------------- Coordinator: key-value
def test_key_value_abuse(cluster):
    co = cluster.coordinator
    refused(cluster, lambda: co.KeyValueSet(cpb.KeyValueSetRequest(
        key="hostile/big", value=b"x" * (2 << 20)), timeout=30), C.INVALID_ARGUMENT, "value")
    refused(cluster, lambda: co.KeyValueSet(cpb.KeyValueSetRequest(key="", value=b"v"),
                                            timeout=TIMEOUT), C.INVALID_ARGUMENT, "key")
    refused(cluster, lambda: co.KeyValueSet(cpb.KeyValueSetRequest(key="hostile/", value=b"v"),
                                            timeout=TIMEOUT), C.INVALID_ARGUMENT, "key")
    refused(cluster, lambda: co.KeyValueTryGet(cpb.KeyValueGetRequest(key="hostile/none"),
                                               timeout=TIMEOUT), C.NOT_FOUND, "hostile/none")
    refused(cluster, lambda: co.KeyValueGet(cpb.KeyValueGetRequest(
        key="hostile/none", timeout_millis=-5), timeout=TIMEOUT), C.INVALID_ARGUMENT,
        "timeout_millis")
    refused(cluster, lambda: co.KeyValueDelete(cpb.KeyValueDeleteRequest(key=""),
                                               timeout=TIMEOUT), C.INVALID_ARGUMENT)
    refused(cluster, lambda: co.WaitAtBarrier(cpb.WaitAtBarrierRequest(
        barrier_id="hostile-b", task="t9", tasks=["t0", "t1"], timeout_millis=100),
        timeout=TIMEOUT), C.INVALID_ARGUMENT, "t9")
    refused(cluster, lambda: co.WaitAtBarrier(cpb.WaitAtBarrierRequest(
        barrier_id="", task="t0", tasks=["t0"]), timeout=TIMEOUT), C.INVALID_ARGUMENT)


# ---------------------------------------------------------------------------------- Worker
def chunks(*items):
    return iter([wpb.LoadExecutableChunk(**c) for c in items])


def test_bogus_chunk_sequences(cluster):
    w = cluster.worker
    data = b"not really an executable" * 10
    fp = hashlib.sha256(data).hexdigest()
    load = lambda *c: w.LoadExecutable(chunks(*c), timeout=TIMEOUT)  # noqa: E731
    refused(cluster, lambda: load(), C.INVALID_ARGUMENT)
    refused(cluster, lambda: load({"offset": 0, "data": data}), C.INVALID_ARGUMENT, "fingerprint")
    refused(cluster, lambda: load({"fingerprint": "../x", "total_bytes": 3, "data": b"abc"}),
            C.INVALID_ARGUMENT, "fingerprint")
    refused(cluster, lambda: load({"fingerprint": fp, "total_bytes": -1, "data": data}),
            C.INVALID_ARGUMENT, "total_bytes")
    refused(cluster, lambda: load({"fingerprint": fp, "total_bytes": len(data), "data": data[:10]},
                                  {"offset": 20, "data": data[20:]}), C.INVALID_ARGUMENT, "offset")
    refused(cluster, lambda: load({"fingerprint": fp, "total_bytes": 5, "data": data}),
            C.INVALID_ARGUMENT, "total_bytes")
    refused(cluster, lambda: load({"fingerprint": fp, "total_bytes": len(data), "data": data,
                                   "sha256": "0" * 64}), C.DATA_LOSS)
    refused(cluster, lambda: load({"fingerprint": fp, "total_bytes": len(data) + 1, "data": data,
                                   "sha256": fp}), C.DATA_LOSS)
    # An absurd size is refused (INVALID_ARGUMENT) or the short stream is (DATA_LOSS): nothing
    # is kept either way.
    refused(cluster, lambda: load({"fingerprint": fp, "total_bytes": 1 << 60, "data": data}),
            (C.INVALID_ARGUMENT, C.DATA_LOSS))


def test_worker_start_job_hostile_manifests(cluster):
    w = cluster.worker
    s = spec(state_count=-1)
    for manifest in (job_pb2.JobManifest(), job_pb2.JobManifest(job_id="job-x", spec=s),
                     job_pb2.JobManifest(job_id="job-x", spec=spec(state_count=1 << 30))):
        refused(cluster, lambda: w.StartJob(wpb.StartJobRequest(job_id="job-x", manifest=manifest),
                                            timeout=TIMEOUT), C.INVALID_ARGUMENT)


def test_worker_refuses_data_outside_its_roots(cluster):
    # The worker opens a job's files only under its --data_root (examples/ here), whatever the
    # coordinator let through: each path naming /etc is refused before anything is opened.
    def change(s, field, value):  # field: a dotted path in the spec
        *parents, name = field.split(".")
        message = s
        for parent in parents:
            message = getattr(message, parent)
        setattr(message, name, value)
        return s
    for field, value in (("data.example_bundle", "/etc/passwd"),
                         ("data.token_shards_glob", "/etc/*"),
                         ("data.array_file", "/etc/hostname"),
                         ("checkpoint.directory", "/etc/meshrun-checkpoints"),
                         ("resume_from", "/etc")):
        manifest = job_pb2.JobManifest(job_id="job-x", spec=change(spec(), field, value))
        refused(cluster, lambda: cluster.worker.StartJob(
            wpb.StartJobRequest(job_id="job-x", manifest=manifest), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, f'spec.{field} "{value}" is outside', "--data_root=")


def test_worker_other_calls(cluster):
    w = cluster.worker
    refused(cluster, lambda: w.StopJob(wpb.StopJobRequest(job_id="job-404"), timeout=TIMEOUT),
            C.NOT_FOUND, "job-404")
    refused(cluster, lambda: w.CheckpointNow(wpb.CheckpointNowRequest(job_id="job-404"),
                                             timeout=TIMEOUT), C.NOT_FOUND, "job-404")
    refused(cluster, lambda: w.GetDeviceMemory(wpb.WorkerDeviceMemoryRequest(
        runtime_name="no-such-device"), timeout=TIMEOUT), C.NOT_FOUND, "no-such-device")
    prog = job_pb2.Program(role="step", stablehlo=b"\x00garbage")
    refused(cluster, lambda: list(w.CompileProgram(wpb.CompileProgramRequest(program=prog),
                                                   timeout=60)), C.INVALID_ARGUMENT)
    refused(cluster, lambda: list(w.CompileProgram(wpb.CompileProgramRequest(), timeout=60)),
            C.INVALID_ARGUMENT)


def test_versions_answer(cluster):
    assert cluster.coordinator.GetSupportedVersions(cpb.GetSupportedVersionsRequest(),
                                                    timeout=TIMEOUT).ByteSize() > 0
    assert cluster.worker.GetSupportedVersions(wpb.GetWorkerSupportedVersionsRequest(),
                                               timeout=TIMEOUT).ByteSize() > 0
    assert cluster.both_healthy()


# ------------------------------------------------- Every other RPC: listings, admin, replays
def answered(cluster, call):
    """Runs call(); it must succeed (the server ignores what it does not know) and leave both
    servers healthy and the observable state unchanged. Returns its answer."""
    before = cluster.state()
    result = call()
    assert cluster.running(), "a server exited:\n" + cluster.logs()
    assert cluster.both_healthy(), "a server stopped answering health:\n" + cluster.logs()
    assert cluster.state() == before
    return result


def raw(channel, method, response_type):
    """`method` called with request bytes as given: what an outside client on another proto
    (a newer one with paging, say) or a broken encoder sends."""
    return channel.unary_unary(method, request_serializer=lambda b: b,
                               response_deserializer=response_type.FromString)


def varint(n):
    n &= (1 << 64) - 1  # negative numbers as proto encodes int64
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def field(number, value):
    """One proto field: an int as a varint, bytes length-delimited."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


# Fields this proto does not have (page tokens and sizes, filters, limits), out of range.
UNKNOWN_FIELDS = (field(1, b"\xff" * 64) + field(2, -1) + field(3, b"state=RUNNING' OR 1=1") +
                  field(4, (1 << 63) - 1) + field(99, b"x" * 4096))
MALFORMED = (b"\x0a\xff\xff\xff\xff\x0f",  # a length past the end
             b"\x08",  # a varint cut short
             b"\x80" * 11)  # a varint longer than 10 bytes
# What gRPC's callback API answers a request that does not parse, before any handler runs:
# UNIMPLEMENTED with no message (Debian's gRPC 1.51); INTERNAL in other versions.
UNPARSED = (C.UNIMPLEMENTED, C.INTERNAL)


@pytest.fixture(scope="module")
def finished_job(cluster):
    """A job that ran to SUCCEEDED on host-a, and one genuine telemetry summary of it."""
    co = cluster.coordinator
    job_id = submit(cluster, spec()).job_id
    deadline = time.monotonic() + 150
    job = co.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=TIMEOUT)
    while job.state != job_pb2.JOB_STATE_SUCCEEDED:
        assert job.state not in (job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED), \
            f"{job}\n{cluster.logs()}"
        assert time.monotonic() < deadline, f"not finished: {job}\n{cluster.logs()}"
        time.sleep(0.2)
        job = co.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=TIMEOUT)
    cluster.wait_idle()
    history = list(co.WatchTelemetry(cpb.WatchTelemetryRequest(
        job_id=job_id, host_detail=True, history_only=True), timeout=TIMEOUT))
    assert history and history[-1].host_detail, f"no telemetry: {history}"
    return job, history


def history_of(cluster, job_id):
    return [s.SerializeToString() for s in cluster.coordinator.WatchTelemetry(
        cpb.WatchTelemetryRequest(job_id=job_id, host_detail=True, history_only=True),
        timeout=TIMEOUT)]


def test_list_jobs_unknown_and_malformed_requests(cluster, finished_job):
    listed = raw(cluster.cchan, "/meshrun.v1.Coordinator/ListJobs", cpb.ListJobsResponse)
    plain = cluster.coordinator.ListJobs(cpb.ListJobsRequest(), timeout=TIMEOUT)
    # Paging and filters this server does not have are ignored: the whole list, as it was.
    got = answered(cluster, lambda: listed(UNKNOWN_FIELDS, timeout=TIMEOUT))
    assert sorted(j.job_id for j in got.jobs) == sorted(j.job_id for j in plain.jobs)
    assert finished_job[0].job_id in [j.job_id for j in got.jobs]
    for bad in MALFORMED:  # bytes that are no request at all: refused by gRPC, nothing run
        refused(cluster, lambda: listed(bad, timeout=TIMEOUT), UNPARSED)


def test_list_workers_job_filter(cluster, finished_job):
    co = cluster.coordinator
    for job_id in ("job-404", "../job-1", "x" * 4096):
        refused(cluster, lambda: co.ListWorkers(cpb.ListWorkersRequest(job_id=job_id),
                                                timeout=TIMEOUT), C.NOT_FOUND)
    # A finished job's pin explains nothing away: host-a is listed, not excluded.
    got = answered(cluster, lambda: co.ListWorkers(
        cpb.ListWorkersRequest(job_id=finished_job[0].job_id), timeout=TIMEOUT))
    assert [w.exclusion_reason for w in got.workers if w.registration.host == "host-a"] == [""]


def test_batched_watch_carries_the_same_summaries(cluster, finished_job):
    # A history read is backlog through and through: the batched stream packs it into few
    # messages, byte for byte the summaries the one-per-message stream sends, in order.
    co = cluster.coordinator
    job, history = finished_job
    for since_step, names in ((0, []), (2, []), (0, [history[-1].values[0].name])):
        request = cpb.WatchTelemetryRequest(job_id=job.job_id, host_detail=True,
                                            history_only=True, since_step=since_step,
                                            names=names)
        single = [s.SerializeToString() for s in co.WatchTelemetry(request, timeout=TIMEOUT)]
        batches = list(co.WatchTelemetryBatches(request, timeout=TIMEOUT))
        assert single and all(b.summaries for b in batches)
        assert [s.SerializeToString() for b in batches for s in b.summaries] == single
        assert len(batches) < len(single) or len(single) == 1


def test_key_value_list_bad_prefixes(cluster):
    co = cluster.coordinator
    co.KeyValueSet(cpb.KeyValueSetRequest(key="hostile/kept", value=b"v", allow_overwrite=True),
                   timeout=TIMEOUT)
    refused(cluster, lambda: co.KeyValueList(cpb.KeyValueListRequest(directory=""),
                                             timeout=TIMEOUT), C.INVALID_ARGUMENT, "directory")
    # Prefixes that climb, are empty components, or are past the key length match nothing.
    for directory in ("/", "../hostile", "hostile/../", "hostile//", "\x00", "h" * (64 << 10)):
        got = answered(cluster, lambda: co.KeyValueList(
            cpb.KeyValueListRequest(directory=directory), timeout=TIMEOUT))
        assert not got.entries, (directory[:20], got)
    # A limit this proto does not have, huge, is ignored: the directory as it is.
    listed = raw(cluster.cchan, "/meshrun.v1.Coordinator/KeyValueList",
                 cpb.KeyValueListResponse)
    got = answered(cluster, lambda: listed(field(1, b"hostile") + field(2, (1 << 63) - 1) +
                                           field(3, -1), timeout=TIMEOUT))
    assert [(e.key, e.value) for e in got.entries] == [("hostile/kept", b"v")]


def test_worker_get_status_unknown_and_malformed(cluster):
    status = raw(cluster.wchan, "/meshrun.v1.Worker/GetStatus", wpb.WorkerStatusReport)
    got = answered(cluster, lambda: status(UNKNOWN_FIELDS, timeout=TIMEOUT))
    assert got.host == "host-a" and got.incarnation == cluster.registration().incarnation
    for bad in MALFORMED:
        refused(cluster, lambda: status(bad, timeout=TIMEOUT), UNPARSED)


def test_preempt_job_hostile(cluster, finished_job):
    co = cluster.coordinator
    job = finished_job[0]
    inc = cluster.registration().incarnation
    preempt = lambda **f: co.PreemptJob(cpb.PreemptJobRequest(**f), timeout=TIMEOUT)  # noqa
    refused(cluster, lambda: preempt(), C.INVALID_ARGUMENT, "job_id")
    refused(cluster, lambda: preempt(job_id="job-404", host="host-a", incarnation=inc),
            C.NOT_FOUND, "job-404")
    refused(cluster, lambda: preempt(job_id=job.job_id, host="host-404", incarnation="i"),
            C.FAILED_PRECONDITION, "host-404")
    refused(cluster, lambda: preempt(job_id=job.job_id, host="host-a", incarnation="old"),
            C.FAILED_PRECONDITION, "incarnation")
    for attempt in (-1, 7, 2**31 - 1, -2**31):  # runs that never were
        refused(cluster, lambda: preempt(job_id=job.job_id, host="host-a", incarnation=inc,
                                         attempt=attempt), C.FAILED_PRECONDITION, "run")
    # The genuine notice, for a job that no longer runs (nor has a checkpoint policy).
    refused(cluster, lambda: preempt(job_id=job.job_id, host="host-a", incarnation=inc,
                                     attempt=len(job.attempts)), C.FAILED_PRECONDITION,
            job.job_id)


def test_drain_worker_hostile(cluster):
    co = cluster.coordinator
    # This cluster runs without tokens, so every caller is an admin; the secure cluster test
    # covers a caller without the admin role.
    refused(cluster, lambda: co.DrainWorker(cpb.DrainWorkerRequest(), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, "host")
    for host in ("host-404", "../host-a", "host-a\x00", "h" * 4096):
        refused(cluster, lambda: co.DrainWorker(cpb.DrainWorkerRequest(host=host),
                                                timeout=TIMEOUT), C.NOT_FOUND, "not registered")


def test_replayed_real_reports_are_refused(cluster, finished_job):
    """The worker's own final report and one of its own telemetry summaries, sent again after
    the job finished: refused, and the job and its history stay as they were."""
    co = cluster.coordinator
    job, history = finished_job
    host, incarnation = next(iter(job.host_incarnations.items()))
    before = co.GetJob(cpb.GetJobRequest(job_id=job.job_id), timeout=TIMEOUT)
    recorded = history_of(cluster, job.job_id)
    report = cpb.ReportJobProgressRequest(job_id=job.job_id, host=host, incarnation=incarnation,
                                          state=job_pb2.JOB_STATE_SUCCEEDED,
                                          last_step=job.last_step, attempt=len(job.attempts))
    for state in (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_RUNNING,
                  job_pb2.JOB_STATE_FAILED):
        report.state = state
        refused(cluster, lambda: co.ReportJobProgress(report, timeout=TIMEOUT),
                C.FAILED_PRECONDITION, "already ended")
    summary = tpb.HostSummary()
    summary.CopyFrom(history[-1].host_detail[0])
    summary.incarnation = summary.incarnation or incarnation
    summary.attempt = len(job.attempts)
    refused(cluster, lambda: co.UploadTelemetry(iter([summary]), timeout=TIMEOUT),
            C.NOT_FOUND, job.job_id)
    after = co.GetJob(cpb.GetJobRequest(job_id=job.job_id), timeout=TIMEOUT)
    assert (after.state, after.last_step, after.finished_unix_micros) == \
        (before.state, before.last_step, before.finished_unix_micros)
    assert history_of(cluster, job.job_id) == recorded
