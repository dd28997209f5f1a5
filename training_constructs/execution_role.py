"""TrainingExecutionRole: what a SageMaker training job may do, and nothing more; `job_basics`, what every job role
of the stage needs (preparation_role.py shares it).

Per run: a job's credentials carry the session tag run=<its run> (SageMaker's session tag chaining from the launch
function's tagged session, spotrun/pipeline/launch.py), and the role's S3 grants name `${aws:PrincipalTag/run}`:
it reads, writes and deletes only checkpoints/<run>/ (SageMaker's checkpoint sync deletes there what the trainer
deletes locally) and writes only output/<run>/ (no read, no delete: every registered model's artifact lives
there). Without the tag it reaches neither. Reads datasets/ and models/; writes no dataset. Every job role uses the
bucket's key, pulls the trainer image, writes its CloudWatch logs and metrics and (in a VPC) manages its network
interfaces (`job_basics`). Training jobs also log to the stage's SageMaker AI MLflow tracking servers, when it
names any (the sagemaker-mlflow actions the trainer's tracker calls, spotrun_trainer/tracking.py, on those servers
only), and read the stage's W&B API key secrets, when it names any (GetSecretValue on those secrets only). No
AWS-managed full-access policy. docs/security.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

from spotrun.seams import RUN_TAG

from .artifact_store import ArtifactStore
from .nag import acknowledge, rendered

# IAM substitutes the session's `run` tag (a policy variable); a session without it matches none of these keys.
RUN_VARIABLE = "${aws:PrincipalTag/" + RUN_TAG + "}"


@dataclass(frozen=True)
class TrainingExecutionRoleProps:
    store: ArtifactStore
    """The artifact bucket and key: the role reads datasets/ and models/, writes checkpoints/ and output/."""
    repository: ecr.IRepository
    """The trainer image's ECR repository: the only one the role may pull from."""
    in_vpc: bool = False
    """Whether jobs run in the stage's VPC (the role may then manage their network interfaces). Default: False."""
    mlflow_tracking_server_arns: tuple[str, ...] = ()
    """The SageMaker AI MLflow tracking servers training jobs may log to (stacks/config.py). Default: none."""
    wandb_api_key_secret_arns: tuple[str, ...] = ()
    """The Secrets Manager secrets holding W&B API keys training jobs may read (stacks/config.py). Default: none."""


# What spotrun_trainer/tracking.py calls on a tracking server (MlflowClient: get_experiment_by_name,
# create_experiment, search_runs, create_run, get_run, update_run, set_terminated, get_metric_history, log_batch),
# as the IAM actions of "Amazon SageMaker with MLflow" (Service Authorization Reference, service prefix
# sagemaker-mlflow; every one of them takes the mlflow-tracking-server resource type).
MLFLOW_TRACKER_ACTIONS = tuple(f"sagemaker-mlflow:{a}" for a in (
    "GetExperimentByName", "CreateExperiment", "SearchRuns", "CreateRun", "GetRun", "UpdateRun", "GetMetricHistory",
    "LogBatch"))


class TrainingExecutionRole(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: TrainingExecutionRoleProps) -> None:
        super().__init__(scope, id_)
        # TagSession: SageMaker passes the creating session's tags on (SessionChainingConfig).
        self.role = iam.Role(self, "Role",
                             assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com").with_session_tags(),
                             description="spotrun training jobs")
        store = props.store
        store.grant_read_prefix(self.role, store.datasets_prefix)
        store.grant_read_prefix(self.role, store.models_prefix)
        self.checkpoints = store.arn_under(f"{store.checkpoints_prefix}{RUN_VARIABLE}/")
        self.output = store.arn_under(f"{store.output_prefix}{RUN_VARIABLE}/")
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:DeleteObject"],
            resources=[self.checkpoints]))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[store.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{store.checkpoints_prefix}{RUN_VARIABLE}/*"]}}))
        # Write-only: SageMaker uploads the job's model.tar.gz; nothing under output/ is readable by a job.
        self.role.add_to_policy(iam.PolicyStatement(actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                                                    resources=[self.output]))
        store.key.grant_decrypt(self.role)
        log_group_arn = job_basics(self.role, props.store, props.repository, in_vpc=props.in_vpc,
                                   log_group="/aws/sagemaker/TrainingJobs*")
        if props.mlflow_tracking_server_arns:
            self.role.add_to_policy(iam.PolicyStatement(actions=list(MLFLOW_TRACKER_ACTIONS),
                                                        resources=list(props.mlflow_tracking_server_arns)))
        if props.wandb_api_key_secret_arns:  # spotrun_trainer/wandb_tracking.py reads the run's key at the start
            self.role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                        resources=list(props.wandb_api_key_secret_arns)))
        self.policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(self.policy, f"AwsSolutions-IAM5[Resource::{rendered(self, self.output)}]",
                    "SageMaker uploads each job's model artifact under output/<run>/<job>/ (S3OutputPath): the "
                    "job's own run only (the session tag), write only: no read, no delete")
        acknowledge(self.policy, f"AwsSolutions-IAM5[Resource::{rendered(self, self.checkpoints)}]",
                    "SageMaker syncs the checkpoints of the job's own run (the session tag) under "
                    "checkpoints/<run>/<execution>/: execution names are not known ahead")
        for action in ("kms:GenerateDataKey*", "kms:ReEncrypt*"):
            acknowledge(self.policy, f"AwsSolutions-IAM5[Action::{action}]",
                        "key-scoped data-key and re-encrypt actions on the artifact key alone (checkpoints and "
                        "the artifact are encrypted with it)")
        acknowledge_job_basics(self.policy, log_group_arn, in_vpc=props.in_vpc, jobs="training jobs")


def job_basics(role: iam.Role, store: ArtifactStore, repository: ecr.IRepository, *, in_vpc: bool,
               log_group: str) -> str:
    """What every SageMaker job role of the stage needs beside its data: the bucket's key (and grants on it for
    AWS resources: SageMaker's documented need for a VolumeKmsKeyId,
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ResourceConfig.html), the trainer image, its
    logs and metrics, (in a VPC) its network interfaces. Returns the log group ARN (for the acknowledgment)."""
    stack = Stack.of(role)
    store.key.grant_encrypt(role)
    role.add_to_policy(iam.PolicyStatement(
        actions=["kms:CreateGrant"], resources=[store.key.key_arn],
        conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}}))
    repository.grant_pull(role)
    log_group_arn = stack.format_arn(service="logs", resource="log-group", resource_name=log_group,
                                     arn_format=ArnFormat.COLON_RESOURCE_NAME)
    role.add_to_policy(iam.PolicyStatement(
        actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
        resources=[log_group_arn]))
    role.add_to_policy(iam.PolicyStatement(
        actions=["cloudwatch:PutMetricData"], resources=["*"],
        conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}}))
    if in_vpc:
        role.add_to_policy(iam.PolicyStatement(
            actions=["ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
                     "ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission",
                     "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                     "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"], resources=["*"]))
    return log_group_arn


def acknowledge_job_basics(policy: IConstruct, log_group_arn: str, *, in_vpc: bool, jobs: str) -> None:
    """The cdk-nag findings `job_basics` causes, each with its reason."""
    acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(policy, log_group_arn)}]",
                f"SageMaker writes each of the {jobs}' logs to its own log stream of this log group")
    acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                "ecr:GetAuthorizationToken and cloudwatch:PutMetricData (limited to /aws/sagemaker/* by a "
                "condition) support no resource scoping" + ("; so do the ec2 network-interface actions a "
                                                             "VPC job needs" if in_vpc else ""))

