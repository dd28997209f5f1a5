"""A local model registry: a directory of versioned model packages, shaped like the Model Registry's.

    <root>/<group>/<version>/package.json   the DescribeModelPackage fields that apply locally, with the same
                                            CustomerMetadataProperties as the AWS path (cost_guard.registry_metadata)
    <root>/<group>/<version>/model/         the exported model (safetensors, config, tokenizer)

Versions count from 1 per group, as ModelPackageVersion does. An entry appears whole or not at all: it is
written under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ..pipeline.guard import registry_metadata

# The local group when the run gives no registry.model_package_group (a stage registers into its own,
# <project>-<stage>-models by default: stacks/config.py AccountConfig.model_package_group_base).
DEFAULT_GROUP = "spotrun-models"
PACKAGE_FILE = "package.json"


def versions(group_dir: Path) -> list[int]:
    if not group_dir.is_dir():
        return []
    return sorted(int(p.name) for p in group_dir.iterdir() if p.name.isdigit() and (p / PACKAGE_FILE).is_file())


def register(root: Path, group: str, *, model_dir: Path, description: str, approval_status: str,
             report: dict) -> Path:
    """Copy the exported model into the next version of `group`; returns the entry's directory."""
    group_dir = Path(root) / group
    group_dir.mkdir(parents=True, exist_ok=True)
    version = (versions(group_dir) or [0])[-1] + 1
    staging = group_dir / f".{version}.{os.getpid()}.tmp"
    shutil.copytree(model_dir, staging / "model", ignore=shutil.ignore_patterns("loss_history.jsonl"))
    for path in (staging, *staging.rglob("*")):  # readable by the group, like files other tools pick up
        path.chmod(0o755 if path.is_dir() else 0o644)
    package = {
        "ModelPackageGroupName": group,
        "ModelPackageVersion": version,
        "ModelPackageArn": f"local:{group}/{version}",
        "ModelPackageDescription": description,
        "ModelApprovalStatus": approval_status,
        "CreationTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ModelDataUrl": "model/",
        "CustomerMetadataProperties": registry_metadata(report),
    }
    (staging / PACKAGE_FILE).write_text(json.dumps(package, indent=2) + "\n")
    (staging / PACKAGE_FILE).chmod(0o644)
    entry = group_dir / str(version)
    staging.rename(entry)  # NOTE: a concurrent registration of the same version fails here rather than mixing
    return entry


def describe(entry: Path) -> dict:
    return json.loads((Path(entry) / PACKAGE_FILE).read_text())
