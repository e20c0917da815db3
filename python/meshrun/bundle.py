"""Reads a bundle directory (job.json + programs, as meshrun.export or examples/ write it) as the
typed JobBundle (proto/meshrun/v1/bundle.proto) and turns it into the JobSpec a client submits:
the Python twin of the CLI's bundle/job_bundle.cc.

job.json is a JobBundle in proto3 JSON, parsed strictly: an unknown or mistyped field is an
error naming it. Only what a run needs is required: `reference` and `compile_options_jax` are
test data and ignored here. Mesh axes must be the roles data/model/expert (meshrun.export maps
the user's names); any other axis is refused by name."""
import json
import os

from google.protobuf import json_format

from meshrun.checkpoints import apply_checkpoint_options
from meshrun.errors import BundleError
from meshrun.v1 import bundle_pb2, job_pb2, telemetry_pb2

ROLES = ("data", "model", "expert")
_FAMILIES = {"": job_pb2.MODEL_FAMILY_DENSE, "dense": job_pb2.MODEL_FAMILY_DENSE,
             "moe": job_pb2.MODEL_FAMILY_MOE, "mamba": job_pb2.MODEL_FAMILY_MAMBA}
_TABLES = ("block_mask", "data_next", "mask_next", "grid_width", "partial_masks")
_SHARD_MAGIC = b"MRTOKSHD"


def _null_sharding_to_empty(obj):
    """Today's bundles write an unsplit dimension as null in "sharding" lists; the typed schema
    holds "" (proto3 JSON has no null list elements)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "sharding" and isinstance(value, list):
                obj[key] = ["" if s is None else s for s in value]
            else:
                _null_sharding_to_empty(value)
    elif isinstance(obj, list):
        for item in obj:
            _null_sharding_to_empty(item)


def mesh_roles(axes):
    """Returns the axes when each is a role; an axis that is not one is an error naming it."""
    for name in axes:
        if name not in ROLES:
            raise BundleError(
                f"mesh.axes: axis \"{name}\" is not mapped to a role (data, model or expert); "
                "export with meshrun.export(..., axis_roles={\"%s\": \"data\"}) or rename it"
                % name)
    return axes


def _check_program(path, field, program):
    if not program.file:
        raise BundleError(f"{path}: {field}.file is missing")
    if program.format not in ("", "mlir"):
        raise BundleError(f"{path}: {field}.format must be \"mlir\", got \"{program.format}\"")
    for i in program.donated_inputs:
        if not 0 <= i < len(program.inputs):
            raise BundleError(f"{path}: {field}.donated_inputs holds {i}, but the program has "
                              f"{len(program.inputs)} inputs")


def read_bundle(bundle):
    """bundle: a directory holding job.json, or the job.json path. Returns (JobBundle, path)."""
    path = os.path.join(bundle, "job.json") if os.path.isdir(bundle) else bundle
    if not os.path.exists(path):
        raise BundleError(f"{path} does not exist")
    with open(path) as f:
        try:
            root = json.load(f)
        except json.JSONDecodeError as e:
            raise BundleError(f"{path} is not valid JSON: {e}") from None
    _null_sharding_to_empty(root)
    try:
        parsed = json_format.ParseDict(root, bundle_pb2.JobBundle())
    except json_format.ParseError as e:
        raise BundleError(f"{path} is not a JobBundle (proto/meshrun/v1/bundle.proto): {e}") \
            from None
    if not parsed.name:
        raise BundleError(f"{path}: name is missing")
    if not parsed.mesh.axes:
        raise BundleError(f"{path}: mesh.axes is missing")
    if len(parsed.mesh.shape) != len(parsed.mesh.axes):
        raise BundleError(f"{path}: mesh.shape has {len(parsed.mesh.shape)} sizes for "
                          f"{len(parsed.mesh.axes)} mesh.axes")
    mesh_roles(parsed.mesh.axes)
    if parsed.model_family not in _FAMILIES:
        raise BundleError(f"{path}: model_family \"{parsed.model_family}\" is not dense, moe or "
                          "mamba")
    programs = parsed.programs
    _check_program(path, "programs.init", programs.init)
    if programs.grad.file or programs.apply.file:
        _check_program(path, "programs.grad", programs.grad)
        _check_program(path, "programs.apply", programs.apply)
        if programs.step.file:
            raise BundleError(f"{path}: programs.step is set beside grad and apply")
        if parsed.grad_accumulation < 1:
            raise BundleError(f"{path}: grad_accumulation must be >= 1 with grad and apply")
    else:
        _check_program(path, "programs.step", programs.step)
    return parsed, path


def is_array_file(path):
    """Whether `path` is one existing file that is not a token shard (docs/data.md): an
    array-batch file (meshrun.data.write_arrays)."""
    if any(c in path for c in "*?[") or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(len(_SHARD_MAGIC)) != _SHARD_MAGIC


def job_spec_from_bundle(bundle, steps=100, cadence=10, data=None, host_replicas=0, *,
                         checkpoint_dir=None, checkpoint_every=100, keep_checkpoints=3,
                         resume_from=None, max_restarts=None, get_job=None,
                         memory_checkpoint_every=None):
    """bundle: a directory holding job.json, or the job.json path.
    data: None keeps the bundle's own batches; "synthetic"; an array-batch file
    (meshrun.data.write_arrays: the step's batch inputs); or a token shard glob.
    checkpoint_dir, checkpoint_every, keep_checkpoints, resume_from, max_restarts, get_job,
    memory_checkpoint_every:
    meshrun.checkpoints.apply_checkpoint_options (docs/checkpoints.md)."""
    if steps < 1 or cadence < 1:
        raise BundleError("steps and cadence must be >= 1")
    parsed, path = read_bundle(bundle)
    bundle_dir = os.path.dirname(os.path.abspath(path))
    spec = job_pb2.JobSpec(name=parsed.name, model_family=_FAMILIES[parsed.model_family])
    mode_b = bool(parsed.programs.grad.file)
    roles = ("init", "grad", "apply") if mode_b else ("init", "step")
    for role in roles:
        program = getattr(parsed.programs, role)
        file = os.path.join(bundle_dir, program.file)
        if not os.path.exists(file):
            raise BundleError(f"{path}: programs.{role}.file names {file}, which does not exist")
        with open(file, "rb") as f:
            spec.programs.add(role=role, stablehlo=f.read(), inputs=program.inputs,
                              outputs=program.outputs, donated_inputs=program.donated_inputs)
    if mode_b:
        spec.grad_accumulation = parsed.grad_accumulation
    spec.state_count = len(parsed.programs.init.outputs)
    for i, t in enumerate(parsed.telemetry):
        combine = getattr(telemetry_pb2, "COMBINE_" + t.combine.upper(), 0) if t.combine else 0
        if not combine:
            raise BundleError(f"{path}: telemetry[{i}].combine \"{t.combine}\" is not mean, max, "
                              "min, sum or last")
        spec.telemetry.add(name=t.name or t.output, output=t.output, shape=t.shape,
                           combine=combine, caption=t.caption)
    if parsed.HasField("sparse_attention"):
        s, sa = parsed.sparse_attention, spec.sparse_attention
        for key in ("seq_len", "causal", "window_left", "window_right", "block_q", "block_kv",
                    "max_grid_width", "heads_per_plan", "doc_ids_input"):
            setattr(sa, key, getattr(s, key))
        sa.windowed = s.HasField("window_left") or s.HasField("window_right")
        for table, name in s.table_inputs.items():
            if table not in _TABLES:
                raise BundleError(f"{path}: sparse_attention.table_inputs.{table} is not one of "
                                  f"{', '.join(_TABLES)}")
            setattr(sa, table + "_input", name)
    spec.telemetry_cadence = cadence
    spec.steps = steps
    spec.data.vocab_size = parsed.vocab_size
    if data is None:
        spec.data.example_bundle = os.path.abspath(path)
    elif data == "synthetic":
        spec.data.synthetic = True
    elif is_array_file(os.fspath(data)):
        spec.data.array_file = os.path.abspath(data)
    else:
        spec.data.token_shards_glob = os.path.abspath(data)
    spec.data.seed = parsed.seed
    sizes = dict(zip(parsed.mesh.axes, parsed.mesh.shape))
    spec.mesh.data_parallel = int(sizes.get("data", 1))
    spec.mesh.tensor_parallel = int(sizes.get("model", 1))
    spec.mesh.expert_parallel = int(sizes.get("expert", 1))
    spec.mesh.host_replicas = host_replicas or parsed.mesh.host_replicas
    return apply_checkpoint_options(
        spec, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints, resume_from=resume_from, max_restarts=max_restarts,
        get_job=get_job, memory_checkpoint_every=memory_checkpoint_every)
