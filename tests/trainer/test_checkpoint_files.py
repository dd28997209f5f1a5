"""The commit protocol on disk: every kind of damage is skipped and the previous checkpoint is chosen; a
checkpoint that cannot be read (permission or I/O error) is not damage: it stops the run instead."""

from __future__ import annotations

import errno
import json
import shutil
import traceback

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from spotrun.seams import CHECKPOINT_MANIFEST as MANIFEST
from spotrun_trainer import checkpoint
from spotrun_trainer.checkpoint import CheckpointError, committed_checkpoints, describe_failure, verify

# Reading /proc/self/mem at offset 0 (an unmapped address) fails with EIO: a real I/O error from the kernel,
# which a test running as root can provoke (permission bits do not stop root).
EIO_FILE = "/proc/self/mem"


@pytest.fixture
def ckpt(baseline, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(baseline.ckpt, dst)
    return dst


def newest(ckpt):
    return ckpt / "step-00000024"


def test_two_newest_checkpoints_are_kept_with_complete_manifests(ckpt):
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000020", "step-00000024"]
    manifest, reason = verify(newest(ckpt))
    assert reason == "" and manifest["step"] == 24 and manifest["world_size"] == 2
    names = {f["path"] for f in manifest["files"]}
    assert names == {".metadata", "__0_0.distcp", "__1_0.distcp"}  # per-rank names: unique across instances
    assert manifest["train_state"]["loader"]["position"] == 24 * 4


@pytest.mark.parametrize("damage, reason", [
    (lambda d: (d / MANIFEST).unlink(), "no manifest"),
    (lambda d: (d / "__0_0.distcp").write_bytes((d / "__0_0.distcp").read_bytes()[:-100]), "has"),
    (lambda d: (d / "__1_0.distcp").unlink(), "__1_0.distcp is missing"),
    (lambda d: (d / ".metadata").write_bytes(b""), ".metadata has 0 bytes"),
    (lambda d: _flip(d / "__0_0.distcp"), "content hash differs"),
    (lambda d: (d / MANIFEST).write_text("{"), "manifest unreadable"),
    (lambda d: (d / MANIFEST).write_bytes(b'{"format": 1, "step": 24, "files": ["\xff\xfe"]}'), "manifest unreadable"),
    (lambda d: _edit_manifest(d, files=[1, 2]), "manifest unreadable"),
    (lambda d: _edit_manifest(d, files={"a": 1}), "manifest unreadable"),
    (lambda d: _edit_manifest(d, step="24"), "do not match"),
    (lambda d: _edit_manifest(d, files=[{"path": "../step-00000020/.metadata", "size": 1, "sha256": ""},
                                        {"path": ".metadata", "size": 1, "sha256": ""}]), "not a file of this"),
    (lambda d: ((d / "__1_0.distcp").unlink(), (d / "__1_0.distcp").mkdir()), "__1_0.distcp is missing"),
])
def test_damaged_newest_checkpoint_is_skipped_and_previous_one_is_chosen(ckpt, damage, reason, caplog):
    damage(newest(ckpt))
    manifest, why = verify(newest(ckpt))
    assert manifest is None and reason in why
    found = committed_checkpoints(ckpt)
    assert [s for s, _ in found] == [20]
    assert any("step-00000024 skipped" in r.getMessage() for r in caplog.records)


def test_leftover_temporary_directory_is_ignored(ckpt):
    tmp = ckpt / "step-00000028.tmp"
    shutil.copytree(newest(ckpt), tmp)
    torn = ckpt / "step-00000032"  # a save killed before its manifest
    shutil.copytree(newest(ckpt), torn)
    (torn / MANIFEST).unlink()
    assert [s for s, _ in committed_checkpoints(ckpt)] == [24, 20]


def test_the_cost_guard_lists_the_trainers_newest_committed_step_in_s3(ckpt):
    """The guard's S3 listing against what the trainer wrote, mirrored as SageMaker mirrors the directory: the
    highest committed step is the trainer's newest verified one, and a torn save (no manifest yet) is not."""
    import boto3
    from moto import mock_aws

    from spotrun.pipeline.guard import committed_checkpoints as listed

    torn = ckpt / "step-00000032"
    shutil.copytree(newest(ckpt), torn)
    (torn / MANIFEST).unlink()
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="art-bucket")
        prefix = "checkpoints/run/exec-1/"
        for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
            s3.put_object(Bucket="art-bucket", Key=prefix + path.relative_to(ckpt).as_posix(), Body=path.read_bytes())
        newest_at, step = listed(s3, "art-bucket", prefix)
    assert step == committed_checkpoints(ckpt)[0][0] == 24 and newest_at is not None


def test_manifest_step_must_match_its_directory(ckpt):
    moved = ckpt / "step-00000030"
    shutil.copytree(newest(ckpt), moved)
    manifest, why = verify(moved)
    assert manifest is None and "do not match" in why
    assert json.loads((moved / MANIFEST).read_text())["step"] == 24


def _flip(path):
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 4096):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_manifest(directory, **changes):
    manifest = json.loads((directory / MANIFEST).read_text())
    (directory / MANIFEST).write_text(json.dumps({**manifest, **changes}))


def _make_unreadable(path):
    path.unlink()
    path.symlink_to(EIO_FILE)


@pytest.mark.parametrize("name", [MANIFEST, "__1_0.distcp"])
def test_unreadable_newest_checkpoint_stops_instead_of_falling_back(ckpt, name):
    if name != MANIFEST:  # the size check comes first: give the manifest the size the kernel reports (0)
        manifest = json.loads((newest(ckpt) / MANIFEST).read_text())
        for f in manifest["files"]:
            f["size"] = 0 if f["path"] == name else f["size"]
        (newest(ckpt) / MANIFEST).write_text(json.dumps(manifest))
    _make_unreadable(newest(ckpt) / name)
    with pytest.raises(CheckpointError, match=r"^checkpoint step-00000024 cannot be read \(Input/output error: "):
        verify(newest(ckpt))
    with pytest.raises(CheckpointError) as err:
        committed_checkpoints(ckpt)
    assert "remove step-00000024 to resume from the previous checkpoint" in str(err.value)


def test_permission_error_while_hashing_stops_too(ckpt, monkeypatch):
    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(checkpoint, "_sha256", denied)
    with pytest.raises(CheckpointError, match=r"cannot be read \(Permission denied: .*__0_0.distcp\)"):
        committed_checkpoints(ckpt)


def test_unreadable_older_checkpoint_is_skipped_when_a_newer_one_verifies(ckpt, caplog):
    _make_unreadable(ckpt / "step-00000020" / MANIFEST)
    assert [s for s, _ in committed_checkpoints(ckpt)] == [24]
    assert any("step-00000020 skipped (a newer one verified)" in r.getMessage() for r in caplog.records)


def test_unreadable_checkpoint_directory_does_not_look_empty(tmp_path):
    root = tmp_path / "not-a-dir"
    root.write_text("")
    with pytest.raises(CheckpointError, match="checkpoint directory .* cannot be read"):
        committed_checkpoints(root)
    assert committed_checkpoints(tmp_path / "absent") == []


def test_save_failures_are_described_in_one_line_naming_a_full_disk():
    def failed(exc):
        try:
            raise exc
        except OSError as raised:
            return raised, traceback.extract_tb(raised.__traceback__)

    full = CheckpointException("write failed", {0: failed(OSError(errno.EIO, "Input/output error", "a")),
                                                1: failed(OSError(errno.ENOSPC, "No space left on device", "b"))})
    assert describe_failure(full) == "no space left on device on rank 1 ([Errno 28] No space left on device: 'b')"
    other = CheckpointException("write failed", {1: failed(OSError(errno.EIO, "Input/output error", "a"))})
    assert describe_failure(other) == "rank 1: OSError: [Errno 5] Input/output error: 'a'"
    assert describe_failure(ValueError("x\ny")) == "ValueError: x y"


@pytest.mark.parametrize("values, finite", [
    ([[1.0, -2.0], [3.0]], True),
    ([[3e38, 3e38], [3e38]], True),  # finite values whose sum overflows: confirmed element-wise, still finite
    ([[1.0, float("nan")], [3.0]], False),
    ([[1.0], [float("inf")]], False),
    ([[float("inf"), float("-inf")]], False),  # their sum is NaN
    ([], True),
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_all_finite_is_exact_for_nan_inf_and_overflowing_sums(values, finite, dtype):
    import torch

    tensors = [torch.tensor(v, dtype=getattr(torch, dtype)) for v in values]
    if dtype == "bfloat16" and values and values[0][0] == 3e38:
        tensors = [torch.full((4,), 3e38, dtype=torch.bfloat16)]  # bf16 has fp32's range
    assert checkpoint.all_finite(tensors) is finite


def test_nodes_that_see_the_same_files_agree_and_nodes_that_do_not_are_named(tmp_path):
    from spotrun_trainer.checkpoint import NodeView, describe_mismatch

    for name in ("step-00000004/__0_0.distcp", "step-00000004/__1_0.distcp", "step-00000004/.metadata"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "other").mkdir()  # not a checkpoint: not compared
    seen = NodeView.of(tmp_path, rank=0)
    assert seen.files == {"step-00000004/__0_0.distcp", "step-00000004/__1_0.distcp", "step-00000004/.metadata"}
    assert describe_mismatch([seen, NodeView("b", 2, seen.files)], tmp_path) == ""
    only_own = NodeView("b", 2, frozenset({"step-00000004/__2_0.distcp"}))
    message = describe_mismatch([seen, only_own], tmp_path)
    assert message.startswith(f"checkpoint directory {tmp_path} differs between hosts: host {seen.host} (rank 0) "
                              "lacks 1 file(s) another host has (e.g. step-00000004/__2_0.distcp); host b (rank 2) "
                              "lacks 3 file(s) another host has (e.g. step-00000004/.metadata, "
                              "step-00000004/__0_0.distcp)."), message
    assert "deleting nothing" in message
    many = [NodeView(f"h{i}", 2 * i, frozenset({f"step-00000004/__{2 * i}_0.distcp"})) for i in range(16)]
    message = describe_mismatch(many, tmp_path)
    assert "host h2 (rank 4) lacks 15 file(s)" in message and "; and 13 more hosts. Every host" in message
    assert len(f"CheckpointError: {message}") < 1024  # whole in SageMaker's FailureReason
