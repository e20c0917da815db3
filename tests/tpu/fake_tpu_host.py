"""A stand-in TPU host for the coordinator's side of the TPU path, served over real gRPC: it
registers as one v6e-8 host (eight "TPU v6 lite" devices on a 2x4 grid, runtime identity "tpu"
with the sha256 of a given libtpu), heartbeats, receives executables (keeping each one's
sha256) and accepts StartJob/StopJob. It cannot run what it receives and is never asked to.
Used by tests/tpu/coordinator_compile_check.py and bench/tpu_compile_bench.py."""
import hashlib
import os
import threading
import time
from concurrent import futures

import grpc

from meshrun.v1 import common_pb2 as common
from meshrun.v1 import coordinator_pb2 as cpb
from meshrun.v1 import coordinator_pb2_grpc as cgrpc
from meshrun.v1 import worker_pb2 as wpb
from meshrun.v1 import worker_pb2_grpc as wgrpc

PROTOCOL = 1

class FakeTpuHost(wgrpc.WorkerServicer):
    def __init__(self, host, runtime, devices):
        self.host, self.runtime, self.devices = host, runtime, devices
        self.incarnation = os.urandom(8).hex()
        self.received = {}  # fingerprint -> sha256 of the bytes received
        self.started = []
        self.started_at = {}  # job id -> time.monotonic() of its StartJob

    def GetSupportedVersions(self, request, context):
        return common.SupportedVersions(min_version=1, max_version=PROTOCOL)

    def GetStatus(self, request, context):
        return wpb.WorkerStatusReport(host=self.host, incarnation=self.incarnation,
                                      runtime=self.runtime, devices=self.devices,
                                      executable_fingerprints=list(self.received))

    def LoadExecutable(self, request_iterator, context):
        data, fingerprint = bytearray(), ""
        for chunk in request_iterator:
            fingerprint = chunk.fingerprint or fingerprint
            data += chunk.data
        self.received[fingerprint] = hashlib.sha256(data).hexdigest()
        return wpb.LoadExecutableResponse(fingerprint=fingerprint, bytes_received=len(data))

    def StartJob(self, request, context):
        self.started.append(request.job_id)
        self.started_at[request.job_id] = time.monotonic()
        return wpb.StartJobResponse()

    def StopJob(self, request, context):
        return wpb.StopJobResponse()

def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

def serve_v6e8_host(coordinator, name, libtpu_sha256):
    """Starts a FakeTpuHost named `name`, registers it with the coordinator at `coordinator`
    and heartbeats every second until stop() is called. Returns (host, stop)."""
    runtime = common.RuntimeIdentity(platform_name="tpu", platform_version="TFRT TPU v6 lite",
                                     pjrt_api_major=0, pjrt_api_minor=81,
                                     plugin_sha256=libtpu_sha256)
    devices = [common.DeviceInfo(global_id=i, local_id=i, process_index=0, kind="TPU v6 lite",
                                 runtime_name=f"TPU:{i}", coords=[i % 2, i // 2, 0])
               for i in range(8)]
    host = FakeTpuHost(name, runtime, devices)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    wgrpc.add_WorkerServicer_to_server(host, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stub = cgrpc.CoordinatorStub(grpc.insecure_channel(coordinator))
    stub.RegisterWorker(cpb.RegisterWorkerRequest(registration=cpb.WorkerRegistration(
        protocol=common.ProtocolVersion(version=PROTOCOL), host=name,
        address=f"127.0.0.1:{port}", num_slices=1, runtime=runtime, devices=devices,
        incarnation=host.incarnation)), timeout=10)
    stopped = threading.Event()

    def beat():
        while not stopped.wait(1.0):
            try:
                stub.Heartbeat(cpb.HeartbeatRequest(host=name, incarnation=host.incarnation),
                               timeout=5)
            except grpc.RpcError:
                pass
    threading.Thread(target=beat, daemon=True).start()

    def stop():
        stopped.set()
        try:
            stub.DeregisterWorker(cpb.DeregisterWorkerRequest(host=name,
                                                              incarnation=host.incarnation),
                                  timeout=5)
        except grpc.RpcError:
            pass
        server.stop(0)
    return host, stop
