"""meshrun.Client: the coordinator's gRPC API from Python.

Every call has a deadline (`timeout` seconds). TLS: pass `tls_ca` (root certificates file) and,
for mutual TLS, `tls_cert` + `tls_key`; `token` is sent as `authorization: Bearer <token>` on
every call, and only over TLS (a token without tls_ca is refused). With TLS the server must present the coordinator's certificate (its DNS name
meshrun-coordinator, which `meshrun certs issue` gives coordinators only), so a worker or any
other cluster member at that address is refused before the token is sent. The address
defaults to $MESHRUN_COORDINATOR, then 127.0.0.1:7070 (as the CLI).
Errors are grpc.RpcError (the server's status code and message) or meshrun.BundleError."""
import hashlib
import os
import time
import warnings

import grpc

from meshrun.bundle import job_spec_from_bundle
from meshrun.checkpoints import apply_checkpoint_options
from meshrun.errors import BundleError
from meshrun.v1 import coordinator_pb2, coordinator_pb2_grpc, job_pb2

_NONFINITE = {"fail": job_pb2.NONFINITE_FAIL, "warn": job_pb2.NONFINITE_WARN,
              "ignore": job_pb2.NONFINITE_IGNORE}

DEFAULT_ADDRESS = "127.0.0.1:7070"
COORDINATOR_TLS_NAME = "meshrun-coordinator"  # rpc/cert_authority.h kCoordinatorDnsName
_TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
PROGRAM_CHUNK_BYTES = 1 << 20  # common/protocol.h kMaxProgramChunkBytes


def _read(path):
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class Client:
    def __init__(self, address=None, *, tls_ca=None, tls_cert=None, tls_key=None, token=None,
                 timeout=30.0):
        self.address = address or os.environ.get("MESHRUN_COORDINATOR") or DEFAULT_ADDRESS
        self.timeout = timeout
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together (mutual TLS)")
        if token and not (tls_ca or tls_cert):
            raise ValueError("token= needs TLS (tls_ca= at least): a bearer token is never sent "
                             "in plaintext, where anyone on the path could read and replay it")
        if tls_ca or tls_cert:
            creds = grpc.ssl_channel_credentials(root_certificates=_read(tls_ca),
                                                 private_key=_read(tls_key),
                                                 certificate_chain=_read(tls_cert))
            # The server's identity: only coordinator certificates carry this name.
            self._channel = grpc.secure_channel(
                self.address, creds,
                options=(("grpc.ssl_target_name_override", COORDINATOR_TLS_NAME),))
        else:
            self._channel = grpc.insecure_channel(self.address)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                           metadata=self._metadata)

    # ------------------------------------------------------------------ jobs
    def submit(self, job, *, steps=100, cadence=10, data=None, host_replicas=0,
               checkpoint_dir=None, checkpoint_every=100, keep_checkpoints=3, resume_from=None,
               max_restarts=None, on_nonfinite="fail", memory_checkpoint_every=None):
        """job: a bundle directory (or its job.json) or a meshrun.v1.job_pb2.JobSpec.
        Returns the job id. data: None = the bundle's batches, "synthetic", an array-batch
        file (meshrun.data.write_arrays: the step's batch inputs), or a token shard glob.
        Checkpoints (docs/checkpoints.md), as the CLI's flags of the same names:
        checkpoint_dir (shared by every host; must exist) with a checkpoint after every
        `checkpoint_every`-th step and the last, the newest `keep_checkpoints` kept (0 = all);
        resume_from: a committed step directory, a checkpoint directory (its newest step) or a
        job id (its newest committed checkpoint); max_restarts: automatic restarts from the last
        checkpoint (None = the coordinator's default, 0 = never); memory_checkpoint_every: each
        host also keeps its state in memory every N-th step for restarts (None = 10, 0 = never).
        on_nonfinite: what a logging
        step whose loss, grad norm or other scalar series is NaN or infinite does: "fail" (the
        job ends FAILED naming the step and series; checkpoints kept), "warn" or "ignore".
        A JobSpec gets these options on a copy; steps, cadence, data and host_replicas apply
        to bundles only. Warnings the coordinator accepted the job despite (an array file
        without a header) are issued as Python warnings."""
        policy = _NONFINITE.get(on_nonfinite)
        if policy is None:
            raise ValueError(f"on_nonfinite={on_nonfinite!r} is not one of {sorted(_NONFINITE)}")
        options = dict(checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                       keep_checkpoints=keep_checkpoints, resume_from=resume_from,
                       max_restarts=max_restarts, get_job=self._job_to_resume,
                       memory_checkpoint_every=memory_checkpoint_every)
        if isinstance(job, job_pb2.JobSpec):
            spec = job_pb2.JobSpec()
            spec.CopyFrom(job)
            apply_checkpoint_options(spec, **options)
        else:
            spec = job_spec_from_bundle(os.fspath(job), steps=steps, cadence=cadence, data=data,
                                        host_replicas=host_replicas, **options)
        spec.on_nonfinite = policy
        self._upload_programs(spec)
        response = self._call("SubmitJob", coordinator_pb2.SubmitJobRequest(spec=spec))
        for warning in response.warnings:
            warnings.warn(f"{response.job_id}: {warning}", stacklevel=2)
        return response.job_id

    def _upload_programs(self, spec):
        """Sends each program's StableHLO ahead of the job (UploadProgram, 1 MiB chunks), so
        the SubmitJob request stays small however big the programs, and names it by sha256."""
        for program in spec.programs:
            data = program.stablehlo
            if not data:
                continue

            def chunks():
                for offset in range(0, len(data), PROGRAM_CHUNK_BYTES):
                    chunk = coordinator_pb2.ProgramChunk(
                        data=data[offset:offset + PROGRAM_CHUNK_BYTES])
                    if offset == 0:
                        chunk.sha256 = hashlib.sha256(data).hexdigest()
                        chunk.total_bytes = len(data)
                    yield chunk

            response = self._stub.UploadProgram(chunks(), timeout=self.timeout,
                                                metadata=self._metadata)
            program.ClearField("stablehlo")
            program.stablehlo_sha256 = response.sha256

    def _job_to_resume(self, job_id):
        try:
            return self.get(job_id)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            raise BundleError(f"resume_from {job_id} is neither a directory nor a job id") \
                from None

    def checkpoint(self, job_id):
        """Saves a running job's state now, after its current step (the CheckpointJob RPC; the
        job needs a checkpoint_dir). The checkpoint is committed once every host wrote its
        shards: get(job_id).checkpoints lists it. grpc.RpcError FAILED_PRECONDITION when the
        job has no checkpoint policy or is not running."""
        self._call("CheckpointJob", coordinator_pb2.CheckpointJobRequest(job_id=job_id))

    def get(self, job_id):
        """The job's manifest (meshrun.v1.job_pb2.JobManifest)."""
        return self._call("GetJob", coordinator_pb2.GetJobRequest(job_id=job_id))

    def list(self):
        return list(self._call("ListJobs", coordinator_pb2.ListJobsRequest()).jobs)

    def cancel(self, job_id):
        self._call("CancelJob", coordinator_pb2.CancelJobRequest(job_id=job_id))

    def wait(self, job_id, timeout=600.0, poll=0.2):
        """Polls until the job ends; returns its manifest. TimeoutError past `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            manifest = self.get(job_id)
            if job_pb2.JobState.Name(manifest.state).replace("JOB_STATE_", "") in _TERMINAL:
                return manifest
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job_pb2.JobState.Name(manifest.state)}")
            time.sleep(poll)

    # ------------------------------------------------------------------ telemetry
    def watch(self, job_id, *, since_step=0, names=(), host_detail=False, history_only=False,
              max_reconnects=20):
        """Yields GlobalSummary messages in step order until the job's stream ends. A dropped
        stream (coordinator restart, network, or this reader falling behind the live stream) is
        resumed from the step after the last one seen, so no summary is yielded twice.

        When the job restarts from a checkpoint (automatic recovery, docs/checkpoints.md), a
        rewind event comes through: a summary with `rewind` set (summary.HasField("rewind")),
        no values, and `step` the checkpoint's step. The summaries after it run the steps after
        that step again, so step order starts over there."""
        next_step = since_step
        failures = 0
        while True:
            request = coordinator_pb2.WatchTelemetryRequest(
                job_id=job_id, since_step=next_step, names=list(names), host_detail=host_detail,
                history_only=history_only)
            try:
                # A stream lives as long as the job: no overall deadline, the reconnect handles
                # a dead peer (gRPC keepalive-free channel ends with UNAVAILABLE).
                # Batches: a reader that is behind gets what is queued for it in one message.
                for batch in self._stub.WatchTelemetryBatches(request, metadata=self._metadata):
                    failures = 0
                    for summary in batch.summaries:
                        rewind = summary.HasField("rewind")
                        # The server sends each step once per stream; after a reconnect it may
                        # resend what this iterator already yielded. A rewind is always new.
                        if summary.step < next_step and not rewind:
                            continue
                        next_step = summary.step + 1
                        yield summary
                return
            except grpc.RpcError as e:
                # A watcher that fell behind the live stream is closed by the coordinator; the
                # steps it missed are in the history, so resume at once.
                fell_behind = (e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                               and "fell behind" in (e.details() or ""))
                if not fell_behind and e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                                        grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                failures += 1
                if failures > max_reconnects:
                    raise
                if not fell_behind:
                    time.sleep(min(0.1 * 2 ** failures, 2.0))

    def export(self, job_id, *, names=(), as_dataframe=None):
        """Every recorded summary as rows {step, name, index, value, step_time_seconds,
        wall_time_unix_micros} (one row per element of each series), or a pandas DataFrame when
        pandas is installed and as_dataframe is not False."""
        rows = []
        for s in self.watch(job_id, names=names, history_only=True):
            for v in s.values:
                for i, x in enumerate(v.values):
                    rows.append({"step": s.step, "name": v.name, "index": i, "value": x,
                                 "step_time_seconds": s.step_time_seconds,
                                 "wall_time_unix_micros": s.wall_time_unix_micros})
        if as_dataframe is False:
            return rows
        try:
            import pandas
        except ImportError:
            if as_dataframe:
                raise
            return rows
        return pandas.DataFrame(rows)

    # ------------------------------------------------------------------ fleet
    def workers(self):
        return list(self._call("ListWorkers", coordinator_pb2.ListWorkersRequest()).workers)

    def metrics(self, host=""):
        """{host: {metric name: value}} from every worker (or one host)."""
        response = self._call("GetMetrics", coordinator_pb2.GetMetricsRequest(host=host))
        return {h.host: {m.name: m for m in h.metrics} for h in response.hosts}
