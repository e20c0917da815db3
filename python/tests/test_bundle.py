"""The typed bundle (proto/meshrun/v1/bundle.proto) from Python: every committed example
bundle reads unchanged, a bundle without test fixtures is enough, and errors name the field."""
import glob
import json
import os
import shutil

import pytest

import meshrun
from meshrun.v1 import job_pb2

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_committed_bundles_read_unchanged():
    paths = sorted(glob.glob(os.path.join(ROOT, "examples", "*", "*", "job.json")))
    assert len(paths) >= 10
    for path in paths:
        spec = meshrun.job_spec_from_bundle(path)
        for program in spec.programs:
            for t in program.inputs:
                assert len(t.sharding) == len(t.shape), (path, t.name)
    moe = meshrun.job_spec_from_bundle(os.path.join(ROOT, "examples/transformer_moe/dp4x2"))
    assert [p.role for p in moe.programs] == ["init", "grad", "apply"]
    assert moe.grad_accumulation >= 1 and moe.mesh.host_replicas == 2
    sparse = meshrun.job_spec_from_bundle(os.path.join(ROOT, "examples/transformer_lm/sparse_dp1"))
    assert sparse.sparse_attention.windowed and sparse.sparse_attention.block_mask_input


def _copy_without_fixtures(tmp_path):
    src = os.path.join(ROOT, "examples", "mlp_classifier", "dp1")
    for f in ("init.mlirbc", "step.mlirbc"):
        shutil.copy(os.path.join(src, f), tmp_path / f)
    job = json.load(open(os.path.join(src, "job.json")))
    for fixture in ("reference", "compile_options_jax", "data"):
        job.pop(fixture)
    return job


def test_bundle_without_fixtures_and_errors_naming_the_field(tmp_path):
    job = _copy_without_fixtures(tmp_path)
    json.dump(job, open(tmp_path / "job.json", "w"))
    spec = meshrun.job_spec_from_bundle(str(tmp_path), data="synthetic")
    assert spec.data.synthetic and spec.programs[1].role == "step"
    for change, field in ((lambda j: j.update(seed="seven"), "seed"),
                          (lambda j: j.update(nmae="x"), "nmae"),
                          (lambda j: j["programs"]["step"].update(file="absent.mlirbc"),
                           "programs.step.file"),
                          (lambda j: j["telemetry"][0].update(combine="median"),
                           "telemetry[0].combine"),
                          (lambda j: j["mesh"].update(axes=["batch"]), '"batch"')):
        broken = json.loads(json.dumps(job))
        change(broken)
        json.dump(broken, open(tmp_path / "job.json", "w"))
        with pytest.raises(meshrun.BundleError, match=field.replace("[", r"\[")):
            meshrun.job_spec_from_bundle(str(tmp_path))


def test_data_argument_tells_array_files_from_token_shards(tmp_path):
    job = _copy_without_fixtures(tmp_path)
    json.dump(job, open(tmp_path / "job.json", "w"))
    arrays = tmp_path / "train.arrays"
    arrays.write_bytes(b"\0" * 64)
    shard = tmp_path / "corpus-00000.tok"
    shard.write_bytes(b"MRTOKSHD" + b"\0" * 40)
    assert meshrun.job_spec_from_bundle(str(tmp_path), data=str(arrays)).data.array_file
    assert meshrun.job_spec_from_bundle(str(tmp_path), data=str(shard)).data.token_shards_glob
    spec = meshrun.job_spec_from_bundle(str(tmp_path), data=str(tmp_path / "corpus-*.tok"))
    assert spec.data.WhichOneof("source") == "token_shards_glob"
    assert isinstance(spec, job_pb2.JobSpec)
