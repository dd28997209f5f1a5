"""The text SageMaker accepts in tags and model-registry metadata, and how the pipeline makes its values fit.

CreateTrainingJob / CreateModelPackage (botocore's service model, API reference):
- Tag key and value: pattern `([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)` (letters, separators, numbers, `_.:/=+-@`), key
  1-128, value 0-256 characters, at most 50 tags per resource.
- CustomerMetadataProperties: the same characters, key 1-128, value 1-256, at most 50 entries.

`aws_text_ok` is a faithful translation of the pattern with the standard library (Unicode general categories
L*, Z*, N*); tests/infra/test_seams.py checks every value the pipeline sends against botocore's own pattern with
a full match (`regex` module), so the translation and the model cannot drift apart unnoticed.
"""

from __future__ import annotations

import hashlib
import unicodedata

TAG_KEY_MAX, TAG_VALUE_MAX, MAX_TAGS = 128, 256, 50
METADATA_VALUE_MAX = 256
_PUNCTUATION = "_.:/=+-@"
EMPTY_METADATA = "none"  # a metadata value has at least one character


def aws_text_ok(text: str) -> bool:
    """Whether every character of `text` is one SageMaker's tag/metadata pattern allows."""
    return all(unicodedata.category(c)[0] in "LZN" or c in _PUNCTUATION for c in text)


def aws_text(text: str, limit: int) -> str:
    """`text` made to fit: each character the pattern refuses becomes `_`, and a value over `limit` keeps its head
    and ends in `...` (a caller that needs the exact value also records its digest: `digest`)."""
    clean = "".join(c if unicodedata.category(c)[0] in "LZN" or c in _PUNCTUATION else "_" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


def metadata_value(value: object) -> str:
    """A CustomerMetadataProperties value: a string of 1-256 allowed characters."""
    text = EMPTY_METADATA if value is None or value == "" else str(value)
    return aws_text(text, METADATA_VALUE_MAX)


def digest(text: str) -> str:
    """SHA-256 of the exact text (hex, 64 characters): what identifies a value `aws_text` had to change."""
    return hashlib.sha256(text.encode()).hexdigest()
