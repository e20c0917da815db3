"""Nothing trains on garbage (issue 28): typed array files checked at submit against the
program's batch inputs, token shards against the model's vocabulary, and the non-finite policy
on a model whose loss turns NaN at step 30, each through a real coordinator and worker."""
import collections
import os

import grpc
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import convnet
import meshrun
import meshrun.data
import meshrun.export
from meshrun.v1 import job_pb2

STEPS = 4


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("quality") / "convnet"
    meshrun.export.export(
        str(out), init=convnet.init, step=convnet.step, mesh=convnet.mesh(),
        state_shardings=convnet.STATE_SPECS, batch_shardings=convnet.BATCH_SPECS,
        example_batch=convnet.batches(1)[0], data_file=None,
        axis_roles={"rows": "data", "cols": "model"}, name="convnet")
    return out


def refusal(cluster, bundle, path):
    with pytest.raises(grpc.RpcError) as refused:
        cluster.client.submit(str(bundle), steps=STEPS, data=str(path))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return refused.value.details()


def state(manifest):
    return job_pb2.JobState.Name(manifest.state)


def test_the_typed_file_names_each_array(tmp_path):
    path = tmp_path / "train.arrays"
    assert meshrun.data.write_arrays(str(path), convnet.batches(3)) == 3
    header = meshrun.data.read_array_header(str(path))
    assert header["batches"] == 3
    assert header["arrays"] == [
        {"name": "batch.images", "dtype": "f32", "shape": [8, 8, 8, 1]},
        {"name": "batch.labels", "dtype": "s32", "shape": [8]}]


@pytest.mark.parametrize("case", ["swapped", "labels_f32", "labels_i64", "wrong_shape"])
def test_a_file_unlike_the_program_is_refused_naming_the_array(tmp_path, cluster, bundle, case):
    batches = convnet.batches(STEPS)
    if case == "swapped":
        batches = [collections.OrderedDict([("labels", b["labels"]), ("images", b["images"])])
                   for b in batches]
        want = ['array 0 is "batch.labels"', 'input 0 is "batch.images"', "another order"]
    elif case == "labels_f32":
        batches = [{**b, "labels": b["labels"].astype(np.float32)} for b in batches]
        want = ['"batch.labels" is f32[8] in the file', "the program takes s32[8]"]
    elif case == "labels_i64":  # 8 more bytes per batch: whole batches of the old layout
        batches = [{**b, "labels": b["labels"].astype(np.int64)} for b in batches]
        want = ['"batch.labels" is s64[8] in the file', "the program takes s32[8]"]
    else:
        batches = [{**b, "images": b["images"].reshape(8, 64)} for b in batches]
        want = ['"batch.images" is f32[8,64] in the file', "takes f32[8,8,8,1]"]
    path = tmp_path / f"{case}.arrays"
    meshrun.data.write_arrays(str(path), batches)
    message = refusal(cluster, bundle, path)
    for part in ["data.array_file", str(path)] + want:
        assert part in message, message


def test_a_damaged_file_is_refused(tmp_path, cluster, bundle):
    good = tmp_path / "good.arrays"
    meshrun.data.write_arrays(str(good), convnet.batches(STEPS))
    data = good.read_bytes()
    truncated = tmp_path / "truncated.arrays"
    truncated.write_bytes(data[:-3])
    message = refusal(cluster, bundle, truncated)
    assert "truncated" in message and "says 4 batches" in message, message
    flipped = tmp_path / "flipped.arrays"
    flipped.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    message = refusal(cluster, bundle, flipped)
    assert "corrupt or changed after it was written" in message, message


def test_a_headerless_file_trains_with_a_warning(tmp_path, cluster, bundle):
    """A file written before typed files (the batches' raw bytes) keeps loading, unchecked."""
    old = tmp_path / "old.arrays"
    old.write_bytes(b"".join(np.ascontiguousarray(x).tobytes()
                             for b in convnet.batches(STEPS) for x in jax.tree.leaves(b)))
    with pytest.warns(UserWarning, match="has no header"):
        job_id = cluster.client.submit(str(bundle), steps=STEPS, data=str(old))
    manifest = cluster.client.wait(job_id, timeout=180)
    assert state(manifest) == "JOB_STATE_SUCCEEDED", str(manifest) + cluster.logs()
    assert manifest.data_receipt.unchecked_layout
    result = cluster.cli("submit", str(bundle), f"--data={old}", "--steps=1")
    assert result.returncode == 0, result
    assert "warning: data.array_file" in result.stderr and "write_arrays" in result.stderr, result


def test_token_shards_of_a_larger_vocabulary_are_refused(tmp_path, cluster):
    lm = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "examples", "transformer_lm", "dp1")
    docs = [np.arange(1, 300) % 99_999 + 1 for _ in range(40)]
    meshrun.data.write_token_shards(str(tmp_path / "big"), docs, vocab_size=100_000,
                                    dtype="u32")
    message = refusal(cluster, lm, tmp_path / "big-*.tok")
    assert "100000-token vocabulary" in message and "vocabulary of 256" in message, message


# ------------------------------------------------------------------ the non-finite policy

def nan_init(seed):
    return {"w": jnp.ones((4,), jnp.float32), "count": jnp.zeros((), jnp.int32)}


def nan_step(state, batch):
    """A regression whose loss is NaN from step 30 on (the step count is the state's)."""
    count = state["count"] + 1
    loss = jnp.mean((batch["x"] @ state["w"] - batch["y"]) ** 2)
    loss = jnp.where(count >= 30, jnp.nan, loss)
    return {"w": state["w"] * 0.99, "count": count}, {"loss": loss, "grad_norm": jnp.sum(state["w"])}


@pytest.fixture(scope="module")
def nan_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("nan") / "regression"
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(2, 4)).astype(np.float32),
             "y": rng.normal(size=(2,)).astype(np.float32)}
    meshrun.export.export(
        str(out), init=nan_init, step=nan_step, mesh=jax.make_mesh((1,), ("data",),
                                                                    devices=jax.devices()[:1]),
        state_shardings={"w": P(), "count": P()}, batch_shardings={"x": P(), "y": P()},
        example_batch=batch, name="nan_at_30")
    return out


@pytest.mark.parametrize("policy", ["fail", "warn", "ignore"])
def test_nan_at_step_30(tmp_path, cluster, nan_bundle, policy):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    job_id = cluster.client.submit(str(nan_bundle), steps=50, cadence=10, on_nonfinite=policy,
                                   checkpoint_dir=str(checkpoints), checkpoint_every=20)
    manifest = cluster.client.wait(job_id, timeout=180)
    committed = sorted(r.step for r in manifest.checkpoints if r.committed)
    # Whatever the policy, the manifest says where the loss stopped being finite.
    assert (manifest.nonfinite_step, manifest.nonfinite_series) == (30, "loss"), str(manifest)
    if policy == "fail":
        assert state(manifest) == "JOB_STATE_FAILED", str(manifest)
        assert 'step 30: series "loss" is NaN' in manifest.error, manifest.error
        assert "on_nonfinite=fail" in manifest.error
        assert manifest.last_step <= 31 and not manifest.attempts  # stopped, never restarted
        assert committed == [20], committed  # the last good checkpoint is kept, none after
        got = cluster.cli("get", job_id).stdout
        assert "not finite" in got and "step 30" in got, got
    else:
        assert state(manifest) == "JOB_STATE_SUCCEEDED", str(manifest) + cluster.logs()
        assert manifest.last_step == 50 and committed == [20, 40, 50], (manifest, committed)
