"""Read what the estimate needs from a run's sources: the model's config.json and the data's index.json.

A source is a local directory or an s3://bucket/prefix URI (read with boto3; the estimate Lambda has read access
to the datasets/ and models/ prefixes). The pipeline reads strictly: a source it cannot read refuses the run, since
the training job could not read it either. The CLI may plan offline: a source it cannot read (no credentials,
the examples' placeholder bucket) is reported as not checked, and the run's inline copies (`model.config`,
`data.tokens`) are used instead when it has them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract.spec import RunSpec, RunValidationError, check_json_tree
from ..seams import DatasetIndex

PLACEHOLDER_BUCKET = "your-artifact-bucket"  # the examples' bucket: docs/deploying.md step 7 replaces it
MAX_SOURCE_JSON_BYTES = 1 << 20  # config.json and index.json are a few KB


@dataclass
class Sources:
    model_config: dict | None  # the source's config.json, or None when not read
    tokens: int | None  # index.json's total_tokens, or None when not read
    notes: list[str] = field(default_factory=list)  # what was read, and what was not and why
    validation_tokens: int | None = None  # data.validation's index.json total_tokens, or None when not read


class _Unreadable(Exception):
    """A source could not be read here (no credentials, access denied, placeholder bucket): not checked, as
    opposed to read and found wrong (missing object, bad JSON), which is a RunValidationError."""


def _read_bytes(source: str, name: str, field_path: str, s3_client: Any) -> bytes:
    if source.startswith("s3://"):
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, prefix = source[len("s3://"):].partition("/")
        key = f"{prefix.rstrip('/')}/{name}" if prefix.strip("/") else name
        try:
            client = s3_client or boto3.client("s3")
            return client.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_SOURCE_JSON_BYTES + 1)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "NoSuchBucket", "404"):  # read, and found missing: the source is wrong
                hint = ("; raw text under the stage's datasets/ is prepared by the pipeline itself (`spotrun "
                        "start` accepts it; estimating it here needs data.tokens)") if name == DatasetIndex.FILE else ""
                raise RunValidationError(field_path, source, f"a model or data directory holding {name} "
                                         f"(s3://{bucket}/{key}: {code}){hint}") from None
            raise _Unreadable(f"s3://{bucket}/{key} could not be read: {code or type(exc).__name__}") from None
        except BotoCoreError as exc:  # no credentials, no network: not checked
            raise _Unreadable(f"s3://{bucket}/{key} could not be read: {type(exc).__name__}") from None
    try:
        path = Path(source) / name
        with path.open("rb") as fh:
            return fh.read(MAX_SOURCE_JSON_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        hint = ""
        if name == DatasetIndex.FILE and Path(source).is_dir():  # raw text: tokenized by `spotrun prepare`
            hint = (f"; raw text is tokenized into one by `spotrun prepare {source} --tokenizer MODEL_DIR --out DIR` "
                    "(or `--stage STAGE --name NAME`)")
        raise RunValidationError(field_path, source, f"a directory holding {name} "
                                 f"({getattr(exc, 'strerror', None) or exc}){hint}") from None


def _read_json(source: str, name: str, field_path: str, s3_client: Any) -> dict:
    body = _read_bytes(source, name, field_path, s3_client)
    if len(body) > MAX_SOURCE_JSON_BYTES:
        raise RunValidationError(field_path, source, f"a {name} of at most {MAX_SOURCE_JSON_BYTES:,} bytes")
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        raise RunValidationError(field_path, source, f"a valid JSON {name}") from None
    if not isinstance(value, dict):
        raise RunValidationError(field_path, source, f"a {name} holding a JSON object")
    try:
        check_json_tree(value)
    except RunValidationError as exc:
        raise RunValidationError(field_path, source, f"a {name} without odd values ({exc})") from None
    return value


def _unreadable_here(source: str) -> str | None:
    if source.startswith(f"s3://{PLACEHOLDER_BUCKET}/"):
        return f"{source} still names the placeholder bucket {PLACEHOLDER_BUCKET}"
    return None


# The config.json fields in which Hugging Face model types keep their longest sequence (llama/qwen2/mistral: the
# first; gpt2: the second).
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def check_seq_len(run: RunSpec, model_config: dict | None) -> None:
    """data.seq_len within the model's positions: beyond them training fails in every worker (an IndexError of the
    position embedding, or silently wrong rotary positions)."""
    config = model_config if model_config is not None else run.model.config
    if not isinstance(config, dict):
        return
    for name in POSITION_FIELDS:
        limit = config.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            if run.data.seq_len > limit:
                where = f"model.source's config.json ({run.model.source})" if model_config is not None else \
                    "model.config"
                raise RunValidationError("data.seq_len", run.data.seq_len, f"at most the model's {name}={limit} "
                                         f"({where})")
            return


def read_sources(run: RunSpec, s3_client: Any = None, *, offline: bool = False) -> Sources:
    """The sources' config.json / index.json where the run needs them.

    `offline=False` (the pipeline): a source that cannot be read is a RunValidationError naming it.
    `offline=True` (the CLI): it is noted, and the run's inline copy is used when it has one.
    """
    out = Sources(None, None)
    if run.model.source is not None:
        reason = _unreadable_here(run.model.source) if offline else None
        try:
            if reason:
                raise _Unreadable(reason)
            out.model_config = _read_json(run.model.source, "config.json", "model.source", s3_client)
            out.notes.append(f"read model.source's config.json ({run.model.source})")
        except _Unreadable as exc:
            if not (offline and run.model.config is not None):
                raise RunValidationError("model.source", run.model.source,
                                         f"a readable model directory with config.json ({exc})") from None
            out.notes.append(f"not checked: model.source ({exc}); planned with the inline model.config")
    if run.data.tokens is None and run.data.source is not None:
        try:
            index = _read_json(run.data.source, DatasetIndex.FILE, "data.source", s3_client)
        except _Unreadable as exc:
            raise RunValidationError("data.source", run.data.source, "prepared shards with a readable index.json, "
                                     f"or data.tokens ({exc})") from None
        tokens = index.get(DatasetIndex.TOTAL_TOKENS)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 < tokens <= 10**15:
            raise RunValidationError("data.source", run.data.source, "an index.json with a positive total_tokens")
        out.tokens = tokens
        out.notes.append(f"read data.source's index.json ({run.data.source}): {tokens:,} tokens")
    elif run.data.source is not None:
        out.notes.append("not read: data.source's index.json (data.tokens is given)")
    if run.data.validation is not None and not run.eval.max_batches:  # its size plans the evaluation time
        reason = _unreadable_here(run.data.validation) if offline else None
        try:
            if reason:
                raise _Unreadable(reason)
            index = _read_json(run.data.validation, DatasetIndex.FILE, "data.validation", s3_client)
            tokens = index.get(DatasetIndex.TOTAL_TOKENS)
            if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 < tokens <= 10**15:
                raise RunValidationError("data.validation", run.data.validation,
                                         "an index.json with a positive total_tokens")
            out.validation_tokens = tokens
            out.notes.append(f"read data.validation's index.json ({run.data.validation}): "
                             f"{out.validation_tokens:,} tokens")
        except _Unreadable as exc:
            if not offline:
                raise RunValidationError("data.validation", run.data.validation,
                                         f"prepared shards with a readable index.json ({exc})") from None
            out.notes.append(f"not checked: data.validation ({exc}); its evaluation time is not estimated")
    check_seq_len(run, out.model_config)
    return out


def resolve(run: RunSpec, s3_client: Any = None) -> tuple[dict | None, int | None]:
    """(model config or None, data tokens or None) read strictly from the run's sources where needed."""
    sources = read_sources(run, s3_client)
    return sources.model_config, sources.tokens
