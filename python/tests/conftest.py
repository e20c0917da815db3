"""Fixtures of the SDK tests: JAX on 8 CPU devices, and a real coordinator + worker on
loopback (the binaries in $MESHRUN_BIN_DIR, as ctest passes them)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402


def _bin(name):
    return os.path.join(os.environ.get("MESHRUN_BIN_DIR", ""), name)


def _wait_for(path, pattern, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            m = re.search(pattern, open(path, errors="replace").read())
            if m:
                return m
        time.sleep(0.1)
    raise TimeoutError(f"{pattern!r} not in {path}: {open(path).read()[-2000:]}")


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")


class Cluster:
    # One worker per device count the tests' meshes need (a mesh spans all of a host's
    # devices): the conv net's 2 x 2, and the examples' dp1 LM.
    def __init__(self, tmp, devices=(4, 1)):
        self.tmp = tmp
        self.procs = []
        log = os.path.join(tmp, "coordinator.log")
        self._start([_bin("meshrun-coordinator"), "--listen=127.0.0.1:0",
                     f"--state_dir={tmp}/coordinator",
                     # the tests' token shards are under pytest's temporary directories
                     f"--data_root={tempfile.gettempdir()}"], log)
        port = _wait_for(log, r"listening on port (\d+)").group(1)
        self.address = f"127.0.0.1:{port}"
        self.worker_logs = []
        for w, n in enumerate(devices):
            wlog = os.path.join(tmp, f"worker-{w}.log")
            self.worker_logs.append(wlog)
            self.worker_pids = self._start(
                [_bin("meshrun-worker"), "--listen=127.0.0.1:0", f"--coordinator={self.address}",
                 f"--host=worker-{w}", f"--worker_index={w}", f"--state_dir={tmp}/worker-{w}",
                 f"--cpu_devices={n}",
                 # the tests' bundles and data: pytest's temporary directories, the examples
                 f"--data_root={tempfile.gettempdir()},{EXAMPLES}"],
                wlog)

    def _start(self, argv, log):
        p = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p.pid

    def cli(self, *args):
        return subprocess.run([_bin("meshrun"), f"--coordinator={self.address}", *args],
                              capture_output=True, text=True, timeout=120)

    def logs(self):
        return "\n".join(f"--- {f}\n" + open(os.path.join(self.tmp, f)).read()[-3000:]
                         for f in sorted(os.listdir(self.tmp)) if f.endswith(".log"))

    def stop(self):
        for p in self.procs:  # only the processes this fixture started
            p.kill()
            p.wait()


@pytest.fixture(scope="session")  # one cluster for every test module: its compile cache too
def cluster():
    if not os.path.exists(_bin("meshrun-coordinator")):
        pytest.skip("MESHRUN_BIN_DIR does not hold the meshrun binaries")
    tmp = tempfile.mkdtemp(prefix="meshrun-sdk-")
    c = Cluster(tmp)
    import meshrun
    client = meshrun.Client(c.address, timeout=10)
    deadline = time.monotonic() + 60
    while len(client.workers()) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("worker did not register:\n" + c.logs())
        time.sleep(0.2)
    c.client = client
    yield c
    # Every job the tests ran: its goodput partitions its wall time (docs/goodput.md).
    from google.protobuf import json_format
    sys.path.insert(0, os.path.join(os.path.dirname(EXAMPLES), "tests"))
    import goodput_check
    jobs = [json_format.MessageToDict(j, preserving_proto_field_name=True) for j in client.list()]
    bad = goodput_check.problems(jobs)
    client.close()
    c.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    assert not bad, "goodput does not add up:\n" + "\n".join(bad)
