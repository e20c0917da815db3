"""Checkpoints through meshrun.Client (docs/checkpoints.md) on a real coordinator and worker:
save with a policy and retention, resume from a step directory, a checkpoint directory or a
job id (resolved as the CLI does), and Client.checkpoint on a running job."""
import os
import shutil
import time

import grpc
import numpy as np
import pytest

import meshrun
from meshrun.v1 import job_pb2
from test_sdk import STEPS, export_convnet, jax_losses, train_through_client, wait_running

state_name = job_pb2.JobState.Name


def committed_steps(manifest):
    return [c.step for c in manifest.checkpoints if c.committed]


def test_save_and_resume_trains_like_jax(tmp_path, cluster):
    bundle, ck = tmp_path / "bundle", tmp_path / "ck"
    ck.mkdir()
    export_convnet(str(bundle))
    client = cluster.client
    _, manifest = train_through_client(cluster, bundle, STEPS, checkpoint_dir=str(ck),
                                       checkpoint_every=2, keep_checkpoints=2)
    policy = manifest.spec.checkpoint
    assert (policy.directory, policy.every_steps, policy.keep_last) == (str(ck), 2, 2)
    assert committed_steps(manifest) == [2, 4, 6], str(manifest)
    assert sorted(os.listdir(ck)) == ["4", "6"]  # keep 2: step 2 deleted after 6 committed

    # Resumed from step 4 (a step directory): steps 5 and 6 as JAX's uninterrupted run.
    job_id = client.submit(str(bundle), steps=STEPS, cadence=1, resume_from=ck / "4",
                           max_restarts=0)
    resumed = client.wait(job_id, timeout=180)
    assert state_name(resumed.state) == "JOB_STATE_SUCCEEDED", str(resumed) + cluster.logs()
    assert resumed.restored_step == 4 and resumed.spec.resume_from == str(ck / "4")
    assert resumed.spec.HasField("max_restarts") and resumed.spec.max_restarts == 0
    deadline = time.monotonic() + 20
    while True:
        rows = client.export(job_id, names=["loss"], as_dataframe=False)
        if len(rows) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [r["step"] for r in rows] == [5, 6], rows
    np.testing.assert_allclose([r["value"] for r in rows], jax_losses()[4:], rtol=1e-5)

    # resume_from resolves as the CLI's: a checkpoint directory and a job id give the newest
    # committed step; a partial step and a job without checkpoints are refused, named.
    first = manifest.job_id
    for resume in (str(ck), first):
        spec = meshrun.job_spec_from_bundle(str(bundle), resume_from=resume,
                                            get_job=client.get)
        assert spec.resume_from == str(ck / "6"), resume
    # A step without meshrun's manifest (Orbax's _METADATA only) is not one meshrun committed,
    # and a temp step never restores, whatever it holds.
    for copy in ("9", "8.meshrun-tmp"):
        shutil.copytree(ck / "6", ck / copy)
        (ck / copy / "meshrun_checkpoint.json").unlink()
    assert meshrun.job_spec_from_bundle(str(bundle), resume_from=str(ck)).resume_from == \
        str(ck / "6")
    with pytest.raises(meshrun.BundleError, match="8.meshrun-tmp is a checkpoint being written"):
        client.submit(str(bundle), resume_from=ck / "8.meshrun-tmp")
    with pytest.raises(meshrun.BundleError, match=f"job {job_id} has no committed checkpoint"):
        client.submit(str(bundle), resume_from=job_id)
    with pytest.raises(meshrun.BundleError, match="job-none is neither a directory nor a job"):
        client.submit(str(bundle), resume_from="job-none")
    with pytest.raises(meshrun.BundleError, match="checkpoint_dir .* is not a directory"):
        client.submit(str(bundle), checkpoint_dir=tmp_path / "absent")
    with pytest.raises(meshrun.BundleError, match="checkpoint_every must be >= 1"):
        client.submit(str(bundle), checkpoint_dir=ck, checkpoint_every=0)
    # In-memory checkpoints: 10 unless set (docs/checkpoints.md, "Memory tier"); 0 turns off.
    spec = meshrun.job_spec_from_bundle(str(bundle), checkpoint_dir=str(ck))
    assert not spec.checkpoint.HasField("memory_every_steps")
    off = meshrun.job_spec_from_bundle(str(bundle), checkpoint_dir=str(ck),
                                       memory_checkpoint_every=0)
    assert off.checkpoint.HasField("memory_every_steps") and off.checkpoint.memory_every_steps == 0
    with pytest.raises(meshrun.BundleError, match="memory_checkpoint_every must be >= 0"):
        client.submit(str(bundle), checkpoint_dir=ck, memory_checkpoint_every=-1)


def test_checkpoint_now_on_a_running_job(tmp_path, cluster):
    bundle, ck = tmp_path / "bundle", tmp_path / "ck"
    ck.mkdir()
    export_convnet(str(bundle))
    client = cluster.client
    # A JobSpec gets the options too (on a copy).
    spec = meshrun.job_spec_from_bundle(str(bundle), steps=1_000_000, cadence=5)
    job_id = client.submit(spec, checkpoint_dir=ck, checkpoint_every=1_000_000)
    assert not spec.HasField("checkpoint")
    manifest = wait_running(cluster, job_id, min_step=5)
    client.checkpoint(job_id)
    deadline = time.monotonic() + 60
    while not committed_steps(manifest):
        assert time.monotonic() < deadline, str(manifest) + cluster.logs()
        time.sleep(0.2)
        manifest = client.get(job_id)
    step = committed_steps(manifest)[0]
    assert step >= 5 and os.path.exists(ck / str(step) / "meshrun_checkpoint.json")
    client.cancel(job_id)
    assert state_name(client.wait(job_id, timeout=60).state) == "JOB_STATE_CANCELLED"
    with pytest.raises(grpc.RpcError) as refused:
        client.checkpoint(job_id)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not RUNNING" in refused.value.details(), refused.value.details()
