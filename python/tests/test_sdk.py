"""The SDK end to end: a model unlike the examples (conv net, bf16 parameters, image inputs,
mesh axes "rows" x "cols") exported with meshrun.export, its batches written with
meshrun.data.write_arrays, trained through a real coordinator and worker driven only by
meshrun.Client, against JAX's own losses."""
import json
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

import convnet
import meshrun
import meshrun.export

STEPS = 6


def export_convnet(out_dir, axis_roles={"rows": "data", "cols": "model"}, **kwargs):
    return meshrun.export.export(
        out_dir, init=convnet.init, step=convnet.step, mesh=convnet.mesh(),
        state_shardings=convnet.STATE_SPECS, batch_shardings=convnet.BATCH_SPECS,
        example_batch=convnet.batches(1)[0], batches=convnet.batches(STEPS),
        axis_roles=axis_roles, combine={"accuracy": "min"}, name="convnet", **kwargs)


def jax_losses():
    """JAX's own run of the same step on the same mesh and batches."""
    mesh = convnet.mesh()
    named = lambda specs: jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    init = jax.jit(convnet.init, out_shardings=named(convnet.STATE_SPECS))
    step = jax.jit(convnet.step, in_shardings=(named(convnet.STATE_SPECS),
                                               named(convnet.BATCH_SPECS)))
    state = init(jnp.uint32(0))
    losses = []
    for batch in convnet.batches(STEPS):
        state, metrics = step(state, jax.device_put(batch, named(convnet.BATCH_SPECS)))
        losses.append(float(metrics["loss"]))
    return losses


def test_unmapped_mesh_axis_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match='mesh axis "cols" has no role'):
        export_convnet(str(tmp_path), axis_roles={"rows": "data"})
    with pytest.raises(ValueError, match="'rows', 'cols'.*order data, expert, model"):
        export_convnet(str(tmp_path), axis_roles={"rows": "model", "cols": "data"})


def test_export_keeps_every_declared_input_and_no_source_paths(tmp_path):
    """A step that ignores a batch array would lose it from the program while the worker feeds
    it: refused, naming it; keep_unused keeps it. The programs hold no source locations,
    so no file path (the same bytes from any checkout)."""
    batch = dict(convnet.batches(1)[0], unused=np.zeros((convnet.BATCH,), np.float32))
    kwargs = dict(init=convnet.init, mesh=convnet.mesh(), state_shardings=convnet.STATE_SPECS,
                  batch_shardings=dict(convnet.BATCH_SPECS, unused=convnet.BATCH_SPECS["labels"]),
                  example_batch=batch, axis_roles={"rows": "data", "cols": "model"})
    ignores = lambda state, b: convnet.step(state, {k: b[k] for k in ("images", "labels")})
    with pytest.raises(RuntimeError, match='does not read "batch.unused".*from the batch'):
        meshrun.export.export(str(tmp_path / "a"), step=ignores, **kwargs)
    meshrun.export.export(str(tmp_path / "b"), step=ignores, keep_unused=True, **kwargs)
    job = json.load(open(tmp_path / "b" / "job.json"))
    assert job["programs"]["step"]["inputs"][-1]["name"] == "batch.unused"
    for program in ("init.mlirbc", "step.mlirbc"):
        code = (tmp_path / "b" / program).read_bytes()
        assert b"convnet.py" not in code and b"test_sdk.py" not in code
    with pytest.raises(ValueError, match="host_replicas=2: more than one host needs compile"):
        meshrun.export.export(str(tmp_path / "c"), step=convnet.step, host_replicas=2, **kwargs)
    with pytest.raises(ValueError, match='reference_series names "nope"'):
        meshrun.export.export(str(tmp_path / "c"), step=ignores, keep_unused=True,
                              reference_series=["nope"], **kwargs)


def test_hand_written_axis_is_refused_by_client_and_cli(tmp_path, cluster):
    export_convnet(str(tmp_path))
    job = json.load(open(tmp_path / "job.json"))
    job["mesh"]["axes"] = ["rows", "model"]
    json.dump(job, open(tmp_path / "job.json", "w"))
    with pytest.raises(meshrun.BundleError, match='mesh.axes: axis "rows" is not mapped'):
        cluster.client.submit(str(tmp_path))
    result = cluster.cli("submit", str(tmp_path / "job.json"))
    assert result.returncode != 0 and '"rows" is not mapped' in result.stderr, result


def test_convnet_trains_like_jax_through_client(tmp_path, cluster):
    export_convnet(str(tmp_path))
    files = sorted(os.listdir(tmp_path))
    assert files == ["data.bin", "init.mlirbc", "job.json", "step.mlirbc"], files  # no fixtures
    job = json.load(open(tmp_path / "job.json"))
    assert job["mesh"]["axes"] == ["data", "model"]
    assert {e["dtype"] for e in job["programs"]["init"]["outputs"]} == {"bf16", "f32", "s32"}
    expected = jax_losses()

    client = cluster.client
    job_id = client.submit(str(tmp_path), steps=STEPS, cadence=1)
    steps, losses = [], {}
    for summary in client.watch(job_id):
        steps.append(summary.step)
        for v in summary.values:
            if v.name == "loss":
                losses[summary.step] = v.values[0]
    manifest = client.wait(job_id, timeout=120)
    assert meshrun.v1.job_pb2.JobState.Name(manifest.state) == "JOB_STATE_SUCCEEDED", (
        str(manifest) + cluster.logs())
    assert steps == sorted(set(steps)), steps  # each summary once, in order
    got = [losses[s] for s in sorted(losses)]
    assert len(got) == STEPS, (losses, cluster.logs())
    np.testing.assert_allclose(got, expected, rtol=1e-5)

    assert job_id in [j.job_id for j in client.list()]
    rows = client.export(job_id, names=["loss"], as_dataframe=False)
    assert [r["value"] for r in rows] == pytest.approx(got, rel=1e-6)
    # pandas is in the venv (scripts/install_sdk.sh): the same rows as a DataFrame.
    import pandas
    frame = client.export(job_id, names=["loss"], as_dataframe=True)
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == ["step", "name", "index", "value", "step_time_seconds",
                                   "wall_time_unix_micros"]
    assert frame["step"].tolist() == list(range(1, STEPS + 1))
    assert set(frame["name"]) == {"loss"}
    np.testing.assert_allclose(frame["value"].to_numpy(), got, rtol=1e-6)
    assert (frame["step_time_seconds"] > 0).all()
    worker_metrics = client.metrics()
    assert "worker-0" in worker_metrics

    # The CLI's --output=json: the same messages, parseable.
    for args, check in (
            (("get", job_id), lambda m: m["state"] == "JOB_STATE_SUCCEEDED"
             and int(m["last_step"]) == STEPS),
            (("list",), lambda m: job_id in [j["job_id"] for j in m["jobs"]]),
            (("workers",), lambda m: {"worker-0", "worker-1"}
             <= {w["registration"]["host"] for w in m["workers"]}),
            (("metrics",), lambda m: {h["host"] for h in m["hosts"]} >= {"worker-0"})):
        result = cluster.cli("--output=json", *args)
        assert result.returncode == 0 and check(json.loads(result.stdout)), result
    # meshrun get's readable summary.
    text = cluster.cli("get", job_id).stdout
    for expected_line in ("state:       SUCCEEDED", f"step:        {STEPS} of {STEPS}",
                          "mesh:        data=2 x model=2 on worker-0 (4 devices)",
                          "data:        the bundle's batches", "compile:     mode A"):
        assert expected_line in text, text


def test_cli_and_client_default_to_meshrun_coordinator(cluster, monkeypatch):
    import subprocess
    from conftest import _bin
    env = dict(os.environ, MESHRUN_COORDINATOR=cluster.address)
    result = subprocess.run([_bin("meshrun"), "workers"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and "worker-0" in result.stdout, result
    monkeypatch.setenv("MESHRUN_COORDINATOR", cluster.address)
    with meshrun.Client(timeout=10) as client:
        hosts = {w.registration.host for w in client.workers()}
        assert client.address == cluster.address and {"worker-0", "worker-1"} <= hosts, hosts


def test_cli_exit_codes():
    import subprocess
    from conftest import _bin
    if not os.path.exists(_bin("meshrun")):
        pytest.skip("MESHRUN_BIN_DIR does not hold the meshrun binaries")
    run = lambda *a: subprocess.run([_bin("meshrun"), *a], capture_output=True, timeout=60)
    assert run("no-such-command").returncode == 2
    assert run("get").returncode == 2
    assert run("--coordinator=127.0.0.1:1", "--timeout=2s", "list").returncode == 3


def test_running_job_shows_its_current_step_and_cancels(tmp_path, cluster):
    export_convnet(str(tmp_path))
    client = cluster.client
    job_id = client.submit(str(tmp_path), steps=1_000_000, cadence=5)
    manifest = wait_running(cluster, job_id, min_step=10)
    state_name = meshrun.v1.job_pb2.JobState.Name
    listed = {j.job_id: j for j in client.list()}[job_id]
    assert listed.last_step >= manifest.last_step and listed.last_step % 5 == 0
    client.cancel(job_id)
    assert state_name(client.wait(job_id, timeout=60).state) == "JOB_STATE_CANCELLED"


def wait_running(cluster, job_id, min_step, timeout=90):
    """Waits until the job runs and reported `min_step`; returns its manifest."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        manifest = cluster.client.get(job_id)
        if (meshrun.v1.job_pb2.JobState.Name(manifest.state) == "JOB_STATE_RUNNING"
                and manifest.last_step >= min_step):
            return manifest
        assert time.monotonic() < deadline, str(manifest) + cluster.logs()
        time.sleep(0.2)


def train_through_client(cluster, bundle, steps, **submit):
    """Submits `bundle` through meshrun.Client and returns its losses, one per step."""
    client = cluster.client
    job_id = client.submit(str(bundle), steps=steps, cadence=1, **submit)
    # The job may wait for the worker (an earlier test's job); its history is read at the end.
    manifest = client.wait(job_id, timeout=180)
    assert meshrun.v1.job_pb2.JobState.Name(manifest.state) == "JOB_STATE_SUCCEEDED", (
        str(manifest) + cluster.logs())
    # The last summaries may reach the coordinator's history just after the job's end.
    import time
    deadline = time.monotonic() + 20
    while True:
        rows = client.export(job_id, names=["loss"], as_dataframe=False)
        if len(rows) == steps or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), (rows, cluster.logs())
    return [r["value"] for r in rows], manifest


def test_mode_b_grad_apply_trains_like_jax(tmp_path, cluster):
    """Compile mode B from meshrun.export: grad on 2 micro-batches, then apply."""
    micro = convnet.batches(STEPS * convnet.GRAD_ACCUMULATION)
    out = meshrun.export.export(
        str(tmp_path), init=convnet.init, grad=convnet.grad, apply=convnet.apply,
        init_accumulator=convnet.init_accumulator, accumulator_shardings=convnet.ACC_SPECS,
        grad_accumulation=convnet.GRAD_ACCUMULATION, mesh=convnet.mesh(),
        state_shardings=convnet.STATE_SPECS, batch_shardings=convnet.BATCH_SPECS,
        example_batch=micro[0], batches=micro, axis_roles={"rows": "data", "cols": "model"},
        name="convnet-mode-b", reference_steps=STEPS)
    job = json.load(open(tmp_path / "job.json"))
    assert sorted(job["programs"]) == ["apply", "grad", "init"] and job["grad_accumulation"] == 2
    got, manifest = train_through_client(cluster, tmp_path, STEPS)
    assert manifest.compile_mode == "B"
    np.testing.assert_allclose(got, out["reference_loss"], rtol=1e-5)


def test_separate_array_file_trains_like_jax(tmp_path, cluster):
    """--data with an array-batch file: the bundle holds no batches; the workers read them
    memory-mapped from a file of their own, with a receipt, and train as JAX does."""
    import hashlib
    import grpc
    import meshrun.data
    bundle = tmp_path / "bundle"
    export_convnet(str(bundle), data_file=None)
    assert "data" not in json.load(open(bundle / "job.json"))
    path = tmp_path / "train.arrays"
    meshrun.data.write_arrays(str(path), convnet.batches(STEPS))
    got, manifest = train_through_client(cluster, bundle, STEPS, data=str(path))
    assert manifest.spec.data.array_file == str(path)
    assert manifest.data_receipt.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    np.testing.assert_allclose(got, jax_losses(), rtol=1e-5)

    result = cluster.cli("submit", str(bundle / "job.json"), f"--data={path}", "--steps=2",
                         "--follow", "--wait=120s")
    assert result.returncode == 0, result
    assert "array batches " + str(path) in cluster.cli("get", result.stdout.split()[0]).stdout

    bad = tmp_path / "bad.arrays"
    bad.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(grpc.RpcError) as refused:
        cluster.client.submit(str(bundle), data=str(bad))
    assert "data.array_file" in refused.value.details(), refused.value.details()


def test_client_never_sends_a_token_in_plaintext():
    """Security review item 12 (issue 27): a token without TLS is refused before any call."""
    with pytest.raises(ValueError, match="token= needs TLS"):
        meshrun.Client("127.0.0.1:1", token="secret")


def test_client_sends_programs_past_the_request_limit(cluster):
    """Security item 6 (issue 27): the coordinator takes requests of at most 8 MiB, so the
    Client uploads each program in chunks first. A 12 MiB (junk) step program is taken, and the
    job fails compiling it, its manifest without program bytes."""
    from meshrun.v1 import job_pb2
    spec = meshrun.job_spec_from_bundle(
        os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
            __file__)))), "examples", "transformer_lm", "dp1"), steps=2, cadence=1)
    step = next(p for p in spec.programs if p.role == "step")
    step.stablehlo = b"not stablehlo " * ((12 << 20) // 14)
    job_id = cluster.client.submit(spec)
    job = cluster.client.wait(job_id, timeout=120)
    assert job.state == job_pb2.JOB_STATE_FAILED, job
    assert "'not' is unknown" in job.error, job.error  # the uploaded junk was compiled
    assert all(not p.stablehlo for p in job.spec.programs)
