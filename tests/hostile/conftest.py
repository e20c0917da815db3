"""A real coordinator and worker on 127.0.0.1 (the binaries in $MESHRUN_BIN_DIR) for the
hostile-client suite, plus what every case checks afterwards: both servers still answer gRPC
health, and the observable state (workers, jobs, keys, the worker's executables and job) is
what it was before the call."""
import os
import re
import shutil
import subprocess
import tempfile
import time

import grpc
import pytest

from meshrun.v1 import coordinator_pb2 as cpb
from meshrun.v1 import coordinator_pb2_grpc as cgrpc
from meshrun.v1 import worker_pb2 as wpb
from meshrun.v1 import worker_pb2_grpc as wgrpc

TIMEOUT = 10.0
# The worker reads jobs' example bundles only here (its --data_root).
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")


def _bin(name):
    return os.path.join(os.environ.get("MESHRUN_BIN_DIR", ""), name)


def _wait_for(path, pattern, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            m = re.search(pattern, open(path, errors="replace").read())
            if m:
                return m
        time.sleep(0.1)
    raise TimeoutError(f"{pattern!r} not in {path}:\n{open(path).read()[-3000:]}")


def health(channel):
    """grpc.health.v1.Health/Check for the server as a whole ("" service): True when SERVING.
    The request is the empty HealthCheckRequest; the answer's field 1 is the status (1)."""
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        return check(b"", timeout=5) == b"\x08\x01"
    except grpc.RpcError:
        return False


class Cluster:
    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        clog = os.path.join(tmp, "coordinator.log")
        self._start([_bin("meshrun-coordinator"), "--listen=127.0.0.1:0",
                     f"--state_dir={tmp}/coordinator",
                     # a worker paused (SIGSTOP) by a test stays ALIVE meanwhile
                     "--heartbeat_timeout=60s"], clog)
        port = _wait_for(clog, r"listening on port (\d+)").group(1)
        self.address = f"127.0.0.1:{port}"
        wlog = os.path.join(tmp, "worker.log")
        self._start([_bin("meshrun-worker"), "--listen=127.0.0.1:0",
                     f"--coordinator={self.address}", "--host=host-a", "--worker_index=0",
                     f"--state_dir={tmp}/worker", "--cpu_devices=1",
                     f"--data_root={EXAMPLES}"], wlog)
        wport = _wait_for(wlog, r"listening on port (\d+)").group(1)
        self.worker_address = f"127.0.0.1:{wport}"
        opts = [("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_receive_message_length", 64 << 20)]
        self.cchan = grpc.insecure_channel(self.address, options=opts)
        self.wchan = grpc.insecure_channel(self.worker_address, options=opts)
        self.coordinator = cgrpc.CoordinatorStub(self.cchan)
        self.worker = wgrpc.WorkerStub(self.wchan)
        deadline = time.monotonic() + 60
        while not self.alive_workers():
            if time.monotonic() > deadline:
                raise TimeoutError("worker did not register:\n" + self.logs())
            time.sleep(0.2)

    def _start(self, argv, log):
        self.procs.append(subprocess.Popen(argv, stdout=open(log, "w"),
                                           stderr=subprocess.STDOUT))

    def alive_workers(self):
        r = self.coordinator.ListWorkers(cpb.ListWorkersRequest(), timeout=TIMEOUT)
        return [w for w in r.workers if w.state == cpb.WORKER_STATE_ALIVE]

    def registration(self):
        return self.alive_workers()[0].registration

    def logs(self):
        return "\n".join(f"--- {f}\n" + open(os.path.join(self.tmp, f), errors="replace")
                         .read()[-3000:] for f in sorted(os.listdir(self.tmp))
                         if f.endswith(".log"))

    def state(self):
        """What a hostile call must leave unchanged."""
        workers = sorted((w.registration.host, w.registration.address,
                          w.registration.incarnation, w.state)
                         for w in self.coordinator.ListWorkers(cpb.ListWorkersRequest(),
                                                               timeout=TIMEOUT).workers)
        jobs = sorted((j.job_id, j.state) for j in
                      self.coordinator.ListJobs(cpb.ListJobsRequest(), timeout=TIMEOUT).jobs)
        keys = sorted((e.key, e.value) for e in self.coordinator.KeyValueList(
            cpb.KeyValueListRequest(directory="hostile"), timeout=TIMEOUT).entries)
        status = self.worker.GetStatus(wpb.GetStatusRequest(), timeout=TIMEOUT)
        return {"workers": workers, "jobs": jobs, "keys": keys,
                "executables": sorted(status.executable_fingerprints),
                "running": status.running_job_id, "incarnation": status.incarnation}

    def wait_idle(self, timeout=30.0):
        """Waits until the worker runs no job (a cancel stops it asynchronously)."""
        deadline = time.monotonic() + timeout
        while self.worker.GetStatus(wpb.GetStatusRequest(), timeout=TIMEOUT).running_job_id:
            assert time.monotonic() < deadline, "the worker still runs a job:\n" + self.logs()
            time.sleep(0.1)

    def both_healthy(self):
        return health(self.cchan) and health(self.wchan)

    def running(self):
        return all(p.poll() is None for p in self.procs)

    def stop(self):
        for p in self.procs:  # only the processes this fixture started
            p.kill()
            p.wait()


@pytest.fixture(scope="session")
def cluster():
    if not os.path.exists(_bin("meshrun-coordinator")):
        pytest.skip("MESHRUN_BIN_DIR does not hold the meshrun binaries")
    tmp = tempfile.mkdtemp(prefix="meshrun-hostile-")
    c = Cluster(tmp)
    yield c
    c.stop()
    shutil.rmtree(tmp, ignore_errors=True)
