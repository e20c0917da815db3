"""Reads a bundle directory (job.json + programs, as meshrun.export or examples/ write it) into
the JobSpec a client submits: the Python twin of the CLI's services/job_bundle.cc.

Only what a run needs is required: `reference` and `compile_options_jax` are test data and
ignored here. Mesh axes must be the roles data/model/expert (meshrun.export maps the user's
names); any other axis is refused by name."""
import json
import os

from meshrun.v1 import job_pb2, telemetry_pb2

ROLES = ("data", "model", "expert")
_FAMILIES = {"dense": job_pb2.MODEL_FAMILY_DENSE, "moe": job_pb2.MODEL_FAMILY_MOE,
             "mamba": job_pb2.MODEL_FAMILY_MAMBA}


class BundleError(ValueError):
    """A malformed bundle; the message names the file and field."""


def _field(obj, key, where):
    if key not in obj:
        raise BundleError(f"{where}: missing field \"{key}\"")
    return obj[key]


def _tensors(entries, out, where):
    for i, a in enumerate(entries):
        t = out.add()
        t.name = _field(a, "name", f"{where}[{i}]")
        t.dtype = _field(a, "dtype", f"{where}[{i}]")
        t.shape.extend(int(d) for d in _field(a, "shape", f"{where}[{i}]"))
        t.sharding.extend(s or "" for s in a.get("sharding", []))
        t.shard_shape.extend(int(d) for d in a.get("shard_shape", a["shape"]))


def _program(spec, role, program, bundle_dir, where):
    p = spec.programs.add()
    p.role = role
    path = os.path.join(bundle_dir, _field(program, "file", where))
    if not os.path.exists(path):
        raise BundleError(f"{where}.file: {path} does not exist")
    with open(path, "rb") as f:
        p.stablehlo = f.read()
    _tensors(_field(program, "inputs", where), p.inputs, where + ".inputs")
    _tensors(_field(program, "outputs", where), p.outputs, where + ".outputs")
    p.donated_inputs.extend(program.get("donated_inputs", []))


def mesh_roles(axes):
    """Returns {role: size} for mesh axes; an axis that is not a role is an error naming it."""
    for name in axes:
        if name not in ROLES:
            raise BundleError(
                f"mesh axis \"{name}\" is not mapped to a role (data, model or expert); "
                "export with meshrun.export(..., axis_roles={\"%s\": \"data\"}) or rename it"
                % name)
    return axes


def job_spec_from_bundle(bundle, steps=100, cadence=10, data=None, host_replicas=0):
    """bundle: a directory holding job.json, or the job.json path.
    data: None keeps the bundle's own batches; "synthetic"; or a token shard glob."""
    path = os.path.join(bundle, "job.json") if os.path.isdir(bundle) else bundle
    if not os.path.exists(path):
        raise BundleError(f"{path} does not exist")
    if steps < 1 or cadence < 1:
        raise BundleError("steps and cadence must be >= 1")
    bundle_dir = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        try:
            root = json.load(f)
        except json.JSONDecodeError as e:
            raise BundleError(f"{path} is not valid JSON: {e}") from None
    spec = job_pb2.JobSpec()
    spec.name = _field(root, "name", path)
    family = root.get("model_family", "dense")
    if family not in _FAMILIES:
        raise BundleError(f"{path}: model_family \"{family}\" is not dense, moe or mamba")
    spec.model_family = _FAMILIES[family]
    programs = _field(root, "programs", path)
    _program(spec, "init", _field(programs, "init", "programs"), bundle_dir, "programs.init")
    init_outputs = len(programs["init"]["outputs"])
    if "grad" in programs or "apply" in programs:
        for role in ("grad", "apply"):
            _program(spec, role, _field(programs, role, "programs"), bundle_dir, f"programs.{role}")
        spec.grad_accumulation = int(_field(root, "grad_accumulation", path))
    else:
        _program(spec, "step", _field(programs, "step", "programs"), bundle_dir, "programs.step")
    spec.state_count = init_outputs
    for i, t in enumerate(root.get("telemetry", [])):
        d = spec.telemetry.add()
        d.name = _field(t, "output", f"telemetry[{i}]")
        combine = t.get("combine", "")
        value = getattr(telemetry_pb2, "COMBINE_" + combine.upper(), None) if combine else None
        if not value:
            raise BundleError(f"telemetry[{i}].combine \"{combine}\" is not mean, max, min, "
                              "sum or last")
        d.combine = value
        d.shape.extend(int(x) for x in t.get("shape", []))
    if "sparse_attention" in root:
        s = root["sparse_attention"]
        sa = spec.sparse_attention
        for key in ("seq_len", "window_left", "window_right", "block_q", "block_kv",
                    "max_grid_width", "heads_per_plan"):
            setattr(sa, key, int(s.get(key, 0)))
        sa.causal = bool(s.get("causal", False))
        sa.windowed = "window_left" in s or "window_right" in s
        sa.doc_ids_input = s.get("doc_ids_input", "")
        for table, name in s.get("table_inputs", {}).items():
            setattr(sa, table + "_input", name)
    spec.telemetry_cadence = cadence
    spec.steps = steps
    if data is None:
        spec.data.example_bundle = os.path.abspath(path)
    elif data == "synthetic":
        spec.data.synthetic = True
    else:
        spec.data.token_shards_glob = os.path.abspath(data)
    spec.data.seed = int(_field(root, "seed", path))
    mesh = _field(root, "mesh", path)
    sizes = dict(zip(mesh_roles(_field(mesh, "axes", "mesh")), _field(mesh, "shape", "mesh")))
    spec.mesh.data_parallel = int(sizes.get("data", 1))
    spec.mesh.tensor_parallel = int(sizes.get("model", 1))
    spec.mesh.expert_parallel = int(sizes.get("expert", 1))
    spec.mesh.host_replicas = host_replicas or int(mesh.get("host_replicas", 0))
    return spec
