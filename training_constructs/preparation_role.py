"""PreparationRole: what a SageMaker Processing job preparing raw data may do (the only job role that writes
datasets/_prepared/), and nothing more."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from constructs import Construct

from .artifact_store import ArtifactStore
from .execution_role import acknowledge_job_basics, job_basics
from .nag import acknowledge, rendered


@dataclass(frozen=True)
class PreparationRoleProps:
    store: ArtifactStore
    """The artifact bucket and key: the role reads datasets/ and models/ and writes under `prepared_prefix`."""
    repository: ecr.IRepository
    """The trainer image's ECR repository (preparation runs the trainer image): the only one it may pull."""
    in_vpc: bool
    """Whether jobs run in the stage's VPC (the role may then manage their network interfaces)."""
    prepared_prefix: str
    """Where prepared parts are written (write only, no read, no delete): spotrun.seams.PREPARED_PREFIX."""


class PreparationRole(Construct):
    """The preparation (SageMaker Processing) job's role, the only job role that writes prepared data: it reads
    the raw text under datasets/, the model's tokenizer under models/ and the execution's tokenizer manifest
    (checkpoints/<run>/<execution>/preparation/), and adds its parts under datasets/_prepared/ (no read there, no
    delete). Training jobs run as TrainingExecutionRole, which cannot write datasets/ at all: a run that reaches the
    network (MLflow) cannot poison the prepared data later runs reuse."""

    def __init__(self, scope: Construct, id_: str, *, props: PreparationRoleProps) -> None:
        super().__init__(scope, id_)
        store, prepared_prefix = props.store, props.prepared_prefix
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
                             description="spotrun preparation (processing) jobs")
        store.grant_read_prefix(self.role, store.datasets_prefix)
        store.grant_read_prefix(self.role, store.models_prefix)
        manifests = store.bucket.arn_for_objects(f"{store.checkpoints_prefix}*/preparation/*")
        self.role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[manifests]))
        self.role.add_to_policy(iam.PolicyStatement(actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                                                    resources=[store.arn_under(prepared_prefix)]))
        log_group_arn = job_basics(self.role, store, props.repository, in_vpc=props.in_vpc,
                                   log_group="/aws/sagemaker/ProcessingJobs*")
        policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, manifests)}]",
                    "the tokenizer manifest each execution writes under checkpoints/<run>/<execution>/preparation/ "
                    "(read only)")
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, store.arn_under(prepared_prefix))}]",
                    "SageMaker Processing uploads each instance's part under datasets/_prepared/<content key>/: "
                    "keys are not known ahead (write only, no delete)")
        acknowledge_job_basics(policy, log_group_arn, in_vpc=props.in_vpc, jobs="preparation jobs")
        for action in ("kms:GenerateDataKey*", "kms:ReEncrypt*"):
            acknowledge(policy, f"AwsSolutions-IAM5[Action::{action}]",
                        "key-scoped data-key and re-encrypt actions on the artifact key alone (the parts it writes "
                        "under datasets/_prepared/ are encrypted with it)")
