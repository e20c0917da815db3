"""meshrun.export's checks of a user's functions (issue 28, item 5): each refusal names the input
or state leaf at fault and the fix, mentions only options the caller passed, and comes at
export, before a bundle that would fail at load is written. A two-leaf model on one device."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import meshrun.export

STATE_SPECS = {"w": P(), "bias": P()}
BATCH_SPECS = {"x": P("data"), "y": P("data")}


def init(seed):
    w = jax.random.normal(jax.random.key(seed), (4, 2)).astype(jnp.bfloat16)
    return {"w": w, "bias": jnp.zeros((2,), jnp.float32)}


def loss_fn(state, batch):
    out = (batch["x"] @ state["w"].astype(jnp.float32)) + state["bias"]
    return jnp.mean(jnp.square(out - batch["y"]))


def step(state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(state, batch)
    new = jax.tree.map(lambda p, g: (p - 0.1 * g).astype(p.dtype), state, grads)
    return new, {"loss": loss}


def batch(extra=None):
    rng = np.random.default_rng(0)
    b = {"x": rng.normal(size=(8, 4)).astype(np.float32),
         "y": rng.normal(size=(8, 2)).astype(np.float32)}
    return dict(b, **(extra or {}))


def export(out_dir, *, example_batch=None, batch_shardings=BATCH_SPECS, **kwargs):
    """Compile mode A on a one-device mesh; kwargs are export's (step=, ...)."""
    return meshrun.export.export(
        str(out_dir), init=init, mesh=jax.make_mesh((1,), ("data",), devices=jax.devices()[:1]),
        state_shardings=STATE_SPECS, batch_shardings=batch_shardings,
        example_batch=batch() if example_batch is None else example_batch, **kwargs)


def test_the_model_exports(tmp_path):
    assert export(tmp_path, step=step)["job"].endswith("job.json")


def test_an_unused_batch_input_is_named_with_the_fix(tmp_path):
    with pytest.raises(RuntimeError) as e:
        export(tmp_path, step=step, example_batch=batch({"mask": np.ones((8,), np.float32)}),
               batch_shardings=dict(BATCH_SPECS, mask=P("data")))
    message = str(e.value)
    assert '"batch.mask"' in message and "does not read" in message, message
    assert "use it in the step, or remove it from the batch" in message, message
    assert "batch.x" not in message and "batch.y" not in message, message
    # keep_unused is a fix only for an input read through extra_inputs, which were not passed
    assert "keep_unused" not in message and "extra_inputs" not in message, message
    assert not (tmp_path / "job.json").exists()


def test_keep_unused_is_named_only_beside_extra_inputs(tmp_path):
    """A batch array the step reads only through an extra input's make(batch) is the case
    keep_unused is for: named as the fix when extra_inputs were passed, and it works."""
    def reads_y_through_plan(state, b, plan):
        return step(state, {"x": b["x"], "y": plan["y"]})

    kwargs = dict(step=reads_y_through_plan,
                  extra_inputs={"plan": ({"y": P("data")}, lambda b: {"y": b["y"]})})
    with pytest.raises(RuntimeError) as e:
        export(tmp_path / "a", **kwargs)
    message = str(e.value)
    assert 'does not read "batch.y"' in message and "keep_unused=True" in message, message
    assert "batch.x" not in message and "plan.y" not in message, message
    export(tmp_path / "b", keep_unused=True, **kwargs)


def test_a_non_scalar_loss_names_the_loss_not_reference_series(tmp_path):
    def per_example_loss(state, b):
        new, _ = step(state, b)
        out = b["x"] @ state["w"].astype(jnp.float32) + state["bias"]
        return new, {"loss": jnp.mean(jnp.square(out - b["y"]), axis=1)}

    with pytest.raises(ValueError) as e:
        export(tmp_path, step=per_example_loss)
    message = str(e.value)
    assert 'metrics["loss"]' in message and "float32[8]" in message, message
    assert "scalar" in message and "jnp.mean" in message, message
    assert "reference_series" not in message, message
    # A name the caller did pass in reference_series is still refused by that name.
    with pytest.raises(ValueError, match='reference_series names "nope"'):
        export(tmp_path, step=step, reference_series=["loss", "nope"])


def _assert_names_leaf(message, leaf, got, want, fn="step"):
    assert f'"{leaf}"' in message and got in message and want in message, message
    assert fn in message and "init" in message, message
    assert "reference_series" not in message and "keep_unused" not in message, message


def test_a_step_that_changes_a_state_dtype_is_refused_at_export(tmp_path):
    def f32_weights(state, b):
        new, metrics = step(state, b)
        return dict(new, w=new["w"].astype(jnp.float32)), metrics

    with pytest.raises(ValueError) as e:
        export(tmp_path, step=f32_weights)
    _assert_names_leaf(str(e.value), "state.w", "float32[4, 2]", "bfloat16[4, 2]")
    assert "astype" in str(e.value)
    assert not (tmp_path / "job.json").exists()


def test_a_step_that_changes_a_state_shape_is_refused_at_export(tmp_path):
    def wider_bias(state, b):
        new, metrics = step(state, b)
        return dict(new, bias=jnp.concatenate([new["bias"], new["bias"]])), metrics

    with pytest.raises(ValueError) as e:
        export(tmp_path, step=wider_bias)
    _assert_names_leaf(str(e.value), "state.bias", "float32[4]", "float32[2]")


def test_a_step_that_adds_a_state_leaf_is_refused_naming_it(tmp_path):
    def adds_count(state, b):
        new, metrics = step(state, b)
        return dict(new, count=jnp.zeros((), jnp.int32)), metrics

    with pytest.raises(ValueError, match='"state.count".*init'):
        export(tmp_path, step=adds_count)


# Compile mode B: grad accumulates the gradients, apply applies them.
def init_accumulator(state):
    return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state)


def grad(state, acc, b):
    grads = jax.grad(loss_fn)(state, b)
    return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)


def apply_f32(state, acc):
    new = jax.tree.map(lambda p, g: p.astype(jnp.float32) - 0.1 * g, state, acc)  # w: bf16 -> f32
    return new, jax.tree.map(jnp.zeros_like, acc), {"loss": jnp.float32(0)}


def test_mode_b_apply_that_changes_a_state_dtype_is_refused_at_export(tmp_path):
    with pytest.raises(ValueError) as e:
        export(tmp_path, grad=grad, apply=apply_f32, init_accumulator=init_accumulator,
               accumulator_shardings=STATE_SPECS)
    _assert_names_leaf(str(e.value), "state.w", "float32[4, 2]", "bfloat16[4, 2]", fn="apply")


def test_mode_b_grad_that_changes_the_accumulator_is_refused_at_export(tmp_path):
    def grad_bf16(state, acc, b):
        return jax.tree.map(lambda a: a.astype(jnp.bfloat16), grad(state, acc, b))

    with pytest.raises(ValueError) as e:
        export(tmp_path, grad=grad_bf16, apply=apply_f32, init_accumulator=init_accumulator,
               accumulator_shardings=STATE_SPECS)
    _assert_names_leaf(str(e.value), "grad_acc.bias", "bfloat16[2]", "float32[2]", fn="grad")
    assert "init_accumulator" in str(e.value)
