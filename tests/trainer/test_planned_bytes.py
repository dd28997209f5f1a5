"""Planner = trainer for checkpoints: the bytes the planner budgets are the bytes the trainer's DCP checkpoint
holds (fp32 shards + AdamW moments of every trained parameter), read from the checkpoints the fixture runs wrote."""

from __future__ import annotations

import json

import pytest

from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import estimate
from spotrun_trainer.checkpoint import committed_checkpoints

from .conftest import LORA_HP

pytestmark = pytest.mark.slow
# DCP writes each tensor chunk as its own small torch.save archive: a fixed header of ~1.6 KB per chunk
# (measured: 1,577 bytes with torch 2.13) on top of the raw bytes.
CHUNK_HEADER_MAX = 2048


def _written(ckpt_root) -> tuple[int, int, int, int]:
    """(payload bytes of parameters + Adam moments, chunks of everything, .metadata bytes, all bytes)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    step, manifest = committed_checkpoints(ckpt_root)[0]
    directory = ckpt_root / f"step-{step:08d}"
    meta = FileSystemReader(str(directory)).read_metadata()
    payload = 0
    for key, md in meta.state_dict_metadata.items():
        if key.startswith("model.") or key.endswith((".exp_avg", ".exp_avg_sq")):
            assert isinstance(md, TensorStorageMetadata), key
            payload += md.size.numel() * md.properties.dtype.itemsize
    total = sum(f["size"] for f in manifest["files"])
    return payload, len(meta.storage_data), (directory / ".metadata").stat().st_size, total


def _planned(assets, training: dict) -> int:
    config = json.loads((assets["model"] / "config.json").read_text())
    run = parse_run({"version": 1, "name": "planned-bytes", "model": {"config": config},
                     "data": {"tokens": 1_000_000, "seq_len": 64}, "training": training,
                     "budget": {"max_usd": 1000}})
    return estimate(run).checkpoint_bytes


@pytest.mark.parametrize("method", ["full", "lora"])
def test_planned_checkpoint_bytes_are_the_bytes_the_trainer_writes(method, request, assets):
    job = request.getfixturevalue("baseline" if method == "full" else "lora_baseline")
    training = {"method": "full"} if method == "full" else {
        "method": "lora", "lora": {"rank": LORA_HP["training.lora.rank"], "target_modules": "all-linear"}}
    payload, chunks, metadata_bytes, total = _written(job.ckpt)
    assert payload == _planned(assets, training)
    # Everything else is DCP's framing: a header per chunk and the .metadata index (plus RNG and train state).
    assert payload + metadata_bytes < total <= payload + metadata_bytes + chunks * CHUNK_HEADER_MAX + 16_384
