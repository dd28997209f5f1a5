"""The run contract's values that no range or pattern describes: sources, HF configs, LoRA targets, tags and
MLflow tracking URIs. Each is a `decode` function for `spec(...)` (value, dotted path) -> the decoded value, or a
RunValidationError naming the path; its `accepted` text (the constant beside it) is the error's and the docs'
(docs/run-fields.md)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from ..seams import PIPELINE_TAG_KEYS
from .aws_text import MAX_TAGS, TAG_KEY_MAX, TAG_VALUE_MAX, aws_text_ok
from .hub_id import HUB_ID, HUB_SCHEME, parse_hub_id
from .strict_json import RunValidationError, join

_S3_URI = re.compile(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\x00-\x1f\x7f]*)?")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Tags the pipeline sets on every training job itself; a run may not override them.
RESERVED_TAG_KEYS = PIPELINE_TAG_KEYS
MAX_RUN_TAGS = MAX_TAGS - len(RESERVED_TAG_KEYS)  # CreateTrainingJob: TagList max 50
# SageMaker's CreateMlflowTrackingServer (botocore's service model): TrackingServerArn's pattern and its name's
# (TrackingServerName); TrackingServerArn and TrackingServerUrl are at most 2,048 characters.
MLFLOW_TRACKING_SERVER_ARN = r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:mlflow-tracking-server/.*"
MLFLOW_TRACKING_SERVER_NAME = r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}"
MLFLOW_URI_MAX = 2048

SOURCE = "a local path or an s3://bucket/prefix URI"


def source(raw: Any, path: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise RunValidationError(path, raw, SOURCE)
    if len(raw) > 1024 or any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise RunValidationError(path, raw, "a path or URI of at most 1,024 characters without control characters")
    if raw[:3].lower() == "s3:" and not raw.startswith("s3://"):  # s3:/x, S3://x: a mistyped URI, not a path
        raise RunValidationError(path, raw, "an s3://bucket/prefix URI (lower-case s3 and two slashes), or a local "
                                 "path")
    if raw.startswith("s3://") and not _S3_URI.fullmatch(raw):
        raise RunValidationError(path, raw, "an s3://bucket/prefix URI with a valid bucket name")
    if raw.startswith("s3://"):
        check_s3_key(raw.split("/", 3)[3] if raw.count("/") >= 3 else "", path, raw)
    return raw


MODEL_SOURCE = f"{SOURCE}, or {HUB_ID}: fetched once into the stage's models/ by the preparation step"


def model_source(raw: Any, path: str) -> str:
    """`model.source`: a source, or a hub id (spotrun/contract/hub_id.py), kept as written."""
    if not isinstance(raw, str) or not raw:
        raise RunValidationError(path, raw, MODEL_SOURCE)
    if raw.startswith(HUB_SCHEME[:3]):  # hf:/x is a mistyped id, not a relative path
        parse_hub_id(raw, path)
        return raw
    if "://" in raw and not raw.startswith("s3://"):
        raise RunValidationError(path, raw, MODEL_SOURCE)
    return source(raw, path)


S3_KEY = ("an S3 key of plain segments: no '.' or '..' segment, no empty segment ('//'), no percent-encoding, "
          "no backslash")


def check_s3_key(key: str, path: str, shown: str | None = None) -> str:
    """`key` as S3 stores it, refused where a prefix check could be fooled: S3 keys are not paths, so
    `datasets/../output/x` is a key under `datasets/` that other tools (the CLI's sync, SDKs that normalize) read
    as `output/x`; percent-encoded dots and slashes decode to the same; an empty segment names another key."""
    segments = key.split("/")
    inner = segments[:-1] if segments and segments[-1] == "" else segments  # a trailing '/' marks a prefix
    bad = ("\\" in key or "%" in key or key.startswith("/")
           or any(segment in ("", ".", "..") for segment in inner if key))
    if bad:
        raise RunValidationError(path, shown if shown is not None else key, S3_KEY)
    return key


HF_CONFIG = "an HF config object with a string model_type"


def hf_config(raw: Any, path: str) -> dict:
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise RunValidationError(path, raw, HF_CONFIG)
    return raw


TARGETS = '"all-linear" or a list of 1-64 module names (e.g. ["q_proj"])'


def lora_targets(raw: Any, path: str) -> str | tuple[str, ...]:
    if raw == "all-linear":
        return raw
    if (not isinstance(raw, list) or not 0 < len(raw) <= 64
            or not all(isinstance(t, str) and _MODULE_NAME.fullmatch(t) for t in raw)):
        raise RunValidationError(path, raw, TARGETS)
    return tuple(raw)


TAGS = (f"an object of at most {MAX_RUN_TAGS} string tags (SageMaker allows {MAX_TAGS}; the pipeline sets "
        f"{', '.join(RESERVED_TAG_KEYS)})")


def tags(raw: Any, path: str) -> dict[str, str]:
    if not isinstance(raw, dict) or len(raw) > MAX_RUN_TAGS:
        raise RunValidationError(path, raw, TAGS)
    for key, value in raw.items():
        where = join(path, key)
        if not 1 <= len(key) <= TAG_KEY_MAX or not aws_text_ok(key) or key.lower().startswith("aws:"):
            raise RunValidationError(where, value, "a tag key of 1-128 letters, digits, spaces or _.:/=+-@, not "
                                     "starting with aws:")
        if key.lower() in RESERVED_TAG_KEYS:
            raise RunValidationError(where, value, f"a key other than {', '.join(RESERVED_TAG_KEYS)} (the "
                                     "pipeline sets these on every training job)")
        if not isinstance(value, str) or len(value) > TAG_VALUE_MAX or not aws_text_ok(value):
            raise RunValidationError(where, value, "a tag value of at most 256 letters, digits, spaces or _.:/=+-@")
    return dict(raw)


MLFLOW_URI = ("an http(s):// URL of an MLflow tracking server, or the ARN of a SageMaker AI MLflow tracking server "
              f"(arn:aws:sagemaker:REGION:ACCOUNT:mlflow-tracking-server/NAME), at most {MLFLOW_URI_MAX:,} characters")


def mlflow_uri(raw: Any, path: str) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > MLFLOW_URI_MAX:
        raise RunValidationError(path, raw, MLFLOW_URI)
    if raw.startswith("arn:"):
        name = raw.partition(":mlflow-tracking-server/")[2]
        if not (re.fullmatch(MLFLOW_TRACKING_SERVER_ARN, raw) and re.fullmatch(MLFLOW_TRACKING_SERVER_NAME, name)):
            raise RunValidationError(path, raw, "the ARN of a SageMaker AI MLflow tracking server: arn:aws:sagemaker:"
                                     "REGION:ACCOUNT:mlflow-tracking-server/NAME (NAME: 1-256 letters, digits and "
                                     "hyphens, starting and ending with a letter or digit)")
        return raw
    try:
        url = urlsplit(raw)
        ok = url.scheme in ("http", "https") and bool(url.hostname) and (url.port is None or url.port > 0)
    except ValueError:  # a malformed IPv6 host or port
        ok = False
    if not ok or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in raw):
        raise RunValidationError(path, raw, MLFLOW_URI)
    if "@" in url.netloc:
        raise RunValidationError(path, raw, "a URL without user:password@ (a run's hyperparameters are visible "
                                 "in DescribeTrainingJob; give the tracking server's credentials another way)")
    return raw
