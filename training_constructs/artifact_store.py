"""ArtifactStore: the run bucket (datasets/, models/, checkpoints/<run>/<execution>/, output/<job>/) and its KMS key.

Stateful: the key and both buckets are retained when the stack is deleted, and their logical IDs are pinned
(tests/infra/test_gates.py, test_stateful_resources_keep_their_logical_ids) so that a refactor cannot replace them.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from .nag import acknowledge, rendered

DATASETS, MODELS, CHECKPOINTS, OUTPUT = "datasets/", "models/", "checkpoints/", "output/"


@dataclass(frozen=True)
class ArtifactStoreProps:
    checkpoint_retention_days: int = 30
    """Days a checkpoint object is kept under checkpoints/ (the model is in output/ and the registry by then).
    Default: 30."""
    noncurrent_version_days: int = 7
    """Days an overwritten or deleted object's old version is kept (the bucket is versioned). Default: 7."""

    def __post_init__(self) -> None:
        if self.checkpoint_retention_days < 1 or self.noncurrent_version_days < 1:
            raise ValueError("checkpoint_retention_days and noncurrent_version_days must be >= 1")


class ArtifactStore(Construct):
    """Bucket + customer-managed key + access-log bucket; the prefix layout as attributes."""

    datasets_prefix, models_prefix, checkpoints_prefix, output_prefix = DATASETS, MODELS, CHECKPOINTS, OUTPUT

    def __init__(self, scope: Construct, id_: str, *, props: ArtifactStoreProps = ArtifactStoreProps()) -> None:
        super().__init__(scope, id_)
        self.key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=RemovalPolicy.RETAIN,
                           description="spotrun artifacts: datasets, models, checkpoints, outputs")
        self.log_bucket = s3.Bucket(
            self, "AccessLogs", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(365))],
        )
        acknowledge(self.log_bucket, "AwsSolutions-S1",
                    "this is the access-log bucket itself; logging it into itself would loop")
        self.bucket = s3.Bucket(
            self, "Bucket", encryption=s3.BucketEncryption.KMS, encryption_key=self.key, bucket_key_enabled=True,
            enforce_ssl=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL, versioned=True,
            removal_policy=RemovalPolicy.RETAIN, server_access_logs_bucket=self.log_bucket,
            server_access_logs_prefix="artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(id="abort-incomplete-multipart",
                                 abort_incomplete_multipart_upload_after=Duration.days(1)),
                s3.LifecycleRule(id="expire-noncurrent", noncurrent_version_expiration=Duration.days(
                    props.noncurrent_version_days)),
                # Checkpoints of finished runs are dead weight: the model is in output/ and the registry.
                s3.LifecycleRule(id="expire-checkpoints", prefix=CHECKPOINTS,
                                 expiration=Duration.days(props.checkpoint_retention_days)),
            ],
        )

    # ---- layout -------------------------------------------------------------------------------------------

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket.bucket_name}/{prefix}"

    def arn_under(self, prefix: str) -> str:
        return self.bucket.arn_for_objects(f"{prefix}*")

    def grant_read_prefix(self, grantee: iam.IGrantable, prefix: str) -> None:
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[self.arn_under(prefix)]))
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}}))
        self.key.grant_decrypt(grantee)
        self._acknowledge_prefix(grantee, prefix)

    def _acknowledge_prefix(self, grantee: iam.IGrantable, prefix: str) -> None:
        policy = grantee.grant_principal.node.try_find_child("DefaultPolicy")
        if policy is not None:
            acknowledge(policy, f"AwsSolutions-IAM5[Resource::{rendered(self, self.arn_under(prefix))}]",
                        f"objects under the {prefix} prefix of the artifact bucket only: a prefix grant")

    def grant_read_write_prefix(self, grantee: iam.IGrantable, prefix: str, *, delete: bool = True) -> None:
        """Read and write under the prefix; `delete=False` keeps what is written there (e.g. registered models)."""
        self.grant_read_prefix(grantee, prefix)
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:PutObject", "s3:AbortMultipartUpload"] + (["s3:DeleteObject"] if delete else []),
            resources=[self.arn_under(prefix)]))
        self.key.grant_encrypt_decrypt(grantee)
        policy = grantee.grant_principal.node.try_find_child("DefaultPolicy")
        if policy is not None:
            for action in ("kms:GenerateDataKey*", "kms:ReEncrypt*"):
                acknowledge(policy, f"AwsSolutions-IAM5[Action::{action}]",
                            "key-scoped data-key and re-encrypt actions on the artifact key alone (writes under "
                            f"{prefix} are encrypted with it)")
