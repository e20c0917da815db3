"""Host booking is atomic under concurrent submits (issue 16, faults): jobs submitted at the
same instant to a cluster with one free CPU host never both book it; the loser fails at
ASSIGNED naming the busy host, and the winner runs alone."""
import os
import threading
import time

from meshrun.bundle import job_spec_from_bundle
from meshrun.v1 import coordinator_pb2 as cpb
from meshrun.v1 import job_pb2

from conftest import TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACTIVE = (job_pb2.JOB_STATE_ASSIGNED, job_pb2.JOB_STATE_LOADING, job_pb2.JOB_STATE_RUNNING)


def test_concurrent_submits_never_share_a_host(cluster):
    co = cluster.coordinator
    spec = job_spec_from_bundle(os.path.join(ROOT, "examples", "mlp_classifier", "dp1",
                                             "job.json"), steps=100_000_000, cadence=1000)
    ids, start = [], threading.Barrier(4)

    def submit():
        start.wait()
        ids.append(co.SubmitJob(cpb.SubmitJobRequest(spec=spec), timeout=TIMEOUT).job_id)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = [co.GetJob(cpb.GetJobRequest(job_id=i), timeout=TIMEOUT) for i in ids]
            booked = [j for j in jobs if j.state in ACTIVE]
            assert len(booked) <= 1, "two jobs booked host-a: " + str(
                [(j.job_id, job_pb2.JobState.Name(j.state)) for j in booked])
            settled = [j for j in jobs if j.state != job_pb2.JOB_STATE_PENDING and
                       j.state != job_pb2.JOB_STATE_ASSIGNED and j.state != job_pb2.JOB_STATE_LOADING]
            if len(settled) == len(jobs):
                break
            time.sleep(0.05)
        states = sorted(job_pb2.JobState.Name(j.state) for j in jobs)
        assert states == ["JOB_STATE_FAILED"] * 3 + ["JOB_STATE_RUNNING"], states
        for j in jobs:
            if j.state == job_pb2.JOB_STATE_FAILED:
                assert "host-a" in j.error, j.error
    finally:
        for i in ids:
            try:
                co.CancelJob(cpb.CancelJobRequest(job_id=i), timeout=TIMEOUT)
            except Exception:  # already ended
                pass
        cluster.wait_idle()  # the suite's other tests compare the worker's state
    assert cluster.both_healthy()
