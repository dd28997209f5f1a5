"""The training role's MLflow permissions (training_constructs/execution_role.py): exactly the sagemaker-mlflow
actions the trainer's tracker calls, on the stage's tracking servers only, and nothing when the stage names none;
cdk-nag finds nothing to acknowledge in them."""

from __future__ import annotations

import json
import re

import pytest
from aws_cdk import App, Stack, Validations
from aws_cdk import aws_ecr as ecr
from aws_cdk.assertions import Match, Template
from cdk_nag import AwsSolutionsChecks

from stacks.config import AccountConfig
from training_constructs.artifact_store import ArtifactStore
from training_constructs.execution_role import (
    MLFLOW_TRACKER_ACTIONS,
    TrainingExecutionRole,
    TrainingExecutionRoleProps,
)

SERVERS = ("arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team-a",
           "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team-b")


def _role_template(tmp_path, servers: tuple[str, ...], secrets: tuple[str, ...] = ()) -> Template:
    app = App(outdir=str(tmp_path))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))  # unacknowledged findings make the synth raise
    stack = Stack(app, "Role")
    repository = ecr.Repository.from_repository_name(stack, "Repo", "trainer")
    TrainingExecutionRole(stack, "ExecutionRole", props=TrainingExecutionRoleProps(
        store=ArtifactStore(stack, "Artifacts"), repository=repository, mlflow_tracking_server_arns=servers,
        wandb_api_key_secret_arns=secrets))
    app.synth()
    return Template.from_stack(stack)


def test_the_role_may_call_what_the_tracker_calls_on_the_stages_servers_only(tmp_path):
    template = _role_template(tmp_path, SERVERS)
    template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        {"Action": list(MLFLOW_TRACKER_ACTIONS), "Effect": "Allow", "Resource": list(SERVERS)}])}})
    statements = [s for policy in template.find_resources("AWS::IAM::Policy").values()
                  for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    mlflow = [s for s in statements if "sagemaker-mlflow" in json.dumps(s["Action"])]
    assert len(mlflow) == 1  # no other statement names the service, no wildcard action or server
    assert not any("*" in action for action in mlflow[0]["Action"])
    # The tracker's calls (spotrun_trainer/tracking.py) are these and only these.
    assert {a.split(":")[1] for a in MLFLOW_TRACKER_ACTIONS} == {
        "GetExperimentByName", "CreateExperiment", "SearchRuns", "CreateRun", "GetRun", "UpdateRun",
        "GetMetricHistory", "LogBatch"}


def test_a_stage_without_tracking_servers_grants_no_mlflow_permission(tmp_path):
    template = _role_template(tmp_path, ())
    assert "sagemaker-mlflow" not in json.dumps(template.to_json())


def test_a_stages_tracking_servers_are_arns_or_urls_and_only_the_arns_get_permissions():
    base = dict(stage="dev", account="123456789012", region="us-east-1", cost_center="ml", monthly_budget_usd=100.0,
                notification_emails=("a@example.com",))
    stage = AccountConfig(**base, mlflow_tracking_servers=(*SERVERS, "https://mlflow.example.com"))
    assert stage.mlflow_tracking_server_arns == SERVERS
    for bad, says in (("arn:aws:sagemaker:us-east-1:123456789012:model/x", "expected the ARN of a SageMaker AI MLflow"),
                      ("https://user:pw@mlflow.example.com", "expected a URL without user:password@"),
                      ("mlflow", "expected an http(s):// URL of an MLflow tracking server, or the ARN")):
        expected = f'mlflow_tracking_servers="{bad}" is invalid: {says}'
        with pytest.raises(ValueError, match="^" + re.escape(expected)):
            AccountConfig(**base, mlflow_tracking_servers=(bad,))
    with pytest.raises(ValueError, match=r"mlflow_tracking_servers=\['x'\] is invalid: expected a tuple"):
        AccountConfig(**base, mlflow_tracking_servers=["x"])


WANDB_SECRETS = ("arn:aws:secretsmanager:us-east-1:123456789012:secret:spotrun/wandb-AbCdEf",)


def test_the_role_may_read_the_stages_wandb_secrets_only(tmp_path):
    """spotrun_trainer/wandb_tracking.py reads the run's W&B API key with GetSecretValue: on the stage's secrets
    only; a stage without any grants no Secrets Manager permission at all."""
    template = _role_template(tmp_path / "with", (), WANDB_SECRETS)
    statements = [s for policy in template.find_resources("AWS::IAM::Policy").values()
                  for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    secrets = [s for s in statements if "secretsmanager" in json.dumps(s["Action"])]
    assert secrets == [{"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": WANDB_SECRETS[0]}]
    assert "secretsmanager" not in json.dumps(_role_template(tmp_path / "without", ()).to_json())
