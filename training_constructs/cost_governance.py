"""CostGovernance: cost-allocation tags, a monthly AWS Budget on the project's tag, and the CloudWatch dashboard.

NOTE: user-defined tags count in Budgets and Cost Explorer only once activated as cost-allocation tags
(Billing console, or `aws ce update-cost-allocation-tags-status`); CloudFormation cannot activate them. The
README's deploy steps include it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, Tags
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct, IConstruct

SAGEMAKER_NAMESPACE = "/aws/sagemaker/TrainingJobs"


def apply_tags(scope: IConstruct, tags: dict[str, str]) -> None:
    """Cost-allocation tags on every taggable resource under scope (training jobs get them from the plan)."""
    for key, value in sorted(tags.items()):
        Tags.of(scope).add(key, value)


@dataclass(frozen=True)
class CostGovernanceProps:
    project: str
    stage: str
    monthly_budget_usd: float
    emails: tuple[str, ...]
    state_machine: sfn.IStateMachine
    metrics_namespace: str = "spotrun"

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
                namespace=ns, metric_name="Interruptions", dimensions_map={"Stage": stage}, statistic="Sum",
                period=Duration.hours(1))]),
            cw.GraphWidget(title="Run cost (USD, at each poll)", width=8, left=[cw.MathExpression(
                expression=f"SEARCH('{{{ns},Run,Stage}} MetricName=\"RunCostUSD\" Stage=\"{stage}\"', 'Maximum', 300)",
                label="cost", period=Duration.minutes(5))]),
        ], [
            cw.GraphWidget(title="Training loss", width=12, left=[search("train:loss", "loss")]),
            cw.GraphWidget(title="Throughput (tokens/s) and MFU", width=12,
                           left=[search("train:tokens_per_s", "tokens/s")], right=[search("train:mfu", "MFU")]),
        ]])
