"""Memory soak (issue 16): a real meshrun-coordinator takes N submitted-and-finished jobs plus a
key-value flood, and its resident memory must grow by less than a bound.

The jobs are tiny and finish at once: no worker is registered, so each is validated, stored
(its 64 KiB program in the program store, not the job table), launched and FAILED with "no
eligible worker" within milliseconds. The key-value flood fills namespaces to their quota
(refused past it), deletes them, and repeats; oversized keys and values are refused.

Usage: memory_soak.py <bin dir> [--jobs N] [--kv_rounds R] [--max_growth_mib M]
Prints the figures; exits 1 when the growth is over the bound or a call misbehaved.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import grpc
from meshrun.v1 import coordinator_pb2, coordinator_pb2_grpc, job_pb2, telemetry_pb2

PROGRAM_BYTES = 64 << 10


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))


def spec(i):
    s = job_pb2.JobSpec(name=f"soak-{i}", steps=1, telemetry_cadence=1)
    init = s.programs.add(role="init", stablehlo=b"i" * 64)
    init.outputs.add(name="state.w", dtype="f32", shape=[4], shard_shape=[4], sharding=[""])
    step = s.programs.add(role="step",
                          # distinct bytes per job: nothing is deduplicated away
                          stablehlo=(b"%08d" % i) * (PROGRAM_BYTES // 8))
    for lst in (step.inputs, step.outputs):
        lst.add(name="state.w", dtype="f32", shape=[4], shard_shape=[4], sharding=[""])
    step.inputs.add(name="batch.tokens", dtype="s32", shape=[2, 9], shard_shape=[2, 9])
    step.outputs.add(name="loss", dtype="f32")
    s.telemetry.add(name="loss", combine=telemetry_pb2.COMBINE_MEAN)
    s.state_count = 1
    s.data.synthetic = True
    return s


def start_coordinator(bin_dir, flags):
    """A real coordinator with no workers on 127.0.0.1:0, its state on tmpfs when there is one
    (the job history's fsyncs are not what these tests measure). Returns (tmp, process, log,
    channel)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = tempfile.mkdtemp(prefix="meshrun-limits-", dir=base)
    log = open(os.path.join(tmp, "coordinator.log"), "w")
    coord = subprocess.Popen([os.path.join(bin_dir, "meshrun-coordinator"),
                              "--listen=127.0.0.1:0", f"--state_dir={tmp}/state",
                              "--pjrt_plugin=", *flags],
                             stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        m = re.search(r"listening on port (\d+)", open(log.name).read())
        if m:
            channel = grpc.insecure_channel(
                f"127.0.0.1:{m.group(1)}",
                options=[("grpc.max_send_message_length", 64 << 20),
                         ("grpc.max_receive_message_length", 512 << 20)])
            return tmp, coord, log, channel
        if coord.poll() is not None:
            break
        time.sleep(0.1)
    coord.kill()
    raise SystemExit("coordinator did not start:\n" + open(log.name).read()[-3000:])


def kv_flood(stub, rounds, errors):
    for r in range(rounds):
        ns = f"flood-{r % 4}"
        refused = None
        for k in range(20000):
            try:
                stub.KeyValueSet(coordinator_pb2.KeyValueSetRequest(
                    key=f"{ns}/k{k}", value=b"v" * 1024, allow_overwrite=True), timeout=10)
            except grpc.RpcError as e:
                refused = e
                break
        if refused is None or refused.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            errors.append(f"kv round {r}: namespace quota not enforced ({refused})")
        for bad_key, bad_value in ((ns + "/" + "k" * 5000, b"v"), (ns + "/big", b"v" * (2 << 20))):
            try:
                stub.KeyValueSet(coordinator_pb2.KeyValueSetRequest(key=bad_key, value=bad_value),
                                 timeout=10)
                errors.append("an oversized key or value was accepted")
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    errors.append(f"oversized key/value: {e.code()} {e.details()}")
        stub.KeyValueDelete(coordinator_pb2.KeyValueDeleteRequest(key=ns + "/"), timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--kv_rounds", type=int, default=4)
    ap.add_argument("--max_growth_mib", type=float, default=32)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--coordinator_flags", default="--submit_rate=0",
                    help="extra flags (the default lifts the SubmitJob rate limit)")
    args = ap.parse_args()

    tmp, coord, log, channel = start_coordinator(args.bin, args.coordinator_flags.split())
    errors = []
    try:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)

        def submit(lo, hi):
            for i in range(lo, hi):
                stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec(i)), timeout=30)

        def wait_finished(n):
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                jobs = stub.ListJobs(coordinator_pb2.ListJobsRequest(), timeout=60).jobs
                # job-<n> listed and every job final (earlier ones may be pruned already:
                # --max_finished_jobs)
                if any(j.job_id == f"job-{n}" for j in jobs) and all(
                        j.state in (job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_SUCCEEDED)
                        for j in jobs):
                    return jobs
                time.sleep(0.2)
            raise SystemExit("jobs did not finish in time")

        t0 = time.monotonic()
        submit(0, args.warmup)
        kv_flood(stub, 1, errors)
        wait_finished(args.warmup)
        before = rss_kib(coord.pid)
        submit(args.warmup, args.jobs)
        kv_flood(stub, args.kv_rounds, errors)
        jobs = wait_finished(args.jobs)
        after = rss_kib(coord.pid)
        seconds = time.monotonic() - t0
        listed_bytes = sum(j.ByteSize() for j in jobs)
        if any(p.stablehlo for j in jobs for p in j.spec.programs):
            errors.append("a listing carried program bytes")
        if not all("no eligible worker" in j.error for j in jobs):
            errors.append("a job failed for another reason: " +
                          next(j.error for j in jobs if "no eligible worker" not in j.error))
        growth_mib = (after - before) / 1024
        measured = args.jobs - args.warmup
        print(f"jobs {args.jobs} (measured {measured} after {args.warmup} warm-up), "
              f"program bytes submitted {measured * PROGRAM_BYTES / (1 << 20):.1f} MiB, "
              f"kv rounds {args.kv_rounds}")
        print(f"rss before {before / 1024:.1f} MiB, after {after / 1024:.1f} MiB, "
              f"growth {growth_mib:.1f} MiB ({(after - before) * 1024 / max(measured, 1):.0f} "
              f"bytes per job), bound {args.max_growth_mib} MiB")
        print(f"listing of {len(jobs)} jobs: {listed_bytes} bytes; wall {seconds:.1f} s")
        if growth_mib > args.max_growth_mib:
            errors.append(f"RSS grew {growth_mib:.1f} MiB > {args.max_growth_mib} MiB")
        if coord.poll() is not None:
            errors.append("the coordinator exited")
        print(f"ratio memory_soak_headroom {args.max_growth_mib / max(growth_mib, 0.1):.2f}")
    finally:
        coord.kill()
        coord.wait()
        if errors:
            print(open(log.name).read()[-3000:], file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    for e in errors:
        print("FAIL:", e, file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
