"""The shipped examples run as written: docs/deploying.md step 8 fills the bucket placeholder, then they pass
`spotrun validate --stage` against the synthesized stage's names and the estimate Lambda's rules (its settings read
from the synthesized function, the sources from S3 through moto)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from spotrun.cli.estimate import run_command
from spotrun.cli.main import build_parser
from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.planner.sources import PLACEHOLDER_BUCKET
from tests.infra.render import placeholder, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "runs").glob("*.json"))
BUCKET = "spotrun-dev-artifactsbucket-1a2b3c"  # what CloudFormation names the bucket at deploy time


def _filled(tmp_path: Path) -> list[Path]:
    """docs/deploying.md step 8: replace the placeholder with the stack's ArtifactBucket output."""
    out = []
    for path in EXAMPLES:
        filled = tmp_path / path.name
        filled.write_text(path.read_text().replace(PLACEHOLDER_BUCKET, BUCKET))
        out.append(filled)
    return out


@pytest.fixture(scope="module")
def stage(synth) -> dict:
    """The names a deployed dev stage has: its stack's name and outputs, and the estimate function's settings."""
    manifest = json.loads((synth.outdir / "assembly-dev" / "manifest.json").read_text())
    stack = next(a["properties"]["stackName"] for a in manifest["artifacts"].values()
                 if a["type"] == "aws:cloudformation:stack")
    outputs = synth.template["Outputs"]
    assert outputs["ArtifactBucket"]["Value"] == {"Ref": "ArtifactsBucket88671897"}  # named at deploy: BUCKET
    fn = next(r for k, r in synth.resources("AWS::Lambda::Function").items() if k.startswith("PipelineEstimateFn"))
    env = fn["Properties"]["Environment"]["Variables"]
    # The group's name ends in part of the stack id (resolved at deploy): rendered as CloudFormation would.
    return {"stack": stack, "group": render(outputs["ModelPackageGroupName"]["Value"], placeholder), "env": env}


def _validate(argv: list[str], cfn) -> int:
    return run_command(build_parser().parse_args(["validate", *argv]), plan=False, cfn_client=cfn)


def test_the_examples_pass_validate_against_the_stage_once_the_placeholder_is_filled(stage, tmp_path, capsys):
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    with Stubber(cfn) as stub:
        for _ in range(2):
            stub.add_response("describe_stacks", {"Stacks": [{
                "StackName": stage["stack"], "CreationTime": "2026-01-01T00:00:00Z", "StackStatus": "CREATE_COMPLETE",
                "Outputs": [{"OutputKey": "ArtifactBucket", "OutputValue": BUCKET},
                            {"OutputKey": "ModelPackageGroupName", "OutputValue": stage["group"]}]}]},
                {"StackName": stage["stack"]})
        # As shipped, each example names the placeholder: refused with what to do.
        assert _validate(["--stage", "dev", *map(str, EXAMPLES)], cfn) == 2
        errors = capsys.readouterr().err.splitlines()
        assert len(errors) == len(EXAMPLES)
        assert all(f"replace the placeholder {PLACEHOLDER_BUCKET}" in e for e in errors)
        filled = _filled(tmp_path)
        assert _validate(["--stage", "dev", *map(str, filled)], cfn) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.count(": ok") == len(EXAMPLES) and f"model package group {stage['group']}" in out
    # Offline, the same names as flags.
    assert _validate(["--bucket", BUCKET, "--group", stage["group"], *map(str, filled)], None) == 0


def test_the_examples_pass_the_estimate_lambda_with_their_sources_in_s3(stage, tmp_path):
    env = stage["env"]
    settings = PipelineSettings(bucket=BUCKET, job_prefix=env["JOB_PREFIX"], model_package_group=render(
        env["MODEL_PACKAGE_GROUP"], placeholder), poll_seconds=60, project=env["PROJECT"], stage=env["STAGE"],
        cost_center=env["COST_CENTER"])
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        methods = set()
        for path in _filled(tmp_path):
            run = json.loads(path.read_text())
            model_key = run["model"]["source"].removeprefix(f"s3://{BUCKET}/")
            s3.put_object(Bucket=BUCKET, Key=model_key + "config.json", Body=json.dumps(run["model"]["config"]))
            p = plan(run, "exec-1", settings, s3_client=s3)
            assert p["status"] == "ok", (path.name, p)
            channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in p["input_data_config"]}
            assert channels == {"train": run["data"]["source"], "model": run["model"]["source"]}
            assert "model.config" not in p["hyperparameters"]  # pretrained: the config comes with the weights
            methods.add(run["training"]["method"])
    assert methods == {"full", "lora"}  # an example per method the pipeline runs
