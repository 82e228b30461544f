"""ModelInfo.revision: the worker hashes a model's files as the gateway's
internal/receipt.DirRevision does (docs/receipts.md)."""

import hashlib
import os

from loops_worker.revision import dir_revision

# internal/receipt's TestDirRevision requires the same value for the same two files.
GO_REVISION = "sha256:4d29798c6e59eb7dfc2b375b8998040ed29cf33c98038b41e9717a6c37f5dad7"


def test_dir_revision_matches_the_gateway(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_text("weights")
    assert dir_revision(str(tmp_path)) == GO_REVISION
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x").write_text("ignored")
    assert dir_revision(str(tmp_path)) == GO_REVISION
    (tmp_path / "model.safetensors").write_text("weightz")
    assert dir_revision(str(tmp_path)) != GO_REVISION


def test_dir_revision_takes_a_blob_name_as_its_hash(tmp_path):
    digest = hashlib.sha256(b"weights").hexdigest()
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / digest).write_text("weights")
    snap = tmp_path / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    os.symlink(os.path.join("..", "..", "blobs", digest), snap / "model.safetensors")
    assert dir_revision(str(snap)) == GO_REVISION


def test_worker_reports_the_revision(engine, tiny_dir):
    assert engine.models["tiny"].info.revision == dir_revision(tiny_dir)
    assert engine.models["tiny"].info.revision.startswith("sha256:")
