"""Cancel during LOADING leaves nothing running (issue 16, faults): a job cancelled while the
coordinator distributes its executables must never start on the worker, or be stopped at once
if its start raced the cancel. The worker is paused (SIGSTOP) while the coordinator compiles, so
the transfer waits on it and the job sits in LOADING until the test has cancelled it; then the
worker resumes, the transfer completes, and the launch must not start the job."""
import os
import signal
import time

from meshrun.bundle import job_spec_from_bundle
from meshrun.v1 import coordinator_pb2 as cpb
from meshrun.v1 import job_pb2
from meshrun.v1 import worker_pb2 as wpb

from conftest import TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cancel_during_loading_leaves_nothing_running(cluster):
    co, w = cluster.coordinator, cluster.worker
    s = job_spec_from_bundle(os.path.join(ROOT, "examples", "transformer_lm", "dp1", "job.json"),
                             steps=100_000_000, cadence=1000)
    job_id = co.SubmitJob(cpb.SubmitJobRequest(spec=s), timeout=TIMEOUT).job_id
    seen = []
    worker_pid = cluster.procs[1].pid
    paused = False
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = co.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=TIMEOUT).state
            if not seen or seen[-1] != state:
                seen.append(state)
            if state == job_pb2.JOB_STATE_ASSIGNED and not paused:
                os.kill(worker_pid, signal.SIGSTOP)  # the coordinator compiles meanwhile
                paused = True
            if state not in (job_pb2.JOB_STATE_PENDING, job_pb2.JOB_STATE_ASSIGNED):
                break
            time.sleep(0.01)
        if seen[-1] == job_pb2.JOB_STATE_LOADING:
            time.sleep(0.5)  # the transfer is under way, waiting on the paused worker
            co.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=TIMEOUT)
    finally:
        os.kill(worker_pid, signal.SIGCONT)
    names = [job_pb2.JobState.Name(x) for x in seen]
    assert seen[-1] == job_pb2.JOB_STATE_LOADING, f"never saw LOADING: {names}\n{cluster.logs()}"
    assert co.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=TIMEOUT).state == \
        job_pb2.JOB_STATE_CANCELLED
    # Whatever the launch was doing, within a few seconds the worker runs nothing, and stays so.
    settled = time.monotonic() + 10
    while w.GetStatus(wpb.GetStatusRequest(), timeout=TIMEOUT).running_job_id == job_id:
        assert time.monotonic() < settled, "the cancelled job still runs:\n" + cluster.logs()
        time.sleep(0.1)
    for _ in range(20):
        assert w.GetStatus(wpb.GetStatusRequest(), timeout=TIMEOUT).running_job_id != job_id, \
            "the cancelled job started after the cancel:\n" + cluster.logs()
        time.sleep(0.1)
    assert co.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=TIMEOUT).state == \
        job_pb2.JOB_STATE_CANCELLED
    assert cluster.both_healthy()
