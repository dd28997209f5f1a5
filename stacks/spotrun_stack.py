"""SpotrunStack: composes the constructs of one deployment and grants between them.

One stack per stage on purpose: the stateful resources (key, buckets, table, registry group) sit beside their
users without cross-stack exports, which would pin them in place and block updates ("export in use"); their
logical IDs are pinned by tests instead, and they are retained on deletion.
"""

from __future__ import annotations

from aws_cdk import Aws, CfnOutput, Fn, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from constructs import Construct

from spotrun.seams import METRIC_DEFINITIONS, PREPARED_PREFIX, PreparationSettings, StackOutput
from training_constructs.artifact_store import ArtifactStore, ArtifactStoreProps
from training_constructs.cost_governance import CostGovernance, CostGovernanceProps
from training_constructs.execution_role import TrainingExecutionRole, TrainingExecutionRoleProps
from training_constructs.hub_fetch_role import HubFetchRole, HubFetchRoleProps
from training_constructs.interruption_events import InterruptionEvents, InterruptionEventsProps
from training_constructs.people_policies import PeoplePolicies, PeoplePoliciesProps
from training_constructs.preparation_role import PreparationRole, PreparationRoleProps
from training_constructs.serving_role import ServingRole, ServingRoleProps
from training_constructs.trainer_image import TrainerImage, TrainerImageProps, sagemaker_image, serving_image
from training_constructs.training_pipeline import TrainingPipeline, TrainingPipelineProps

from .config import AccountConfig


class SpotrunStack(Stack):
    def __init__(self, scope: Construct, id_: str, *, config: AccountConfig, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self.store = ArtifactStore(self, "Artifacts", props=ArtifactStoreProps(
            checkpoint_retention_days=config.checkpoint_retention_days))
        # The group is retained with its models; its name carries 8 characters of this stack instance's id, so
        # a second stage, or a redeploy after a destroy, creates its own group instead of colliding.
        stack_uuid = Fn.select(2, Fn.split("/", Aws.STACK_ID))
        self.model_package_group_name = Fn.join("-", [config.model_package_group_base,
                                                      Fn.select(0, Fn.split("-", stack_uuid))])
        self.model_package_group = sagemaker.CfnModelPackageGroup(
            self, "ModelPackageGroup", model_package_group_name=self.model_package_group_name,
            model_package_group_description=f"{config.project} fine-tunes ({config.stage})")
        self.model_package_group.apply_removal_policy(RemovalPolicy.RETAIN)

        # Publishers: the state machine and the canceller (IAM), this account's alarms (key policy below).
        topic_key = kms.Key(self, "FailuresTopicKey", enable_key_rotation=True,
                            description="spotrun failure notifications")
        # CloudWatch alarms of this account and region (the checkpoint-freshness alarm) publish to the topic.
        topic_key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": self.account},
                        "ArnLike": {"aws:SourceArn": f"arn:{self.partition}:cloudwatch:{self.region}:{self.account}"
                                                     ":alarm:*"}}))
        self.failures_topic = sns.Topic(self, "FailuresTopic", master_key=topic_key, enforce_ssl=True,
                                        display_name=f"{config.project} {config.stage} failures")
        for email in config.notification_emails:
            self.failures_topic.add_subscription(subs.EmailSubscription(email))

        self.image = TrainerImage(self, "TrainerImage", props=TrainerImageProps(
            base_image=config.trainer_base_image or sagemaker_image(config.region)))
        self.execution = TrainingExecutionRole(self, "ExecutionRole", props=TrainingExecutionRoleProps(
            store=self.store, repository=self.image.repository, in_vpc=bool(config.vpc_subnet_ids),
            mlflow_tracking_server_arns=config.mlflow_tracking_server_arns,
            wandb_api_key_secret_arns=config.wandb_api_key_secrets))
        self.preparation_role = PreparationRole(self, "PreparationRole", props=PreparationRoleProps(
            store=self.store, repository=self.image.repository, in_vpc=bool(config.vpc_subnet_ids),
            prepared_prefix=PREPARED_PREFIX))
        self.hub_fetch_role = HubFetchRole(self, "HubFetchRole", props=HubFetchRoleProps(
            store=self.store, repository=self.image.repository, in_vpc=bool(config.vpc_subnet_ids)))
        self.events = InterruptionEvents(self, "InterruptionEvents", props=InterruptionEventsProps(
            job_prefix=config.job_prefix, stage=config.stage))
        inference_image = config.inference_image or serving_image(config.region)
        self.serving = ServingRole(self, "ServingRole", props=ServingRoleProps(store=self.store,
                                                                               image_uri=inference_image))
        self.pipeline = TrainingPipeline(self, "Pipeline", props=TrainingPipelineProps(
            store=self.store, execution_role=self.execution.role, preparation_role=self.preparation_role.role,
            hub_fetch_role=self.hub_fetch_role.role,
            image_uri=self.image.image_uri,
            inference_image_uri=inference_image,
            model_package_group_name=self.model_package_group_name,
            model_package_group_base=config.model_package_group_base, job_prefix=config.job_prefix,
            project=config.project, stage=config.stage, cost_center=config.cost_center,
            failures_topic=self.failures_topic, interruptions_table_name=self.events.table.table_name,
            metric_definitions=tuple(METRIC_DEFINITIONS), subnet_ids=config.vpc_subnet_ids,
            security_group_ids=config.security_group_ids, allowed_instance_types=config.allowed_instance_types,
            max_usd_per_run=config.max_usd_per_run, max_instances_per_run=config.max_instances_per_run,
            max_concurrent_runs=config.max_concurrent_runs, mlflow_tracking_servers=config.mlflow_tracking_servers,
            wandb_api_key_secrets=config.wandb_api_key_secrets,
            preparation=PreparationSettings(instance_type=config.prepare_instance_type,
                                            instance_count=config.prepare_instance_count,
                                            max_runtime_seconds=int(config.prepare_max_hours * 3600))))
        self.pipeline.node.add_dependency(self.model_package_group)
        self.events.table.grant_read_data(self.pipeline.estimate_fn)
        self.failures_topic.grant_publish(self.pipeline.state_machine)
        self.governance = CostGovernance(self, "CostGovernance", props=CostGovernanceProps(
            project=config.project, stage=config.stage, monthly_budget_usd=config.monthly_budget_usd,
            emails=config.notification_emails, state_machine=self.pipeline.state_machine,
            alarm_topic=self.failures_topic,
            failure_queues=(self.pipeline.cancel_dlq, self.pipeline.cancel_failures, self.events.dead_letters,
                            self.events.recorder_failures),
            functions=(self.pipeline.estimate_fn, self.pipeline.guard_fn, self.pipeline.cancel_fn,
                       self.events.recorder, self.pipeline.prepare_fn, self.pipeline.launcher.fn)))
        # For the people who deploy, run and approve (docs/security.md): managed policies to attach.
        self.people = PeoplePolicies(self, "People", props=PeoplePoliciesProps(
            store=self.store, state_machine=self.pipeline.state_machine, serving_role=self.serving.role,
            job_prefix=config.job_prefix, model_package_group_base=config.model_package_group_base,
            prepared_prefix=PREPARED_PREFIX))
        # What users need after `cdk deploy`: where to upload, what to start, where to look.
        CfnOutput(self, StackOutput.ARTIFACT_BUCKET.value, value=self.store.bucket.bucket_name,
                  description="upload datasets/<name>/ (shards + index.json) and models/<name>/ (HF model dirs) here")
        CfnOutput(self, StackOutput.STATE_MACHINE_ARN.value, value=self.pipeline.state_machine.state_machine_arn,
                  description="spotrun start RUN.json --stage <stage> (or aws stepfunctions start-execution)")
        CfnOutput(self, StackOutput.FAILURES_TOPIC_ARN.value, value=self.failures_topic.topic_arn)
        CfnOutput(self, StackOutput.DASHBOARD_NAME.value, value=self.governance.dashboard.dashboard_name)
        CfnOutput(self, StackOutput.MODEL_PACKAGE_GROUP_NAME.value, value=self.model_package_group_name)
        CfnOutput(self, StackOutput.ESTIMATE_SETTINGS.value, value=self.to_json_string(self.pipeline.estimate_settings),
                  description="the estimate function's settings: spotrun start validates with them locally")
        CfnOutput(self, StackOutput.SERVING_ROLE_ARN.value, value=self.serving.role.role_arn,
                  description="the role spotrun deploy gives endpoint models (reads output/ and models/)")
        for key, policy, who in ((StackOutput.DEPLOYER_POLICY_ARN, self.people.deployer, "cdk deploy"),
                                 (StackOutput.RUN_USER_POLICY_ARN, self.people.run_user,
                                  "spotrun prepare/upload-model/start/status/logs/cancel/deploy"),
                                 (StackOutput.APPROVER_POLICY_ARN, self.people.approver, "spotrun approve")):
            CfnOutput(self, key.value, value=policy.managed_policy_arn, description=f"attach to whoever runs {who}")
