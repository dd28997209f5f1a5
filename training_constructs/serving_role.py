"""ServingRole: what a SageMaker endpoint's model (`spotrun deploy`) may do, and nothing more.

The model's execution role is the one SageMaker assumes "to access model artifacts and docker image for deployment
on ML compute instances" (API reference, CreateModel `ExecutionRoleArn`). So it reads the registered artifacts
under output/ (the package's model.tar.gz, a LoRA adapter) and the base models under models/ (a LoRA endpoint
serves the base from its uncompressed prefix), decrypts with the bucket's key, pulls the one serving image the
stage registers in its model packages (the HF LLM / TGI image lives in an AWS-owned account: its repository ARN
is scoped here, only `ecr:GetAuthorizationToken` takes no resource), and writes the endpoint's CloudWatch logs
(/aws/sagemaker/Endpoints/<endpoint>). It writes nothing to S3 and reads neither datasets/ nor checkpoints/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from .artifact_store import ArtifactStore
from .nag import acknowledge, rendered

# <account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repository>(:<tag>|@<digest>)
_ECR_IMAGE = re.compile(r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
                        r"(?P<repository>[a-z0-9._/-]+)(?::[\w.-]+|@sha256:[0-9a-f]{64})$")
ENDPOINT_LOG_GROUPS = "/aws/sagemaker/Endpoints/*"


@dataclass(frozen=True)
class ServingRoleProps:
    store: ArtifactStore
    """The artifact bucket and its key: registered models under `output/`, base models under `models/`."""
    image_uri: str
    """The serving image the stage's model packages record (an ECR URI): the only repository the role may pull."""

    def __post_init__(self) -> None:
        if not _ECR_IMAGE.fullmatch(self.image_uri):
            raise ValueError(f"ServingRole: image_uri={self.image_uri!r} is not an ECR image URI "
                             "(<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>): the serving role "
                             "pulls from one ECR repository")


def image_repository_arn(scope: Construct, image_uri: str) -> str:
    """The ARN of the ECR repository an image URI names (in its own account and region)."""
    found = _ECR_IMAGE.fullmatch(image_uri)
    return Stack.of(scope).format_arn(service="ecr", account=found["account"], region=found["region"],
                                      resource="repository", resource_name=found["repository"])


class ServingRole(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: ServingRoleProps) -> None:
        super().__init__(scope, id_)
        stack, store = Stack.of(self), props.store
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
                             description="spotrun endpoints: read registered and base models, pull the serving image")
        store.grant_read_prefix(self.role, store.output_prefix)  # GetObject/ListBucket + kms:Decrypt only
        store.grant_read_prefix(self.role, store.models_prefix)
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"],
            resources=[image_repository_arn(self, props.image_uri)]))
        self.role.add_to_policy(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))
        log_group_arn = stack.format_arn(service="logs", resource="log-group", resource_name=ENDPOINT_LOG_GROUPS,
                                         arn_format=ArnFormat.COLON_RESOURCE_NAME)
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[log_group_arn]))
        self.policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(self.policy, "AwsSolutions-IAM5[Resource::*]",
                    "ecr:GetAuthorizationToken supports no resource scoping (the image pulls themselves are scoped "
                    "to the serving image's repository)")
        acknowledge(self.policy, f"AwsSolutions-IAM5[Resource::{rendered(self, log_group_arn)}]",
                    "SageMaker writes each endpoint's logs to /aws/sagemaker/Endpoints/<endpoint>: endpoint names "
                    "are chosen at deploy time")
