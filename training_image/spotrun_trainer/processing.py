"""`prepare` as a SageMaker Processing job: this instance's share of the raw files into its own part.

The pipeline's preparation step (spotrun/pipeline/preparation.py) runs `python -m spotrun_trainer prepare
--sagemaker-processing` on N CPU instances. SageMaker gives each instance its share of the raw objects
(ShardedByS3Key) under `input/<data>/` and the tokenizer files (FullyReplicated) under `input/<tokenizer>/`, and
uploads what the instance writes under `output/` to one S3 prefix (the documented paths: /opt/ml/processing/...,
and /opt/ml/config/resourceconfig.json for the host). A failure's reason goes to /opt/ml/output/message, which
DescribeProcessingJob returns as ExitMessage (SageMaker "Save and Access Metadata Information About Your
Processing Job"). Every instance writes its part to `output/parts/<host>/`
(a complete prepared dataset of its files: shards, index.json, tokenizer/, validation/), so no two instances write
the same key; the pipeline's finish step merges the parts' indexes into the dataset's index.json.

`ProcessingPaths.under(root)` is built at the entry point (__main__); nothing below reads the environment.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from spotrun.seams import PARTS_DIR, PROCESSING_DATA_INPUT, PROCESSING_OUTPUT, PROCESSING_TOKENIZER_INPUT

from .data import DataError, input_files, input_kind, prepare

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessingPaths:
    data: Path  # this instance's share of the raw files
    tokenizer: Path  # the tokenizer files of model.source
    output: Path  # uploaded to the dataset's prefix at the end of the job
    host: str  # this instance's name (resourceconfig.json's current_host)
    message: Path  # its first 1 KB becomes DescribeProcessingJob's ExitMessage (why a job failed)

    @classmethod
    def under(cls, root: Path) -> ProcessingPaths:
        """SageMaker Processing's layout under `root` (/opt/ml in the container)."""
        config = root / "config" / "resourceconfig.json"
        try:
            host = json.loads(config.read_text())["current_host"]
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"{config}: expected SageMaker Processing's resource config with current_host "
                            f"({exc})") from None
        if not isinstance(host, str) or not host or "/" in host:
            raise DataError(f"{config}: current_host={host!r} is invalid: expected a host name such as algo-1")
        processing = root / "processing"
        return cls(data=processing / "input" / PROCESSING_DATA_INPUT,
                   tokenizer=processing / "input" / PROCESSING_TOKENIZER_INPUT,
                   output=processing / PROCESSING_OUTPUT, host=host, message=root / "output" / "message")


def prepare_part(paths: ProcessingPaths, *, shard_bytes: int, text_field: str,
                 validation_fraction: float) -> dict | None:
    """Tokenize this instance's files into `output/parts/<host>/`; returns its index, or None when SageMaker gave
    this instance no file (more instances than objects): it then writes nothing, and the merge has one part fewer."""
    files = [p for p in sorted(paths.data.rglob("*")) if p.is_file() and input_kind(p)] if paths.data.is_dir() else []
    if not files:
        log.info("prepare: no input files for %s under %s: nothing to do", paths.host, paths.data)
        return None
    out = paths.output / PARTS_DIR / paths.host
    return prepare(input_files(files), str(paths.tokenizer), out, shard_bytes=shard_bytes, text_field=text_field,
                   validation_fraction=validation_fraction, allow_empty=True)  # the merge refuses an empty whole
