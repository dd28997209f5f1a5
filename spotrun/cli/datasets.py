"""Prepared datasets, content-addressed: the one entry point to the trainer's tokenizer pipeline outside the image.

`spotrun prepare` and `spotrun local` (raw text in `data.source`) both come here; the tokenizing itself is
`spotrun_trainer.data.prepare`, the same code `python -m spotrun_trainer prepare` runs in the image.

- `dataset_key`: a SHA-256 over the inputs' names and bytes, every tokenizer file (everything in the tokenizer or
  model directory but the weights: tokenizer.json, tokenizer_config.json, chat_template.jinja, vocab/merges,
  special tokens, ...) and the options that change the shards. Same key, same shards: never prepared twice.
- `prepare_dataset`: shards + index.json into a directory, written under a temporary name and renamed into place
  with a marker (`spotrun-prepare.json`, holding the key) only when complete: an interrupted or failed prepare
  leaves nothing that looks complete. A complete `<key>` directory of another cache (`also`: where another command
  prepares the same text) is reused rather than tokenized again.
- `upload_dataset`: a prepared directory to `s3://<bucket>/datasets/<name>/`, index.json and then the marker
  last (the trainer and the estimate read index.json: it appears only over complete shards); the same key already
  there is not uploaded again; another dataset under the name is refused rather than mixed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from botocore.exceptions import ClientError

from ..seams import PREPARE_MARKER, WEIGHT_SUFFIXES, DatasetIndex

KEY_VERSION = 2  # bump when the shard format or the tokenizing changes meaning (2: chat separators, data.py)
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_CHUNK = 1 << 20


class PrepareError(ValueError):
    """Inputs, tokenizer or destination unusable; the message names the file (and line) or the option."""


@dataclass(frozen=True)
class Prepared:
    path: Path
    key: str
    index: dict
    reused: bool
    seconds: float


def input_files(inputs: list[Path]) -> list[Path]:
    """The files to tokenize (the trainer's own discovery, which `prepare` uses): its errors as PrepareError."""
    # the trainer package (numpy, transformers) is optional for the CLI: OPTIONAL_MODULES in main.py
    from spotrun_trainer.data import DataError
    from spotrun_trainer.data import input_files as discover

    try:
        return discover(inputs)
    except DataError as exc:
        raise PrepareError(str(exc)) from None


def check_has_text(files: list[Path]) -> None:
    """Refuse inputs that are all empty or blank (the trainer's own refusal, `spotrun_trainer.data.prepare`), read
    here before anything else is asked for (a stage's credentials): compressed and Parquet files count as text."""
    for path in files:
        if path.name.endswith((".gz", ".parquet")):
            return
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                if chunk.strip():
                    return
    raise PrepareError(f"{', '.join(map(str, files))}: no documents (0 documents, 0 tokens): the files are empty or "
                       "hold only blank lines; a dataset needs text to train on")


def tokenizer_files(tokenizer_dir: Path) -> list[Path]:
    """Every file a tokenizer may load from the directory: all but the weights (and the marker of a dataset)."""
    root = Path(tokenizer_dir)
    if not root.is_dir():
        raise PrepareError(f"tokenizer {root} is not a directory (expected a Hugging Face model or tokenizer "
                           "directory with tokenizer.json or tokenizer_config.json)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)
                   and p.name != "model.safetensors.index.json")
    if not any(p.name in ("tokenizer.json", "tokenizer_config.json") for p in files):
        raise PrepareError(f"tokenizer {root} has no tokenizer.json or tokenizer_config.json")
    return files


def _hash_file(digest, path: Path) -> None:
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)


def dataset_key(files: list[Path], tokenizer_dir: Path, *, text_field: str, shard_bytes: int,
                validation_fraction: float = 0.0) -> str:
    """What the shards depend on, as 24 hex digits: the inputs' names and bytes, the tokenizer's files, options
    (a validation split is another dataset)."""
    options = {"version": KEY_VERSION, "text_field": text_field, "shard_bytes": shard_bytes}
    if validation_fraction:
        options["validation_fraction"] = validation_fraction
    digest = hashlib.sha256(json.dumps(options).encode())
    tokenizer_root = Path(tokenizer_dir)
    for kind, root, paths in (("input", None, files), ("tokenizer", tokenizer_root, tokenizer_files(tokenizer_root))):
        for path in paths:
            name = path.relative_to(root).as_posix() if root else path.name
            digest.update(f"\0{kind}\0{name}\0{path.stat().st_size}\0".encode())
            _hash_file(digest, path)
    return digest.hexdigest()[:24]


def read_marker(path: Path) -> dict | None:
    try:
        return json.loads((Path(path) / PREPARE_MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None


class _Forward(logging.Handler):
    def __init__(self, emit: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.forward = emit

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("prepare:"):  # progress; the last line (naming the temporary directory) is ours
            self.forward(f"[prepare] {message.split(':', 1)[1].strip()}")


def holds(path: Path, key: str) -> bool:
    """Whether `path` is a complete prepared dataset of this content key (its marker's key, and index.json)."""
    marker = read_marker(path)
    return marker is not None and marker.get("key") == key and (Path(path) / DatasetIndex.FILE).is_file()


def prepare_dataset(inputs: list[Path], tokenizer_dir: Path, out: Path | None = None, *, cache: Path | None = None,
                    also: tuple[Path, ...] = (), text_field: str = "text", shard_bytes: int = 256 * 1024 * 1024,
                    emit: Callable[[str], None] = print, progress_seconds: float = 5.0,
                    validation_fraction: float = 0.0) -> Prepared:
    """Shards + index.json of `inputs` at `out` (or at `cache/<key>`), unless it already holds exactly them.
    `also`: other caches whose `<key>` directory is reused when complete (another command's: `spotrun estimate`
    prepares beside the run file, `spotrun local` under its --out), so the same text is never tokenized twice.
    `validation_fraction`: that share of the documents goes to `validation/` (spotrun_trainer.data.prepare)."""
    t0 = time.monotonic()
    files = input_files(inputs)
    key = dataset_key(files, tokenizer_dir, text_field=text_field, shard_bytes=shard_bytes,
                      validation_fraction=validation_fraction)
    if (out is None) == (cache is None):
        raise ValueError("prepare_dataset needs exactly one of out and cache")
    out = Path(out) if out is not None else Path(cache) / key
    for there in (out, *(Path(c) / key for c in also if cache is not None)):
        if holds(there, key):
            index = json.loads((there / DatasetIndex.FILE).read_text())
            return Prepared(there, key, index, reused=True, seconds=round(time.monotonic() - t0, 3))
    if out.exists() and any(out.iterdir()):
        raise PrepareError(f"{out} already holds other files (another dataset, or other inputs or tokenizer): choose "
                           "another output or remove it")
    # the trainer package (numpy, transformers) is optional for the CLI: OPTIONAL_MODULES in main.py
    from spotrun_trainer.data import DataError, prepare

    staging = out.parent / f".{out.name}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    handler = _Forward(emit)
    data_log = logging.getLogger("spotrun_trainer.data")
    data_log.addHandler(handler)
    level, data_log.level = data_log.level, logging.INFO
    try:
        index = prepare(files, str(tokenizer_dir), staging, shard_bytes=shard_bytes, text_field=text_field,
                        progress_seconds=progress_seconds, validation_fraction=validation_fraction)
    except DataError as exc:
        raise PrepareError(str(exc)) from None
    finally:
        data_log.removeHandler(handler)
        data_log.setLevel(level)
        if not (staging / DatasetIndex.FILE).is_file():
            shutil.rmtree(staging, ignore_errors=True)
    seconds = round(time.monotonic() - t0, 3)
    (staging / PREPARE_MARKER).write_text(json.dumps({
        "key": key, "inputs": [str(f) for f in files], "tokenizer": str(tokenizer_dir), "text_field": text_field,
        "shard_bytes": shard_bytes, "total_tokens": index[DatasetIndex.TOTAL_TOKENS], "seconds": seconds},
        indent=2) + "\n")
    if out.exists():
        out.rmdir()  # empty (checked above)
    staging.rename(out)
    tokens = index[DatasetIndex.TOTAL_TOKENS]
    emit(f"[prepare] {tokens:,} tokens in {len(index[DatasetIndex.SHARDS])} shard(s) in {seconds:.1f} s "
         f"({tokens / max(seconds, 1e-3):,.0f} tokens/s): {out}")
    return Prepared(out, key, index, reused=False, seconds=seconds)


def dataset_uri(bucket: str, name: str) -> str:
    return f"s3://{bucket}/datasets/{name}/"


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name or ""):
        raise PrepareError(f"--name={shlex.quote(name or '')} is invalid: expected 1-63 of a-z, 0-9, '.', '_', '-' "
                           "starting with a letter or digit (the dataset's prefix under datasets/)")
    return name


def remote_marker(s3: Any, bucket: str, prefix: str) -> tuple[dict | None, bool]:
    """(the marker under the prefix or None, whether an index.json is there)."""
    def get(key: str) -> bytes | None:
        try:
            return s3.get_object(Bucket=bucket, Key=prefix + key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    body = get(PREPARE_MARKER)
    index_there = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + DatasetIndex.FILE).get("KeyCount", 0) > 0
    try:
        return (json.loads(body) if body else None), index_there
    except json.JSONDecodeError:
        return None, index_there


def upload_dataset(s3: Any, local: Prepared, bucket: str, name: str, *, emit: Callable[[str], None] = print) -> dict:
    """The prepared directory to s3://bucket/datasets/<name>/; returns {"uri", "uploaded", "bytes", "seconds"}."""
    prefix = f"datasets/{check_name(name)}/"
    uri = dataset_uri(bucket, name)
    marker, index_there = remote_marker(s3, bucket, prefix)
    if marker is not None and marker.get("key") == local.key and index_there:
        return {"uri": uri, "uploaded": False, "bytes": 0, "seconds": 0.0}
    if marker is not None or index_there:
        raise PrepareError(f"{uri} already holds another dataset (prepared from other inputs or another tokenizer): "
                           "choose another --name")
    t0 = last = time.monotonic()
    files = sorted(p for p in local.path.rglob("*")
                   if p.is_file() and p.name not in (DatasetIndex.FILE, PREPARE_MARKER))
    ordered = [*files, local.path / DatasetIndex.FILE, local.path / PREPARE_MARKER]  # index.json, then the marker, last
    total, size = 0, sum(p.stat().st_size for p in ordered)
    for i, path in enumerate(ordered, 1):
        s3.upload_file(str(path), bucket, prefix + path.relative_to(local.path).as_posix())
        total += path.stat().st_size
        if time.monotonic() - last >= 5 and i < len(ordered):
            last = time.monotonic()
            emit(f"[prepare] uploading: {i}/{len(ordered)} files, {total / 1e6:,.1f} of {size / 1e6:,.1f} MB, "
                 f"{total / 1e6 / (last - t0):.1f} MB/s")
    seconds = round(time.monotonic() - t0, 3)
    emit(f"[prepare] uploaded {len(files) + 2} files, {total / 1e6:.1f} MB in {seconds:.1f} s "
         f"({total / 1e6 / max(seconds, 1e-3):.1f} MB/s) to {uri}")
    return {"uri": uri, "uploaded": True, "bytes": total, "seconds": seconds}
