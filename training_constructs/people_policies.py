"""PeoplePolicies: the customer-managed policies for the people who use a stage, least privilege.

- `deployer`: `cdk deploy` of this app. The CDK CLI does everything through the roles `cdk bootstrap` created
  (deploy, file and image publishing, lookup: the modern bootstrap template), so a deployer needs only to assume
  those of this account and region; what CloudFormation may then create is the bootstrap's execution role's policy
  (`cdk bootstrap --cloudformation-execution-policies`), the account owner's choice (docs/deploy.md).
- `run_user`: every remote `spotrun` command but `approve`: `prepare` and `upload-model` (datasets/<name>/ and
  models/<name>/ only, never datasets/_prepared/, output/ or checkpoints/), `start`, `status`, `list`, `report`,
  `logs`, `cancel` (this stage's state machine, executions and training jobs), `deploy`/`undeploy` (endpoints with
  the stage's serving role). It cannot approve a model, create a training job or pass the training role.
- `approver`: `approve` (the model's package approved) and the lookups it makes; it cannot start a run.

tests/infra/test_people_policies.py proves each command's recorded calls are allowed, and calls outside denied,
with iam-simulate on the synthesized policies.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import ArnFormat, DefaultStackSynthesizer, Fn, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from spotrun.seams import RUN_RECORD, TRAINING_LOG_GROUP

from .artifact_store import ArtifactStore
from .nag import acknowledge, rendered

# The roles `cdk bootstrap` creates and the CDK CLI assumes, as DefaultStackSynthesizer names them, with its default
# qualifier (a fork bootstrapped with `--qualifier` passes its own).
BOOTSTRAP_ROLES = (DefaultStackSynthesizer.DEFAULT_DEPLOY_ROLE_ARN,
                   DefaultStackSynthesizer.DEFAULT_FILE_ASSET_PUBLISHING_ROLE_ARN,
                   DefaultStackSynthesizer.DEFAULT_IMAGE_ASSET_PUBLISHING_ROLE_ARN,
                   DefaultStackSynthesizer.DEFAULT_LOOKUP_ROLE_ARN)


@dataclass(frozen=True)
class PeoplePoliciesProps:
    store: ArtifactStore
    """The stage's bucket: datasets/, models/, output/, checkpoints/ (the prefixes each person may touch)."""
    state_machine: sfn.IStateMachine
    """The run pipeline: run users start, describe and stop its executions."""
    serving_role: iam.IRole
    """The role endpoints run as: run users pass it to SageMaker on `deploy`."""
    job_prefix: str
    """Every training job's name starts with it (and its log streams)."""
    model_package_group_base: str
    """The stage's model package groups are `<base>-*`."""
    prepared_prefix: str
    """Prepared datasets (written by the preparation role only)."""
    bootstrap_qualifier: str = DefaultStackSynthesizer.DEFAULT_QUALIFIER
    """`cdk bootstrap --qualifier` of the account. Default: CDK's default qualifier (`hnb659fds`)."""


class PeoplePolicies(Construct):
    """`deployer`, `run_user`, `approver`: managed policies to attach to people's users, groups or SSO roles."""

    def __init__(self, scope: Construct, id_: str, *, props: PeoplePoliciesProps) -> None:
        super().__init__(scope, id_)
        stack = Stack.of(self)
        arns = _Arns(stack, props)
        self.deployer = iam.ManagedPolicy(self, "Deployer", description="spotrun: cdk deploy of this app", statements=[
            iam.PolicyStatement(actions=["sts:AssumeRole"], resources=[
                Fn.sub(arn.replace("${Qualifier}", props.bootstrap_qualifier)) for arn in BOOTSTRAP_ROLES])])
        reads = _lookups(props, arns)  # approve finds the run's package as the other commands find the run
        self.run_user = iam.ManagedPolicy(self, "RunUser", description="spotrun: prepare, upload, start, watch, "
                                          "cancel and deploy runs (not approve)",
                                          statements=reads + _runs(props, arns) + _deploys(props, arns))
        self.approver = iam.ManagedPolicy(self, "Approver", description="spotrun: approve registered models",
                                          statements=reads + [iam.PolicyStatement(
                                              actions=["sagemaker:UpdateModelPackage"], resources=[arns.package])])
        self._acknowledge(arns)

    def _acknowledge(self, arns: _Arns) -> None:
        """cdk-nag's wildcard findings, each with its reason; the deployer's roles are named in full."""
        reasons = {
            arns.executions: "this stage's state machine's executions only (execution names are made per run)",
            arns.jobs: "this stage's training jobs only: every job name starts with the stage's prefix",
            arns.streams: "the log streams of this stage's training jobs only (<job name>/algo-N-...)",
            arns.log_group_any: "SageMaker's training log group only (DescribeLogStreams takes the group)",
            arns.package: "model package versions of this stage's groups (version ARNs are not known ahead)",
            arns.stack: "this stage's stack (its ARN ends in an id made at creation)",
            arns.datasets: "the datasets/<name>/ prefixes users upload to (datasets/_prepared/ is denied)",
            arns.models: "the models/<name>/ prefixes users upload to",
            arns.run_records: "the run record `spotrun start` creates beside each execution's checkpoints (put "
                              "only with If-None-Match: *, never over an existing one)",
            arns.endpoints: "endpoints are named after the run the user deploys (any name a run may have)",
            arns.endpoint_configs: "endpoint configs are named after the run and the time of the deploy",
            arns.models_sm: "endpoint models are named after the run and the time of the deploy",
        }
        found = {self.run_user: _resources(self.run_user), self.approver: _resources(self.approver)}
        for policy, resources in found.items():
            for resource, reason in reasons.items():
                if rendered(self, resource) in resources:
                    acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, resource)}]", reason)


def _resources(policy: iam.ManagedPolicy) -> set[str]:
    return {rendered(policy, r) for st in policy.document.to_json()["Statement"]
            for r in ([st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"])}


def _lookups(props: PeoplePoliciesProps, arns: _Arns) -> list[iam.PolicyStatement]:
    """What every remote command reads first: the stack's outputs, the run's executions."""
    return [iam.PolicyStatement(actions=["cloudformation:DescribeStacks"], resources=[arns.stack]),
            iam.PolicyStatement(actions=["states:ListExecutions"], resources=[props.state_machine.state_machine_arn]),
            iam.PolicyStatement(actions=["states:DescribeExecution", "states:GetExecutionHistory"],
                                resources=[arns.executions])]


def _runs(props: PeoplePoliciesProps, arns: _Arns) -> list[iam.PolicyStatement]:
    """prepare, upload-model, start, status, report, logs, cancel."""
    store = props.store
    return [
        iam.PolicyStatement(actions=["states:StartExecution"], resources=[props.state_machine.state_machine_arn]),
        iam.PolicyStatement(actions=["states:StopExecution"], resources=[arns.executions]),
        iam.PolicyStatement(actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                            resources=[arns.jobs]),
        iam.PolicyStatement(actions=["logs:DescribeLogStreams"], resources=[arns.log_group, arns.log_group_any]),
        iam.PolicyStatement(actions=["logs:GetLogEvents"], resources=[arns.streams]),
        iam.PolicyStatement(actions=["s3:ListBucket"], resources=[store.bucket.bucket_arn], conditions={
            "StringLike": {"s3:prefix": [f"{store.datasets_prefix}*", f"{store.models_prefix}*"]}}),
        iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                            resources=[arns.datasets, arns.models]),
        # The run record `start` writes (and a later resume_from reads) beside the execution's checkpoints:
        # created only, never replaced (S3 conditional writes: the `s3:if-none-match` condition key requires the
        # `If-None-Match: *` header, so a put onto an existing record fails), so no one may rewrite another run's.
        iam.PolicyStatement(actions=["s3:GetObject"], resources=[arns.run_records]),
        iam.PolicyStatement(actions=["s3:PutObject"], resources=[arns.run_records],
                            conditions={"StringEquals": {"s3:if-none-match": "*"}}),
        # Prepared data is the preparation job's alone (later runs reuse it): never a person's upload.
        iam.PolicyStatement(effect=iam.Effect.DENY, actions=["s3:PutObject"], resources=[arns.prepared]),
        iam.PolicyStatement(actions=["kms:Decrypt", "kms:GenerateDataKey"], resources=[store.key.key_arn]),
    ]


def _deploys(props: PeoplePoliciesProps, arns: _Arns) -> list[iam.PolicyStatement]:
    """deploy and undeploy: an endpoint of an approved package, with the stage's serving role."""
    return [
        iam.PolicyStatement(actions=["sagemaker:DescribeModelPackage"], resources=[arns.package]),
        iam.PolicyStatement(actions=["sagemaker:DescribeEndpoint", "sagemaker:CreateEndpoint",
                                     "sagemaker:DeleteEndpoint", "sagemaker:AddTags"], resources=[arns.endpoints]),
        iam.PolicyStatement(actions=["sagemaker:DescribeEndpointConfig", "sagemaker:CreateEndpointConfig",
                                     "sagemaker:DeleteEndpointConfig", "sagemaker:AddTags"],
                            resources=[arns.endpoint_configs]),
        iam.PolicyStatement(actions=["sagemaker:DescribeModel", "sagemaker:CreateModel", "sagemaker:DeleteModel",
                                     "sagemaker:AddTags"], resources=[arns.models_sm]),
        iam.PolicyStatement(actions=["iam:PassRole"], resources=[props.serving_role.role_arn],
                            conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}),
    ]


class _Arns:
    def __init__(self, stack: Stack, props: PeoplePoliciesProps) -> None:
        def sm(resource: str, name: str) -> str:
            return stack.format_arn(service="sagemaker", resource=resource, resource_name=name)

        self.jobs = sm("training-job", f"{props.job_prefix}*")
        self.package = sm("model-package", f"{props.model_package_group_base}-*/*")
        self.endpoints, self.endpoint_configs, self.models_sm = sm("endpoint", "*"), sm("endpoint-config", "*"), \
            sm("model", "*")
        self.executions = stack.format_arn(
            service="states", resource="execution", arn_format=ArnFormat.COLON_RESOURCE_NAME,
            resource_name=f"{props.state_machine.state_machine_name}:*")
        def log_group(name: str) -> str:
            return stack.format_arn(service="logs", resource="log-group", resource_name=name,
                                    arn_format=ArnFormat.COLON_RESOURCE_NAME)

        # The group as the Service Authorization Reference writes it, and with the `:*` CloudWatch Logs' own ARNs
        # carry; the streams of this stage's jobs only.
        self.log_group, self.log_group_any = log_group(TRAINING_LOG_GROUP), log_group(f"{TRAINING_LOG_GROUP}:*")
        self.streams = log_group(f"{TRAINING_LOG_GROUP}:log-stream:{props.job_prefix}*")
        self.stack = stack.format_arn(service="cloudformation", resource="stack", resource_name=f"{stack.stack_name}/*")
        store = props.store
        self.datasets, self.models = store.arn_under(store.datasets_prefix), store.arn_under(store.models_prefix)
        self.prepared = store.arn_under(props.prepared_prefix)
        self.run_records = store.bucket.arn_for_objects(f"{store.checkpoints_prefix}*/{RUN_RECORD}")
