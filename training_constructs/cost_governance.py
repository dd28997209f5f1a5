"""CostGovernance: cost-allocation tags, a monthly AWS Budget on the project's tag, the CloudWatch dashboard, the
checkpoint-freshness alarm, and the alarms that say a part of the pipeline is failing: a message in a dead-letter
or on-failure queue (an event nobody handled), a Lambda error, a failed execution. All reach the failures topic.

Checkpoint freshness: SageMaker's checkpoint uploader has been seen to stall for hours on large jobs
(https://github.com/aws/sagemaker-python-sdk/issues/3062, https://github.com/huggingface/transformers/issues/11390).
The cost guard publishes the age of the newest committed checkpoint in S3 at each poll and, per stage, that age
over (2 x the planned interval + the upload time); the alarm fires when the latter reaches 1.

NOTE: user-defined tags count in Budgets and Cost Explorer only once activated as cost-allocation tags
(Billing console, or `aws ce update-cost-allocation-tags-status`); CloudFormation cannot activate them. The
deploy steps (docs/deploying.md) include it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, Tags
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct, IConstruct

from spotrun.seams import (
    CHECKPOINT_AGE_METRIC,
    CHECKPOINT_OVERDUE_METRIC,
    INTERRUPTIONS_METRIC,
    METRICS_NAMESPACE,
    RUN_COST_METRIC,
    metric_name,
)

SAGEMAKER_NAMESPACE = "/aws/sagemaker/TrainingJobs"


def apply_tags(scope: IConstruct, tags: dict[str, str]) -> None:
    """Cost-allocation tags on every taggable resource under scope (training jobs get them from the plan)."""
    for key, value in sorted(tags.items()):
        Tags.of(scope).add(key, value)


@dataclass(frozen=True)
class CostGovernanceProps:
    project: str
    """The `project` cost-allocation tag's value: the monthly budget counts the resources carrying it."""
    stage: str
    """The stage's name: the dimension of the stage's metrics and alarms."""
    monthly_budget_usd: float
    """The monthly AWS Budget in USD (> 0): email at 80% actual and 100% forecast spend."""
    emails: tuple[str, ...]
    """Who the budget emails (may be empty: the budget is then without notifications)."""
    state_machine: sfn.IStateMachine
    """The training pipeline's state machine: its executions on the dashboard, failed ones alarm."""
    alarm_topic: sns.ITopic | None = None
    """Where every alarm is sent. Default: None (the alarms are made without actions)."""
    metrics_namespace: str = METRICS_NAMESPACE
    """The CloudWatch namespace of the pipeline's own metrics. Default: spotrun.seams.METRICS_NAMESPACE."""
    failure_queues: tuple[sqs.IQueue, ...] = ()
    """Dead-letter and on-failure queues: any message in one is an event that was not handled. Default: none."""
    functions: tuple[lambda_.IFunction, ...] = ()
    """Functions whose errors alarm: a guard or canceller that raises is a cap that rests on MaxRuntime alone.
    Default: none."""

    def __post_init__(self) -> None:
        if self.monthly_budget_usd <= 0:
            raise ValueError(f"monthly_budget_usd={self.monthly_budget_usd}: expected a positive amount")


class CostGovernance(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: CostGovernanceProps) -> None:
        super().__init__(scope, id_)
        subscribers = [budgets.CfnBudget.SubscriberProperty(subscription_type="EMAIL", address=a)
                       for a in props.emails]
        notifications = []
        if subscribers:
            for kind, threshold in (("ACTUAL", 80), ("FORECASTED", 100)):
                notifications.append(budgets.CfnBudget.NotificationWithSubscribersProperty(
                    notification=budgets.CfnBudget.NotificationProperty(
                        notification_type=kind, comparison_operator="GREATER_THAN", threshold=threshold,
                        threshold_type="PERCENTAGE"),
                    subscribers=subscribers))
        self.budget = budgets.CfnBudget(self, "MonthlyBudget", budget=budgets.CfnBudget.BudgetDataProperty(
            budget_type="COST", time_unit="MONTHLY",
            budget_limit=budgets.CfnBudget.SpendProperty(amount=props.monthly_budget_usd, unit="USD"),
            cost_filters={"TagKeyValue": [f"user:project${props.project}"]}),
            notifications_with_subscribers=notifications or None)

        ns, stage = props.metrics_namespace, props.stage
        sm = props.state_machine

        def search(metric: str, label: str) -> cw.MathExpression:
            return cw.MathExpression(
                expression=f"SEARCH('{{{SAGEMAKER_NAMESPACE},Host}} MetricName=\"{metric}\"', 'Average', 300)",
                label=label, period=Duration.minutes(5))

        self.dashboard = cw.Dashboard(self, "Dashboard", widgets=[[
            cw.GraphWidget(title="Runs", left=[sm.metric_started(), sm.metric_succeeded(), sm.metric_failed()],
                           width=8),
            cw.GraphWidget(title="Spot interruptions", width=8, left=[cw.Metric(
                namespace=ns, metric_name=INTERRUPTIONS_METRIC, dimensions_map={"Stage": stage}, statistic="Sum",
                period=Duration.hours(1))]),
            cw.GraphWidget(title="Run cost (USD, at each poll)", width=8, left=[cw.MathExpression(
                expression=f"SEARCH('{{{ns},Run,Stage}} MetricName=\"{RUN_COST_METRIC}\" Stage=\"{stage}\"', "
                           "'Maximum', 300)",
                label="cost", period=Duration.minutes(5))]),
        ], [
            cw.GraphWidget(title="Training loss and validation loss", width=8,
                           left=[search(metric_name("loss"), "loss"), search(metric_name("val_loss"), "val_loss")]),
            cw.GraphWidget(title="Throughput (tokens/s) and MFU", width=8,
                           left=[search(metric_name("tokens_per_s"), "tokens/s")],
                           right=[search(metric_name("mfu"), "MFU")]),
            cw.GraphWidget(title="Newest committed checkpoint age (s)", width=8, left=[cw.MathExpression(
                expression=f"SEARCH('{{{ns},Run,Stage}} MetricName=\"{CHECKPOINT_AGE_METRIC}\" "
                           f"Stage=\"{stage}\"', 'Maximum', 300)", label="age", period=Duration.minutes(5))]),
        ]])
        # Age / (2 x planned interval + upload time), the worst run of the stage: >= 1 means overdue.
        self.checkpoint_alarm = cw.Alarm(
            self, "CheckpointOverdue", metric=cw.Metric(
                namespace=ns, metric_name=CHECKPOINT_OVERDUE_METRIC, dimensions_map={"Stage": stage},
                statistic="Maximum", period=Duration.minutes(5)),
            threshold=1, evaluation_periods=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            alarm_description="a run's newest committed checkpoint in S3 is older than twice its planned interval plus "
                              "the upload time: the checkpoint uploader may be stalled; an interruption now loses "
                              "that much work")
        self.failure_alarms = self._failure_alarms(props)
        if props.alarm_topic is not None:
            for alarm in (self.checkpoint_alarm, *self.failure_alarms):
                alarm.add_alarm_action(cw_actions.SnsAction(props.alarm_topic))

    def _failure_alarms(self, props: CostGovernanceProps) -> list[cw.Alarm]:
        def at_least_one(id_: str, metric: cw.IMetric, description: str) -> cw.Alarm:
            return cw.Alarm(self, id_, metric=metric, threshold=1, evaluation_periods=1,
                            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                            treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)

        alarms = [at_least_one("ExecutionsFailed", props.state_machine.metric_failed(
            period=Duration.minutes(5), statistic="Sum"), "a spotrun execution failed (the run's own "
                                                         "notification says why)")]
        for i, queue in enumerate(props.failure_queues):
            alarms.append(at_least_one(f"FailureQueue{i}", queue.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(5), statistic="Maximum"),
                "an event reached a dead-letter or on-failure queue: a handler never processed it"))
        for i, fn in enumerate(props.functions):
            alarms.append(at_least_one(f"FunctionErrors{i}", fn.metric_errors(period=Duration.minutes(5),
                                                                              statistic="Sum"),
                                       "a spotrun Lambda function raised (cost guard, canceller, estimate or "
                                       "recorder); the cap still holds through each job's MaxRuntime"))
        return alarms
