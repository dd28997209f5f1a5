"""The pipeline's preparation step, built into the TrainingPipeline construct (same scope, same IDs).

Raw `data.source` (spotrun/pipeline/preparation.py): the estimate answers Prepare -> CreatePreparationJob (a SageMaker
Processing job running the trainer image's `prepare --sagemaker-processing` on the stage's CPU instances) ->
WaitForPreparation / DescribePreparationJob until it ends -> FinishPreparation (Lambda: the job's bill, the parts'
indexes merged) -> EstimatePrepared on the prepared shards -> EstimateOk; or PreparationFailed with the reason.
A hub model.source (spotrun/pipeline/hub.py): the same step with kind "model" (PrepareWhat): CreateModelFetchJob
(`python -m spotrun.pipeline.hub_fetch`, the one job with network, as the hub fetch role) -> the same wait ->
FinishPreparation (its bill, the copy checked complete) -> EstimatePrepared on the copy under models/_hub/.
The same poll pattern as the training job (CallAwsService + Wait + Describe): moto's interpreter runs no `.sync`.
"""

from __future__ import annotations

from typing import Any, Protocol

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from spotrun.seams import (
    FINISH_FAILED,
    HUB_MODELS_PREFIX,
    PREPARE_MODEL,
    PREPARED_PREFIX,
    PrepareEnvironment,
    preparation_path,
)

from .artifact_store import ArtifactStore
from .lambda_code import spotrun_function
from .nag import acknowledge, rendered


class PreparationProps(Protocol):
    """What the preparation step reads of the pipeline's props (training_pipeline.TrainingPipelineProps)."""

    store: ArtifactStore
    execution_role: iam.IRole
    preparation_role: iam.IRole
    hub_fetch_role: iam.IRole
    image_uri: str
    subnet_ids: tuple[str, ...]
    security_group_ids: tuple[str, ...]


class PipelineSteps(Protocol):
    """What the preparation step uses of the TrainingPipeline construct it is built into (its scope as well):
    named by what it offers, since training_pipeline.py imports this module."""

    prepare_fn: lambda_.Function

    def sagemaker_call(self, name: str, action: str, parameters: dict, resources: list[str], result_path: str,
                       iam_action: str | None = None, result_selector: dict | None = None) -> tasks.CallAwsService:
        ...

    def failure_notice(self, props: Any, name: str, subject: str, message_path: str) -> tasks.SnsPublish:
        ...

    def estimate_task(self, name: str, pipeline_error: sfn.IChainable, **extra: str) -> tasks.LambdaInvoke:
        ...


def preparation_functions(pipeline: Construct, props: PreparationProps, processing_arn: str) -> lambda_.Function:
    """The preparation's finish step (merges the parts' indexes), and what the processing job may write."""
    store = props.store
    prepare_fn = spotrun_function(
        pipeline, "PrepareFn", handler="spotrun.handlers.prepare.handler", timeout_s=300,
        description="spotrun preparation: merges the processing job's parts into the dataset's index.json",
        environment=PrepareEnvironment(bucket=store.bucket.bucket_name).to_env())
    prepare_fn.add_to_role_policy(iam.PolicyStatement(actions=["sagemaker:DescribeProcessingJob"],
                                                      resources=[processing_arn]))
    # The parts (read), the merged index.json, tokenizer/ and the marker (written; nothing deleted).
    store.grant_read_write_prefix(prepare_fn, PREPARED_PREFIX, delete=False)
    store.grant_read_prefix(prepare_fn, HUB_MODELS_PREFIX)  # a fetched hub model's manifest, checked
    acknowledge(prepare_fn.role.node.find_child("DefaultPolicy"),
                f"AwsSolutions-IAM5[Resource::{rendered(pipeline, processing_arn)}]",
                "describes preparation jobs of this stage only: every job name starts with the stage's prefix")
    return prepare_fn


def preparation_states(pipeline: PipelineSteps, props: PreparationProps, processing_arn: str,
                       pipeline_error: sfn.IChainable, estimate_ok: sfn.Choice) -> sfn.IChainable:
    """Raw data.source: the Processing job the estimate planned -> poll -> finish (merge, cost) -> the estimate
    again on the prepared shards (-> EstimateOk), or PreparationFailed with the job's reason."""
    # The trainer image's own prepare (python -m spotrun_trainer prepare --sagemaker-processing), network-isolated
    # as the role that writes datasets/_prepared/; a hub model's fetch (spotrun.pipeline.hub_fetch) is the one job
    # with network, as a role that only adds files under models/_hub/.
    create = _create_job(pipeline, props, processing_arn, "CreatePreparationJob", props.preparation_role,
                         isolated=True)
    fetch = _create_job(pipeline, props, processing_arn, "CreateModelFetchJob", props.hub_fetch_role, isolated=False)
    wait = sfn.Wait(pipeline, "WaitForPreparation", time=sfn.WaitTime.seconds_path(preparation_path("poll_seconds")))
    for job in (create, fetch):
        job.add_catch(wait, errors=["SageMaker.ResourceInUseException"], result_path=sfn.JsonPath.DISCARD)
        job.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
        job.next(wait)
    describe = pipeline.sagemaker_call("DescribePreparationJob", "describeProcessingJob",
                                       {"ProcessingJobName.$": preparation_path("job_name")}, [processing_arn],
                                       "$.preparation_job", iam_action="sagemaker:DescribeProcessingJob",
                                       result_selector={"ProcessingJobStatus.$": "$.ProcessingJobStatus"})
    describe.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
    finish = tasks.LambdaInvoke(
        pipeline, "FinishPreparation", lambda_function=pipeline.prepare_fn, payload_response_only=True,
        result_path="$.prepared", payload=sfn.TaskInput.from_object({"preparation.$": "$.plan.preparation"}))
    finish.add_retry(errors=["States.TaskFailed"], interval=Duration.seconds(10), max_attempts=3, backoff_rate=2)
    finish.add_catch(pipeline_error, errors=["States.ALL"], result_path="$.error")
    failed = pipeline.failure_notice(props, "NotifyPreparationFailed", "spotrun: preparation failed",
                                     "$.prepared.message").next(
        sfn.Fail(pipeline, "PreparationFailed", error="PreparationFailed", cause_path="$.prepared.message"))
    again = pipeline.estimate_task("EstimatePrepared", pipeline_error, **{"prepared.$": "$.prepared.prepared"})
    ended = [sfn.Condition.string_equals("$.preparation_job.ProcessingJobStatus", s)
             for s in ("Completed", "Failed", "Stopped")]
    wait.next(describe).next(sfn.Choice(pipeline, "PreparationEnded").when(sfn.Condition.or_(*ended), finish)
                             .otherwise(wait))
    finish.next(sfn.Choice(pipeline, "PreparedOk")
                .when(sfn.Condition.string_equals("$.prepared.status", FINISH_FAILED), failed)
                .otherwise(again))
    again.next(estimate_ok)
    return sfn.Choice(pipeline, "PrepareWhat").when(
        sfn.Condition.string_equals(preparation_path("kind"), PREPARE_MODEL), fetch).otherwise(create)


def _create_job(pipeline: PipelineSteps, props: PreparationProps, processing_arn: str, name: str, role: iam.IRole,
                *, isolated: bool) -> tasks.CallAwsService:
    """CreateProcessingJob from the estimate's Prepare output, as `role`, with or without network isolation (in
    the stage's VPC when it has one: a fetch then needs a route to the hub, docs/models.md)."""
    network: dict = {"EnableNetworkIsolation": isolated, "EnableInterContainerTrafficEncryption": False}
    if props.subnet_ids:
        network["VpcConfig"] = {"Subnets": list(props.subnet_ids),
                                "SecurityGroupIds": list(props.security_group_ids)}
    return pipeline.sagemaker_call(name, "createProcessingJob", {
        "ProcessingJobName.$": preparation_path("job_name"),
        "RoleArn": role.role_arn,
        "AppSpecification": {"ImageUri": props.image_uri, "ContainerEntrypoint.$": preparation_path("entrypoint")},
        "ProcessingResources.$": preparation_path("processing_resources"),
        "StoppingCondition.$": preparation_path("stopping_condition"),
        "ProcessingInputs.$": preparation_path("processing_inputs"),
        "ProcessingOutputConfig": {"Outputs.$": preparation_path("processing_outputs"),
                                   "KmsKeyId": props.store.key.key_arn},
        "NetworkConfig": network,
        "Tags.$": preparation_path("tags"),
    }, [processing_arn], sfn.JsonPath.DISCARD, iam_action="sagemaker:CreateProcessingJob")
