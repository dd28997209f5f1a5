"""Token shards: `prepare` writes them, `TokenShardLoader` reads them back.

Layout of a prepared dataset directory:
    tokenizer/            the tokenizer used, copied into the exported model at the end
    index.json            {"format": 1, "dtype": "uint16"|"uint32", "eos_token_id": int,
                           "total_tokens": int, "shards": [{"file": "shard-00000.bin", "tokens": int}, ...]}
    shard-00000.bin ...   raw little-endian token ids, documents concatenated, each followed by EOS

The loader memory-maps shards and reads each one front to back (friendly to SageMaker FastFile mode, which
streams S3 objects sequentially). Samples are `seq_len` tokens packed from one shard; the shard order of an
epoch is a permutation seeded by (seed, epoch). A global step takes `micro_batch * dp_size` consecutive samples;
data-parallel rank r takes its own contiguous slice of them, so ranks never overlap and the whole position is
one integer: the number of samples consumed in the current epoch.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024


class DataError(ValueError):
    """The dataset directory or an input file is unusable; the message says which and why."""


def _iter_documents(paths: Iterable[Path], text_field: str) -> Iterator[str]:
    for path in paths:
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                        raise DataError(f"{path}:{lineno}: expected an object with a string field {text_field!r}")
                    yield record[text_field]
        elif path.suffix == ".txt":
            text = path.read_text(encoding="utf-8")
            # Blank-line separated paragraphs are documents; a file without blank lines is one document.
            for doc in text.split("\n\n"):
                if doc.strip():
                    yield doc
        else:
            raise DataError(f"{path}: unsupported input type {path.suffix!r}: expected .txt or .jsonl")


def prepare(
    inputs: list[Path],
    tokenizer_path: str,
    out_dir: Path,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    text_field: str = "text",
) -> dict:
    """Tokenize text/JSONL files into sequential shards plus index.json; returns the index."""
    from transformers import AutoTokenizer

    if shard_bytes < 1024:
        raise DataError(f"shard_bytes={shard_bytes} is invalid: expected at least 1024")
    files: list[Path] = []
    for item in inputs:
        item = Path(item)
        if item.is_dir():
            files.extend(sorted(p for p in item.rglob("*") if p.suffix in (".txt", ".jsonl")))
        elif item.exists():
            files.append(item)
        else:
            raise DataError(f"input {item} does not exist")
    if not files:
        raise DataError(f"no .txt or .jsonl files found in {[str(i) for i in inputs]}")

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(f"tokenizer at {tokenizer_path} has no eos_token_id; documents could not be separated")
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.uint32
    tokens_per_shard = max(1, shard_bytes // np.dtype(dtype).itemsize)

    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict] = []
    buffer: list[int] = []

    def flush(final: bool) -> None:
        while len(buffer) >= tokens_per_shard or (final and buffer):
            chunk, buffer[:] = buffer[:tokens_per_shard], buffer[tokens_per_shard:]
            name = f"shard-{len(shards):05d}.bin"
            np.asarray(chunk, dtype=dtype).tofile(out_dir / name)
            shards.append({"file": name, "tokens": len(chunk)})

    for doc in _iter_documents(files, text_field):
        buffer.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        buffer.append(eos)
        flush(final=False)
    flush(final=True)

    index = {
        "format": 1,
        "dtype": np.dtype(dtype).name,
        "eos_token_id": eos,
        "vocab_size": len(tokenizer),
        "total_tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
    }
    tokenizer.save_pretrained(out_dir / "tokenizer")  # exported beside the trained model
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
    log.info("prepared %d tokens in %d shards under %s", index["total_tokens"], len(shards), out_dir)
    return index


def read_index(data_dir: Path) -> dict:
    path = Path(data_dir) / INDEX_FILE
    if not path.is_file():
        raise DataError(f"{path} not found: run `python -m spotrun_trainer prepare` to create the dataset")
    try:
        index = json.loads(path.read_text())
        if index.get("format") != 1 or index.get("dtype") not in ("uint16", "uint32"):
            raise DataError(f"{path}: unsupported format/dtype {index.get('format')!r}/{index.get('dtype')!r}")
        for shard in index["shards"]:
            size = (Path(data_dir) / shard["file"]).stat().st_size
            if size != shard["tokens"] * np.dtype(index["dtype"]).itemsize:
                raise DataError(f"{shard['file']}: {size} bytes on disk, index says {shard['tokens']} tokens")
    except (KeyError, TypeError, json.JSONDecodeError, FileNotFoundError) as exc:
        raise DataError(f"{path} is damaged or does not match its shards: {exc}") from None
    return index


@dataclass
class LoaderState:
    """Where the data stream stands: samples consumed in the current epoch, and the epoch."""

    epoch: int = 0
    position: int = 0


class TokenShardLoader:
    """Deterministic, resumable packed-sample reader over memory-mapped shards for one data-parallel rank."""

    def __init__(self, data_dir: Path, *, seq_len: int, micro_batch: int, dp_rank: int, dp_size: int, seed: int):
        self.index = read_index(data_dir)
        dtype = np.dtype(self.index["dtype"])
        self.shards = [np.memmap(Path(data_dir) / s["file"], dtype=dtype, mode="r") for s in self.index["shards"]]
        self.samples_per_shard = [len(s) // seq_len for s in self.shards]
        self.samples_per_epoch = sum(self.samples_per_shard)
        self.global_batch = micro_batch * dp_size
        if self.samples_per_epoch < self.global_batch:
            raise DataError(
                f"dataset has {self.samples_per_epoch} samples of seq_len={seq_len}; one step needs "
                f"micro_batch*dp_size={self.global_batch}: use more data or a shorter seq_len"
            )
        self.seq_len, self.micro_batch, self.dp_rank, self.seed = seq_len, micro_batch, dp_rank, seed
        self.state = LoaderState()
        self._order_epoch = -1
        self._order: list[tuple[int, int]] = []

    @property
    def steps_per_epoch(self) -> int:
        return self.samples_per_epoch // self.global_batch

    def _epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            order = []
            for shard in rng.permutation(len(self.shards)).tolist():
                order.extend((shard, i) for i in range(self.samples_per_shard[shard]))
            self._order, self._order_epoch = order, epoch
        return self._order

    def next_batch(self) -> "np.ndarray":
        """The next micro-batch of this rank, shape (micro_batch, seq_len), as int64."""
        if self.state.position + self.global_batch > self.samples_per_epoch:
            self.state = LoaderState(epoch=self.state.epoch + 1, position=0)
        order = self._epoch_order(self.state.epoch)
        start = self.state.position + self.dp_rank * self.micro_batch
        rows = []
        for shard, i in order[start : start + self.micro_batch]:
            rows.append(np.asarray(self.shards[shard][i * self.seq_len : (i + 1) * self.seq_len], dtype=np.int64))
        self.state = LoaderState(self.state.epoch, self.state.position + self.global_batch)
        return np.stack(rows)

    def state_dict(self) -> dict:
        return {"epoch": self.state.epoch, "position": self.state.position, "global_batch": self.global_batch}

    def load_state_dict(self, sd: dict) -> None:
        epoch, position = int(sd["epoch"]), int(sd["position"])
        if int(sd.get("global_batch", self.global_batch)) != self.global_batch:
            # A different world size changes the batch; the sample position (not the step) is what carries over.
            log.warning("data: global batch was %s, now %s; resuming at sample %d of epoch %d",
                        sd.get("global_batch"), self.global_batch, position, epoch)
        self.state = LoaderState(epoch, position)
