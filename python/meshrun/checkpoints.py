"""Checkpoint options of a JobSpec (docs/checkpoints.md): the Python twin of the CLI's
cli/cli_checkpoints.cc (--checkpoint_dir, --checkpoint_every, --keep_checkpoints,
--resume_from), plus max_restarts. Paths become absolute: the workers read them."""
import os

from meshrun.errors import BundleError

MANIFEST_FILE = "meshrun_checkpoint.json"   # checkpoint/store.h kManifestFile
_TEMP_SUFFIX = ".meshrun-tmp"               # checkpoint/store.cc kTempSuffix
_ORBAX_METADATA = "_METADATA"               # checkpoint/orbax_read.cc kTreeMetadata


def _is_step_name(name):
    return name.isdigit()


def _orbax_item_dir(path):
    """An Orbax item directory (one holding _METADATA): `path` itself or its only such child."""
    if os.path.isfile(os.path.join(path, _ORBAX_METADATA)):
        return path
    if "orbax-checkpoint-tmp" in os.path.basename(path):
        return ""
    items = [os.path.join(path, e) for e in sorted(os.listdir(path))
             if os.path.isfile(os.path.join(path, e, _ORBAX_METADATA))]
    return items[0] if len(items) == 1 else ""


def resolve_checkpoint(path):
    """A committed step directory from `path`: a step directory, or a checkpoint directory
    (its newest committed step). In a directory meshrun writes to only manifest-committed steps
    count; in one only Orbax wrote, Orbax-committed steps do; a temp step never restores.
    BundleError for a partial checkpoint or a directory holding none, as the CLI's
    checkpoint::ResolveCheckpoint."""
    path = os.path.normpath(os.path.abspath(path))
    if not os.path.isdir(path):
        raise BundleError(f"resume_from: {path} is not a directory")
    name = os.path.basename(path)
    if _TEMP_SUFFIX in name:
        raise BundleError(f"resume_from: {path} is a checkpoint being written (or abandoned), "
                          "never committed; use a committed step")
    if os.path.exists(os.path.join(path, MANIFEST_FILE)):
        return path
    item = _orbax_item_dir(path)
    if item:
        return item
    if _is_step_name(name):
        raise BundleError(f"resume_from: {path} is a partial checkpoint (no {MANIFEST_FILE}): its "
                          "hosts never all reported, so it was not committed; use an earlier step")
    entries = [e for e in os.listdir(path) if os.path.isdir(os.path.join(path, e))]
    steps = [int(e) for e in entries
             if _is_step_name(e) and os.path.exists(os.path.join(path, e, MANIFEST_FILE))]
    if not steps and not any(_TEMP_SUFFIX in e for e in entries):  # a directory only Orbax wrote
        steps = [int(e) for e in entries
                 if _is_step_name(e) and _orbax_item_dir(os.path.join(path, e))]
    if not steps:
        raise BundleError(f"resume_from: {path} holds no committed checkpoint (no "
                          f"<step>/{MANIFEST_FILE}, nor an Orbax <step>/_METADATA)")
    return resolve_checkpoint(os.path.join(path, str(max(steps))))


def apply_checkpoint_options(spec, *, checkpoint_dir=None, checkpoint_every=100,
                             keep_checkpoints=3, resume_from=None, max_restarts=None,
                             get_job=None, memory_checkpoint_every=None):
    """Sets spec.checkpoint, spec.resume_from and spec.max_restarts in place.
    resume_from: a committed step directory, a checkpoint directory (its newest committed step)
    or a job id, looked up with get_job(job_id) -> JobManifest (its newest committed checkpoint
    this machine sees). max_restarts: None = the coordinator's default (3 with checkpoints).
    memory_checkpoint_every: each host also keeps its state in memory after every N-th step, for
    restarts (0 = never); None = the default (10)."""
    if checkpoint_dir is not None:
        checkpoint_dir = os.fspath(checkpoint_dir)
        if not os.path.isdir(checkpoint_dir):
            raise BundleError(f"checkpoint_dir {checkpoint_dir} is not a directory; create it (on "
                              "storage every host of the job mounts)")
        if checkpoint_every < 1:
            raise BundleError("checkpoint_every must be >= 1")
        if keep_checkpoints < 0:
            raise BundleError("keep_checkpoints must be >= 0 (0 keeps all)")
        spec.checkpoint.directory = os.path.normpath(os.path.abspath(checkpoint_dir))
        spec.checkpoint.every_steps = checkpoint_every
        spec.checkpoint.keep_last = keep_checkpoints
        if memory_checkpoint_every is not None:
            if memory_checkpoint_every < 0:
                raise BundleError("memory_checkpoint_every must be >= 0 (0 = never)")
            spec.checkpoint.memory_every_steps = memory_checkpoint_every
    if max_restarts is not None:
        if max_restarts < 0:
            raise BundleError("max_restarts must be >= 0 (0 never restarts)")
        spec.max_restarts = max_restarts
    if resume_from is None:
        return spec
    resume_from = os.fspath(resume_from)
    if os.path.exists(resume_from):
        spec.resume_from = resolve_checkpoint(resume_from)
        return spec
    if get_job is None:
        raise BundleError(f"resume_from {resume_from} is not a directory (a job id needs "
                          "meshrun.Client.submit, which can look the job up)")
    job = get_job(resume_from)
    for record in reversed(job.checkpoints):
        if record.committed and os.path.exists(record.path):
            spec.resume_from = record.path
            return spec
    raise BundleError(f"resume_from {resume_from}: job {resume_from} has no committed checkpoint "
                      "on this machine")
