"""The gates: cdk-nag on the whole app, cfn-lint on every template, asl-validator on the rendered ASL, and
pinned logical IDs of the stateful resources."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Changing one of these makes CloudFormation replace the resource: data loss or an orphaned copy. A refactor
# that moves a stateful construct must keep its ID (overrideLogicalId) instead of editing this table.
PINNED = {
    "ArtifactsKeyA4B22E2B": "AWS::KMS::Key",
    "ArtifactsBucket88671897": "AWS::S3::Bucket",
    "ArtifactsAccessLogs4D97777C": "AWS::S3::Bucket",
    "InterruptionEventsTableD6977D7B": "AWS::DynamoDB::GlobalTable",
    "ModelPackageGroup": "AWS::SageMaker::ModelPackageGroup",
}


def test_stateful_resources_keep_their_logical_ids(template):
    for logical_id, cfn_type in PINNED.items():
        assert logical_id in template.find_resources(cfn_type), \
            f"{logical_id} ({cfn_type}) was renamed: CloudFormation would replace it"
        assert logical_id in template.find_resources(cfn_type, {"DeletionPolicy": "Retain"}), logical_id


def test_whole_app_passes_cdk_nag_with_reasons_for_every_acknowledgment(synth):
    # The synth fixture ran AwsSolutionsChecks on the whole app: any unacknowledged finding raises there.
    import re

    from app import build_app

    app = build_app(outdir=str(synth.outdir / "again"))  # constructs only: read the acknowledgments
    found = []
    for construct in app.node.find_all():
        for md in construct.node.metadata:
            if "acknowledged" in md.type.lower():
                found.extend((construct.node.path, re.sub(r"^annotation::", "", k, flags=re.I), v)
                             for k, v in md.data.items())
    assert len(found) >= 10
    for path, rule, reason in found:
        assert rule.startswith("AwsSolutions-"), (path, rule)
        assert path.count("/") >= 3, f"{rule} acknowledged at {path}: acknowledge on the resource, not the stack"
        assert isinstance(reason, str) and len(reason) > 30, (rule, reason)


def test_cfn_lint_finds_no_errors(synth):
    cfn_lint = Path(sys.executable).parent / "cfn-lint"  # the pinned one in this environment
    res = subprocess.run([str(cfn_lint),
                          "--non-zero-exit-code", "error", *map(str, synth.outdir.glob("assembly-*/*.template.json"))],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rendered_state_machine_is_valid_asl(definition, tmp_path):
    validator = ROOT / "node_modules" / ".bin" / "asl-validator"
    if not validator.exists():
        pytest.fail("node_modules/.bin/asl-validator missing: run `make node` (make test does it)")
    path = tmp_path / "definition.asl.json"
    path.write_text(json.dumps(definition))
    res = subprocess.run([str(validator), "--json-path", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    # A run continued from a full history enters at its own branch first (spotrun/pipeline/continuation.py)
    assert definition["StartAt"] == "ContinuesARun" and "Init" in definition["States"]
    assert len(definition["States"]) >= 20
