"""HubFetchRole: what the SageMaker Processing job fetching a hub model may do (spotrun/pipeline/hub.py): the one job
outside training with network access adds files under models/_hub/ and reads nothing of the stage's data."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from constructs import Construct

from spotrun.seams import HUB_MODELS_PREFIX

from .artifact_store import ArtifactStore
from .execution_role import acknowledge_job_basics, job_basics
from .nag import acknowledge, rendered


@dataclass(frozen=True)
class HubFetchRoleProps:
    store: ArtifactStore
    """The artifact bucket and key: the role only adds objects under models/_hub/ (spotrun.seams.HUB_MODELS_PREFIX)."""
    repository: ecr.IRepository
    """The trainer image's ECR repository (the fetch runs the trainer image): the only one it may pull."""
    in_vpc: bool
    """Whether jobs run in the stage's VPC (the role may then manage their network interfaces)."""


class HubFetchRole(Construct):
    """The hub fetch job's role (spotrun/pipeline/hub.py): the one job outside training that reaches the network
    reads nothing of the stage's data; it only adds a hub model's files under models/_hub/ (no delete, no read)."""

    def __init__(self, scope: Construct, id_: str, *, props: HubFetchRoleProps) -> None:
        super().__init__(scope, id_)
        store, repository, in_vpc = props.store, props.repository, props.in_vpc
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
                             description="spotrun hub model fetch (processing) jobs: write models/_hub/ only")
        self.role.add_to_policy(iam.PolicyStatement(actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                                                    resources=[store.arn_under(HUB_MODELS_PREFIX)]))
        log_group_arn = job_basics(self.role, store, repository, in_vpc=in_vpc,
                                   log_group="/aws/sagemaker/ProcessingJobs*")
        policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, store.arn_under(HUB_MODELS_PREFIX))}]",
                    "SageMaker Processing uploads the hub model's files under models/_hub/<org>/<name>/<revision>/: "
                    "the id is the run's (write only, no delete, no read)")
        acknowledge_job_basics(policy, log_group_arn, in_vpc=in_vpc, jobs="hub fetch jobs")
        for action in ("kms:GenerateDataKey*", "kms:ReEncrypt*"):
            acknowledge(policy, f"AwsSolutions-IAM5[Action::{action}]",
                        "key-scoped data-key and re-encrypt actions on the artifact key alone (the files it writes "
                        "under models/_hub/ are encrypted with it)")
