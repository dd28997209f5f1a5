"""Token shards: prepare writes sequential shards plus an index; the loader is deterministic and resumable."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spotrun_trainer.data import DataError, TokenShardLoader, prepare, read_index


@pytest.fixture(scope="module")
def small_shards(assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    index = prepare([assets["corpus"]], str(assets["tokenizer"]), out, shard_bytes=4096)
    return out, index


def test_prepare_writes_shards_of_the_requested_size_and_an_index(small_shards, assets):
    out, index = small_shards
    assert index["dtype"] == "uint16" and len(index["shards"]) > 3
    assert all(s["tokens"] == 2048 for s in index["shards"][:-1])  # 4096 bytes of uint16
    assert index["total_tokens"] == sum(s["tokens"] for s in index["shards"])
    tokens = np.concatenate([np.fromfile(out / s["file"], dtype=np.uint16) for s in index["shards"]])
    docs = [json.loads(line)["text"] for line in assets["corpus"].read_text().splitlines()]
    assert (tokens == index["eos_token_id"]).sum() == len(docs)  # one EOS per document
    assert (out / "tokenizer" / "tokenizer_config.json").exists()


def _loaders(out, dp_size, micro_batch=2, seq_len=32, seed=1):
    return [TokenShardLoader(out, seq_len=seq_len, micro_batch=micro_batch, dp_rank=r, dp_size=dp_size, seed=seed)
            for r in range(dp_size)]


@pytest.fixture
def unique_tokens(tmp_path):
    """Shards whose tokens are 0..N-1, so equal samples mean the same sample was read twice."""
    shards = []
    for i in range(5):
        np.arange(i * 1000, (i + 1) * 1000, dtype=np.uint16).tofile(tmp_path / f"shard-{i:05d}.bin")
        shards.append({"file": f"shard-{i:05d}.bin", "tokens": 1000})
    (tmp_path / "index.json").write_text(json.dumps(
        {"format": 1, "dtype": "uint16", "eos_token_id": 0, "total_tokens": 5000, "shards": shards}))
    return tmp_path


def test_ranks_read_disjoint_samples_that_cover_the_epoch(unique_tokens):
    loaders = _loaders(unique_tokens, 2)
    seen = set()
    for _ in range(loaders[0].steps_per_epoch):
        for loader in loaders:
            for row in loader.next_batch():
                key = row.tobytes()
                assert key not in seen
                seen.add(key)
    assert len(seen) == loaders[0].steps_per_epoch * 4


def test_loader_is_deterministic_and_resumes_from_its_state(unique_tokens):
    out = unique_tokens
    a = _loaders(out, 1, seq_len=100)[0]
    batches = [a.next_batch() for _ in range(50)]  # crosses into epoch 1
    assert a.state.epoch == 1
    b = _loaders(out, 1, seq_len=100)[0]
    for _ in range(20):
        b.next_batch()
    c = _loaders(out, 1, seq_len=100)[0]
    c.load_state_dict(b.state_dict())
    for expected in batches[20:]:
        assert np.array_equal(c.next_batch(), expected)


def test_epochs_visit_shards_in_different_orders(unique_tokens):
    loader = _loaders(unique_tokens, 1)[0]
    assert loader._epoch_order(0) != loader._epoch_order(1)
    assert sorted(loader._epoch_order(0)) == sorted(loader._epoch_order(1))


def test_damaged_shard_is_reported_with_its_name(small_shards, tmp_path):
    import shutil

    out, index = small_shards
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    name = index["shards"][1]["file"]
    (copy / name).write_bytes((copy / name).read_bytes()[:100])
    with pytest.raises(DataError, match=f"{name}: 100 bytes on disk"):
        read_index(copy)


def test_missing_index_and_bad_jsonl_are_clear_errors(tmp_path, assets):
    with pytest.raises(DataError, match="index.json not found: run `python -m spotrun_trainer prepare`"):
        read_index(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: expected an object with a string field 'text'"):
        prepare([bad], str(assets["tokenizer"]), tmp_path / "out")


def test_too_little_data_for_one_step_is_a_clear_error(small_shards):
    out, _ = small_shards
    with pytest.raises(DataError, match="one step needs micro_batch\\*dp_size"):
        TokenShardLoader(out, seq_len=2000, micro_batch=64, dp_rank=0, dp_size=8, seed=0)
