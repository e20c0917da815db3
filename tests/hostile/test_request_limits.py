"""Request size and memory (issue 27 item 6; labels fault, security): no request message is
parsed past --max_request_bytes, gRPC's buffers for requests being received stay under
--max_request_memory, and programs, the one big thing a client sends, come in chunks of
UploadProgram that are checked before they count."""
import hashlib
import os
import re
import subprocess
import tempfile
import time

import grpc

from meshrun.v1 import coordinator_pb2 as cpb
from meshrun.v1 import coordinator_pb2_grpc as cgrpc
from meshrun.v1 import job_pb2

from conftest import TIMEOUT, _bin, _wait_for, health
from test_hostile_client import refused, spec, submit

C = grpc.StatusCode
MIB = 1 << 20


def raw_list_jobs(channel, padding):
    """A ListJobsRequest carrying `padding` bytes in an unknown field (number 15)."""
    size, varint = padding, b""
    while True:
        byte, size = size & 0x7F, size >> 7
        varint += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    call = channel.unary_unary("/meshrun.v1.Coordinator/ListJobs",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return lambda: call(bytes([15 << 3 | 2]) + varint + b"x" * padding, timeout=60)


def chunks(data, sha=None, total=None, size=MIB):
    for offset in range(0, max(len(data), 1), size):
        chunk = cpb.ProgramChunk(data=data[offset:offset + size])
        if offset == 0:
            chunk.sha256 = hashlib.sha256(data).hexdigest() if sha is None else sha
            chunk.total_bytes = len(data) if total is None else total
        yield chunk


def test_a_request_over_the_limit_is_refused_unparsed(cluster):
    refused(cluster, raw_list_jobs(cluster.cchan, 20 * MIB), C.RESOURCE_EXHAUSTED,
            "larger than max")


def test_program_uploads_are_checked_before_they_count(cluster):
    up = cluster.coordinator.UploadProgram
    data = b"module @junk {}" * 1000
    refused(cluster, lambda: up(chunks(data, sha=""), timeout=TIMEOUT), C.INVALID_ARGUMENT,
            "sha256")
    refused(cluster, lambda: up(chunks(data, total=257 * MIB), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, "total_bytes", "limit")
    refused(cluster, lambda: up(chunks(data, total=len(data) - 1), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, "more than")
    refused(cluster, lambda: up(chunks(data, sha="a" * 64), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, "sha256", "a" * 64)
    big = os.urandom(2 * MIB)
    refused(cluster, lambda: up(chunks(big, size=2 * MIB), timeout=TIMEOUT),
            C.INVALID_ARGUMENT, "chunk", "at most")
    unknown = spec()
    unknown.programs[1].ClearField("stablehlo")
    unknown.programs[1].stablehlo_sha256 = hashlib.sha256(b"never sent").hexdigest()
    refused(cluster, lambda: submit(cluster, unknown), C.FAILED_PRECONDITION,
            "programs[1].stablehlo_sha256", "upload")


def test_a_program_past_the_request_limit_comes_by_upload(cluster):
    """12 MiB of StableHLO: inline, SubmitJob is refused unread; uploaded, the job is taken
    and its bytes are the ones compiled (the junk fails to parse)."""
    inline = spec()
    inline.programs[1].stablehlo = b"not stablehlo " * (12 * MIB // 14)
    refused(cluster, lambda: submit(cluster, inline), C.RESOURCE_EXHAUSTED, "larger than max")

    sent = cluster.coordinator.UploadProgram(chunks(inline.programs[1].stablehlo),
                                             timeout=TIMEOUT)
    assert sent.sha256 == hashlib.sha256(inline.programs[1].stablehlo).hexdigest()
    assert sent.bytes == len(inline.programs[1].stablehlo)
    named = spec()
    named.programs[1].ClearField("stablehlo")
    named.programs[1].stablehlo_sha256 = sent.sha256
    job_id = submit(cluster, named).job_id
    deadline = time.monotonic() + 60
    while True:
        job = cluster.coordinator.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=TIMEOUT)
        if job.state in (job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_SUCCEEDED):
            break
        assert time.monotonic() < deadline, f"job still {job.state}:\n{cluster.logs()}"
        time.sleep(0.2)
    assert job.state == job_pb2.JOB_STATE_FAILED
    assert "'not' is unknown" in job.error, job.error  # the uploaded junk was compiled
    assert not job.spec.programs[1].stablehlo, "the manifest carries no program bytes"
    cluster.wait_idle()


def vm_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(key + r":\s+(\d+) kB", f.read()).group(1))


def test_request_memory_is_bounded():
    """A 300 MiB request against a coordinator allowed 64 MiB of request buffers: gRPC resets
    the stream instead of buffering it whole, the coordinator goes on serving, and its resident
    memory comes back."""
    tmp = tempfile.mkdtemp(prefix="meshrun-request-memory-")
    log = os.path.join(tmp, "coordinator.log")
    coord = subprocess.Popen([_bin("meshrun-coordinator"), "--listen=127.0.0.1:0",
                              f"--state_dir={tmp}/state", "--pjrt_plugin=",
                              f"--max_request_memory={64 * MIB}"],
                             stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        port = _wait_for(log, r"listening on port (\d+)").group(1)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                        options=[("grpc.max_send_message_length", 512 * MIB)])
        stub = cgrpc.CoordinatorStub(channel)
        stub.ListJobs(cpb.ListJobsRequest(), timeout=TIMEOUT)
        before, rss = vm_kib(coord.pid, "VmHWM"), vm_kib(coord.pid, "VmRSS")
        try:
            raw_list_jobs(channel, 300 * MIB)()
            raise AssertionError("a 300 MiB request was answered")
        except grpc.RpcError as e:
            assert e.code() == C.RESOURCE_EXHAUSTED, f"{e.code()} {e.details()}"
        grown = (vm_kib(coord.pid, "VmHWM") - before) // 1024
        assert grown < 200, f"peak memory grew {grown} MiB for one refused request"
        assert coord.poll() is None and health(channel), open(log).read()[-3000:]
        stub.ListJobs(cpb.ListJobsRequest(), timeout=TIMEOUT)
        if "ASAN_OPTIONS" in os.environ:  # ASan's allocator keeps freed memory in quarantine
            return
        # ... and hands the buffers' pages back within its 10 s trim period
        deadline = time.monotonic() + 25
        while (vm_kib(coord.pid, "VmRSS") - rss) // 1024 > 32:
            assert time.monotonic() < deadline, \
                f"RSS still {(vm_kib(coord.pid, 'VmRSS') - rss) // 1024} MiB over its start"
            time.sleep(0.5)
        print(f"peak memory grew {grown} MiB for a refused 300 MiB request, then came back")
    finally:
        coord.kill()
        coord.wait()
