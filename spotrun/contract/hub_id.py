"""Hugging Face hub ids as a model source: `hf://org/name` or `hf://org/name@revision` (a branch, tag or commit).

The id names what the pipeline's preparation step fetches into the stage's `models/hf/<org>/<name>/<revision>/`
(spotrun/pipeline/hub.py), with the commit it resolved to and each file's SHA-256 recorded beside the files; the
training job only ever reads that copy. Stdlib only (the Lambda runtime). The repository name follows the hub's
own rule (huggingface_hub's `validate_repo_id`: letters, digits, `-`, `_`, `.`; not starting or ending with `-` or
`.`; no `--` or `..`; at most 96 characters), with the namespace required. A revision is kept to one S3 key segment
(no `/`): a branch, a tag or a 40-digit commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .strict_json import RunValidationError, show

HUB_SCHEME = "hf://"
DEFAULT_REVISION = "main"  # the hub's default branch
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.\-]{0,94}[A-Za-z0-9])?"
_REPO = re.compile(rf"(?P<org>{_PART})/(?P<name>{_PART})")
_REVISION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.\-]{0,253}[A-Za-z0-9])?")
COMMIT = re.compile(r"[0-9a-f]{40}")
HUB_ID = ("a hub id hf://org/name or hf://org/name@revision (org and name: letters, digits, '-', '_', '.', not "
          "starting or ending with '-' or '.', no '--' or '..', at most 96 characters each; revision: a branch, "
          "tag or 40-digit commit without '/')")


@dataclass(frozen=True)
class HubId:
    org: str
    name: str
    revision: str
    """As written, or `main`: the stage keeps the commit it resolved to at the first fetch (pinned)."""

    @property
    def repo(self) -> str:
        return f"{self.org}/{self.name}"

    @property
    def text(self) -> str:
        return f"{HUB_SCHEME}{self.repo}@{self.revision}"


def is_hub_id(source: str | None) -> bool:
    return isinstance(source, str) and source.startswith(HUB_SCHEME)


def meant_hub_id(source: str | None) -> str | None:
    """The hub id a bare `org/name[@revision]` model.source probably meant (`hf://org/name`), else None: for the
    error about a source that is no local directory (and no S3 URI), never to guess it in its place."""
    if not isinstance(source, str) or source.startswith(HUB_SCHEME):
        return None
    try:
        parse_hub_id(HUB_SCHEME + source)
    except RunValidationError:
        return None
    return HUB_SCHEME + source


def parse_hub_id(raw: str, path: str = "model.source") -> HubId:
    """`hf://org/name[@revision]` -> HubId, or a RunValidationError naming `path` and what is accepted."""
    body = raw[len(HUB_SCHEME):] if raw.startswith(HUB_SCHEME) else None
    repo, _, revision = (body or "").partition("@")
    match = _REPO.fullmatch(repo)
    if body is None or match is None or any(bad in repo for bad in ("--", "..")):
        raise RunValidationError(path, raw, HUB_ID)
    if "@" in body and not (_REVISION.fullmatch(revision) and ".." not in revision):
        raise RunValidationError(path, raw, f"{HUB_ID}; the revision {show(revision)} is not one")
    return HubId(match["org"], match["name"], revision or DEFAULT_REVISION)
