"""RunLauncher: the launch function and the launcher role it assumes to create training jobs as their run.

The function (spotrun/handlers/launch.py) assumes the launcher role with the session tag run=<run> and creates the
job with `SessionChainingConfig.EnableSessionTagChaining`: SageMaker then assumes the training role with that tag,
whose S3 grants name `${aws:PrincipalTag/run}` (execution_role.py). The launcher role trusts the function's role
alone (and the cost guard's, which creates sentinel jobs), only with a `run` tag and no other, and may create (and
tag) the stage's training jobs and pass the training role to SageMaker; nothing else. The state machine can no
longer pass the training role itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from spotrun.seams import RUN_TAG, LaunchEnvironment

from .lambda_code import spotrun_function
from .nag import acknowledge, rendered


@dataclass(frozen=True)
class RunLauncherProps:
    execution_role: iam.IRole
    """The training role the launcher role may pass to SageMaker (and nothing else)."""
    job_arn: str
    """The stage's training jobs (an ARN pattern on the stage's job-name prefix): what the launcher may create."""
    also_assumed_by: tuple[iam.IRole, ...] = ()
    """Other functions' roles that create jobs as their run with the same trust conditions (the cost guard's
    sentinel). Default: none."""


class RunLauncher(Construct):
    """`fn`: the function the state machine invokes with a CreateTrainingJob request; `role`: the launcher role."""

    def __init__(self, scope: Construct, id_: str, *, props: RunLauncherProps) -> None:
        super().__init__(scope, id_)
        execution_role, job_arn = props.execution_role, props.job_arn
        self.fn: lambda_.Function = spotrun_function(
            self, "Fn", handler="spotrun.handlers.launch.handler", timeout_s=60,
            description="spotrun launcher: creates each training job with its run's session tag", environment={})
        # Only the function's role, only with exactly one session tag: run (AssumeRole's Tags).
        self.role = iam.Role(self, "Role", description="spotrun launcher: creates training jobs as their run",
                             assumed_by=iam.ArnPrincipal(self.fn.role.role_arn).with_conditions({
                                 "StringLike": {f"aws:RequestTag/{RUN_TAG}": "?*"},
                                 "ForAllValues:StringEquals": {"aws:TagKeys": [RUN_TAG]}}).with_session_tags())
        for other in props.also_assumed_by:
            self.role.assume_role_policy.add_statements(iam.PolicyStatement(
                actions=["sts:AssumeRole", "sts:TagSession"], principals=[iam.ArnPrincipal(other.role_arn)],
                conditions={"StringLike": {f"aws:RequestTag/{RUN_TAG}": "?*"},
                            "ForAllValues:StringEquals": {"aws:TagKeys": [RUN_TAG]}}))
        for name, value in LaunchEnvironment(launcher_role_arn=self.role.role_arn).to_env().items():
            self.fn.add_environment(name, value)
        self.fn.add_to_role_policy(iam.PolicyStatement(actions=["sts:AssumeRole", "sts:TagSession"],
                                                       resources=[self.role.role_arn]))
        self.role.add_to_policy(iam.PolicyStatement(actions=["sagemaker:CreateTrainingJob", "sagemaker:AddTags"],
                                                    resources=[job_arn]))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["iam:PassRole"], resources=[execution_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}))
        acknowledge(self.role.node.find_child("DefaultPolicy"),
                    f"AwsSolutions-IAM5[Resource::{rendered(self, job_arn)}]",
                    "creates training jobs of this stage only: every job name starts with the stage's prefix")
