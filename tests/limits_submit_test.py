"""Submit-time refusals through a real coordinator (issue 16, docs/limits.md): each bad JobSpec
gets INVALID_ARGUMENT naming its field, nothing is stored (ListJobs stays empty), the server
keeps answering; token shards outside --data_root are refused before they are opened; SubmitJob
is rate limited per client.

Usage: limits_submit_test.py <bin dir>
"""
import os
import shutil
import sys
import tempfile

import grpc
from meshrun.v1 import coordinator_pb2, coordinator_pb2_grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_soak import spec, start_coordinator  # noqa: E402

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def refused(stub, s, code, text):
    try:
        stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=s), timeout=30)
        expect(False, f"accepted, wanted {code.name} with {text!r}")
    except grpc.RpcError as e:
        expect(e.code() == code and text in e.details(),
               f"wanted {code.name} with {text!r}, got {e.code().name}: {e.details()}")


def main():
    bin_dir = sys.argv[1]
    outside = tempfile.mkdtemp(prefix="meshrun-outside-")
    with open(os.path.join(outside, "a.tok"), "wb") as f:
        f.write(b"\0" * 64)
    tmp, coord, log, channel = start_coordinator(bin_dir, ["--submit_rate=0"])
    try:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        cases = []
        s = spec(0); s.state_count = -1
        cases.append((s, "spec.state_count is -1"))
        s = spec(0); s.state_count = 2**31 - 1
        cases.append((s, "spec.state_count is 2147483647"))
        s = spec(0); s.programs[1].donated_inputs.append(7)
        cases.append((s, "spec.programs[1].donated_inputs[0] is 7"))
        s = spec(0); s.programs[1].inputs[1].sharding[:] = ["rows", ""]
        cases.append((s, "\"rows\" is not a mesh axis"))
        s = spec(0); s.programs[1].inputs[0].shape[:] = [8]; s.programs[1].inputs[0].shard_shape[:] = [8]
        cases.append((s, "the state must come back unchanged"))
        s = spec(0); s.name = "x" * 1000
        cases.append((s, "spec.name is 1000 bytes"))
        s = spec(0); s.programs[1].inputs[1].shape[:] = [2**40, 2**40]
        cases.append((s, "has over 1099511627776 elements"))
        s = spec(0); s.data.token_shards_glob = os.path.join(outside, "*.tok")
        cases.append((s, "is outside the directories this server reads"))
        s = spec(0); s.checkpoint.directory = "/etc"; s.checkpoint.every_steps = 1
        cases.append((s, "spec.checkpoint.directory \"/etc\" is outside"))
        s = spec(0); s.checkpoint.directory = os.path.join(tmp, "state"); s.checkpoint.every_steps = 1
        s.checkpoint.memory_every_steps = -1
        cases.append((s, "spec.checkpoint.memory_every_steps is -1; it must be >= 0"))
        s = spec(0); s.resume_from = "/proc/self/environ"
        cases.append((s, "spec.resume_from \"/proc/self/environ\" is outside"))
        for s, text in cases:
            refused(stub, s, grpc.StatusCode.INVALID_ARGUMENT, text)
        listed = stub.ListJobs(coordinator_pb2.ListJobsRequest(), timeout=10).jobs
        expect(len(listed) == 0, f"refused jobs were stored: {[j.job_id for j in listed]}")
        stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec(1)), timeout=30)
        expect(coord.poll() is None, "the coordinator exited")
    finally:
        coord.kill()
        coord.wait()
        if failures:
            print(open(log.name).read()[-3000:], file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)

    # The rate limit: a burst of 3, then one call a second.
    tmp, coord, log, channel = start_coordinator(bin_dir, ["--submit_rate=1", "--submit_burst=3"])
    try:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        for i in range(3):
            stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec(i)), timeout=30)
        refused(stub, spec(3), grpc.StatusCode.RESOURCE_EXHAUSTED,
                "is over its rate of 1 SubmitJob calls a second (burst 3)")
        expect(len(stub.ListJobs(coordinator_pb2.ListJobsRequest(), timeout=10).jobs) == 3,
               "a rate-limited submit was stored")
    finally:
        coord.kill()
        coord.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)
    if failures:
        sys.exit(1)
    print(f"limits_submit_test: {len(cases)} refusals named their field, nothing stored; "
          "rate limit enforced")


if __name__ == "__main__":
    main()
