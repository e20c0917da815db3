"""meshrun.data: u32 token shards (vocabulary 100,000) written in Python train the examples'
LM through a real worker, with the receipt of exactly those files."""
import glob
import hashlib
import os

import numpy as np

import meshrun
import meshrun.data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_u32_shards_train_the_lm(tmp_path, cluster):
    """Version 2 shards (4-byte tokens) train the byte-level LM; shards of a vocabulary larger
    than the model's are refused at submit (test_data_quality.py)."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 256, size=rng.integers(20, 90)) for _ in range(300)]
    paths = meshrun.data.write_token_shards(str(tmp_path / "corpus"), docs, vocab_size=256,
                                            dtype="u32", shard_tokens=6000)
    assert len(paths) > 1
    with open(paths[0], "rb") as f:
        assert f.read(24)[8:24] == np.array([2, 256, 0, 4], "<u4").tobytes()

    client = cluster.client
    job_id = client.submit(os.path.join(ROOT, "examples/transformer_lm/dp1"), steps=3, cadence=1,
                           data=str(tmp_path / "corpus-*.tok"))
    manifest = client.wait(job_id, timeout=120)
    state = meshrun.v1.job_pb2.JobState.Name(manifest.state)
    assert state == "JOB_STATE_SUCCEEDED", str(manifest) + cluster.logs()
    receipt = manifest.data_receipt
    assert list(receipt.files) == sorted(glob.glob(str(tmp_path / "corpus-*.tok")))
    assert receipt.tokens == sum(len(d) + 1 for d in docs)
    whole = hashlib.sha256(b"".join(open(p, "rb").read() for p in receipt.files)).hexdigest()
    assert receipt.sha256 == whole
    assert manifest.last_step == 3


def test_u16_refuses_a_vocabulary_above_65536(tmp_path):
    import pytest
    with pytest.raises(ValueError, match="use dtype=\"u32\""):
        meshrun.data.write_token_shards(str(tmp_path / "x"), [[1, 2]], vocab_size=100_000)
