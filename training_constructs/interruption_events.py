"""InterruptionEvents: EventBridge rules on this stack's SageMaker training jobs.

- SecondaryStatus=Interrupted, and every terminal status -> the interruption recorder (Lambda -> DynamoDB,
  idempotent under duplicate delivery, PutItem only), which the estimate reads to set the checkpoint interval; for
  a Completed job it also records the measured MFU (DescribeTrainingJob's final metrics), and for a finished spot
  job its waits for capacity (from the event's status transitions), which later estimates use.
  Events the Lambda could not take after the retries go to a dead-letter queue instead of being dropped.
Only jobs whose names start with this stage's prefix match: other stacks' jobs never reach these targets.
Failures are notified once, by the state machine's Notify states (and the canceller): no rule here sends them.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from constructs import Construct

from spotrun.seams import METRICS_NAMESPACE, RecorderEnvironment

from .lambda_code import dead_letter_queue, on_failure_destination, spotrun_function
from .nag import acknowledge, rendered

SOURCE, DETAIL_TYPE = "aws.sagemaker", "SageMaker Training Job State Change"


@dataclass(frozen=True)
class InterruptionEventsProps:
    job_prefix: str
    """The stage's training job name prefix: only these jobs' state changes are recorded."""
    stage: str
    """The stage's name: the dimension of the interruption metric."""
    metrics_namespace: str = METRICS_NAMESPACE
    """The CloudWatch namespace of the interruption metric. Default: spotrun.seams.METRICS_NAMESPACE."""


class InterruptionEvents(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: InterruptionEventsProps) -> None:
        super().__init__(scope, id_)
        self.table = dynamodb.TableV2(
            self, "Table", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="sk", type=dynamodb.AttributeType.STRING),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True),
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.recorder = spotrun_function(
            self, "Recorder", handler="spotrun.handlers.interruptions.handler",
            description="records spot interruptions and instance-hours of spotrun training jobs",
            environment=RecorderEnvironment(table_name=self.table.table_name, metrics_namespace=props.metrics_namespace,
                                            stage=props.stage).to_env())
        self.table.grant(self.recorder, "dynamodb:PutItem")  # conditional puts are all it does
        self.dead_letters = dead_letter_queue(self, "RecorderDlq")
        job_arn = Stack.of(self).format_arn(service="sagemaker", resource="training-job",
                                            resource_name=f"{props.job_prefix}*")
        self.recorder.add_to_role_policy(iam.PolicyStatement(actions=["sagemaker:DescribeTrainingJob"],
                                                             resources=[job_arn]))
        acknowledge(self.recorder.role.node.find_child("DefaultPolicy"),
                    f"AwsSolutions-IAM5[Resource::{rendered(self, job_arn)}]",
                    "reads the final metrics of this stage's training jobs only: every job name starts with the "
                    "stage's prefix")
        name = {"TrainingJobName": [{"prefix": props.job_prefix}]}
        self.interruption_rule = events.Rule(self, "Interrupted", event_pattern=events.EventPattern(
            source=[SOURCE], detail_type=[DETAIL_TYPE],
            detail={**name, "SecondaryStatus": ["Interrupted"]}))
        self.finished_rule = events.Rule(self, "Finished", event_pattern=events.EventPattern(
            source=[SOURCE], detail_type=[DETAIL_TYPE],
            detail={**name, "TrainingJobStatus": ["Completed", "Failed", "Stopped"]}))
        for rule in (self.interruption_rule, self.finished_rule):
            rule.add_target(targets.LambdaFunction(self.recorder, retry_attempts=8,
                                                   dead_letter_queue=self.dead_letters))
        # Invoked asynchronously: a function error after Lambda's retries lands here instead of being dropped.
        self.recorder_failures = on_failure_destination(self, "RecorderFailures", self.recorder)
