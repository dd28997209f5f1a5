"""The commit protocol on disk: every kind of damage is skipped and the previous checkpoint is chosen."""

from __future__ import annotations

import json
import shutil

import pytest

from spotrun_trainer.checkpoint import MANIFEST, committed_checkpoints, verify


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
