"""`spotrun approve|deploy|undeploy RUN --stage dev`: a finished run's registered model to a SageMaker endpoint.

Everything is found from the run, never typed: the execution's output names the model package (its ARN) and the
training job; DescribeTrainingJob gives the method and the base model (`model.source` hyperparameter); the stack's
`ServingRoleArn` output gives the model's role (training_constructs/serving_role.py: reads output/ and models/,
pulls the serving image, writes endpoint logs; the training role may not read output/).

    full model  CreateModel from the approved package itself (`ModelPackageName`: the package's serving image,
                model.tar.gz and environment, as registered)
    LoRA        the package's serving image (HF LLM / TGI) with the base model as the model data (uncompressed
                S3 prefix, `ModelDataSource`) and the adapter as an additional model data source (SageMaker puts it
                in /opt/ml/additional-model-data-sources/<channel>/), loaded by TGI's `LORA_ADAPTERS`
                (`name=path`); with `--merged`, the merged export in the package's model.tar.gz (`merged/`,
                written when the run set export.merge_lora) instead
then CreateEndpointConfig (one variant, `--instance-type`, default ml.g5.2xlarge) and CreateEndpoint, all named
after the run (`<run>-<UTC time>` for the model and config, the run's name for the endpoint). `undeploy` deletes
the endpoint, its config and its models.
"""

from __future__ import annotations

import argparse
import json
import re
import time

from botocore.exceptions import ClientError

from ..contract.strict_json import show
from ..seams import StackOutput
from ..settings.wire import parse
from .remote import Deployment, RemoteError, common, deployment, find_execution, run_command

ADAPTER_CHANNEL = "adapter"
# Where SageMaker puts an additional model data source: /opt/ml/additional-model-data-sources/<ChannelName>/ (the
# AWS providers' aws_sagemaker_model docs; the API reference names the field only). A Gzip S3Object is a tar.gz
# SageMaker extracts there (API reference: S3ModelDataSource, CompressionType).
# TGI's launcher reads LORA_ADAPTERS entries as `adapter_id=path@revision` (huggingface/text-generation-inference,
# launcher/src/main.rs).
ADAPTER_DIR = f"/opt/ml/additional-model-data-sources/{ADAPTER_CHANNEL}"
DEFAULT_INSTANCE_TYPE = "ml.g5.2xlarge"
MERGED_DIR = "merged"  # spotrun_trainer/export.py MERGED_DIR: the merged LoRA export inside the model artifact
_NAME = re.compile(r"[^a-zA-Z0-9-]+")


def resource_name(text: str, limit: int = 63) -> str:
    """A SageMaker model / endpoint (config) name: `^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}`."""
    name = re.sub(r"-+", "-", _NAME.sub("-", text)).strip("-")[:limit].rstrip("-")
    if not name:
        raise RemoteError(f"{text!r} gives no usable SageMaker resource name: pass --endpoint-name")
    return name


def _finished_run(dep: Deployment, ref: str) -> tuple[dict, dict]:
    """(the execution's output, the execution) of a succeeded run."""
    execution = find_execution(dep.client("stepfunctions"), dep.state_machine_arn, ref)
    if execution["status"] != "SUCCEEDED":
        raise RemoteError(f"execution {execution['name']} is {execution['status']}: only a finished run has a model "
                          "to deploy (`spotrun status` shows where it is)")
    output = json.loads(execution["output"])
    if not output.get("model_package_arn"):
        raise RemoteError(f"execution {execution['name']} registered no model package")
    return output, execution


def approve(args: argparse.Namespace) -> dict:
    dep = deployment(args.stage, args.stack, args.region)
    output, execution = _finished_run(dep, args.run)
    arn = output["model_package_arn"]
    dep.client("sagemaker").update_model_package(ModelPackageArn=arn, ModelApprovalStatus="Approved",
                                                 ApprovalDescription=f"approved with spotrun approve "
                                                 f"({execution['name']})")
    return {"execution": execution["name"], "model_package_arn": arn, "approval": "Approved"}


def container_for(package: dict, job: dict, *, merged: bool) -> dict:
    """The model's container: from the package (full model) or its image with the base and the adapter (LoRA)."""
    spec = package["InferenceSpecification"]["Containers"][0]
    method = parse(job.get("HyperParameters", {})).training.method  # the trainer's own reading
    if method != "lora":
        return {"ModelPackageName": package["ModelPackageArn"]}
    if merged:
        return {"Image": spec["Image"], "ModelDataUrl": spec["ModelDataUrl"],
                "Environment": {"HF_MODEL_ID": f"/opt/ml/model/{MERGED_DIR}"}}
    base = job["HyperParameters"].get("model.source", "")
    if not base.startswith("s3://"):
        raise RemoteError(f"training job {job['TrainingJobName']} is a LoRA run without an S3 base model "
                          f"(model.source={show(base)}): deploy its merged export with --merged")
    return {"Image": spec["Image"],
            "ModelDataSource": {"S3DataSource": {"S3Uri": base if base.endswith("/") else base + "/",
                                                 "S3DataType": "S3Prefix", "CompressionType": "None"}},
            "AdditionalModelDataSources": [{"ChannelName": ADAPTER_CHANNEL, "S3DataSource": {
                "S3Uri": spec["ModelDataUrl"], "S3DataType": "S3Object", "CompressionType": "Gzip"}}],
            "Environment": {"HF_MODEL_ID": "/opt/ml/model", "LORA_ADAPTERS": f"{ADAPTER_CHANNEL}={ADAPTER_DIR}"}}


def _exists(call, **kwargs) -> bool:
    try:
        call(**kwargs)
        return True
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("ValidationException", "ResourceNotFound"):
            return False
        raise


def serving_role_arn(dep: Deployment) -> str:
    """The stack's serving role (the role every endpoint model of the stage runs with)."""
    key = StackOutput.SERVING_ROLE_ARN.value
    if key not in dep.outputs:
        raise RemoteError(f"stack {dep.stack} has no {key} output: it was deployed by an older spotrun; "
                          "`cdk deploy` this version to deploy models")
    return dep.outputs[key]


def deploy(args: argparse.Namespace) -> dict:
    dep = deployment(args.stage, args.stack, args.region)
    role_arn = serving_role_arn(dep)
    output, execution = _finished_run(dep, args.run)
    sm = dep.client("sagemaker")
    package = sm.describe_model_package(ModelPackageName=output["model_package_arn"])
    if package["ModelApprovalStatus"] != "Approved":
        raise RemoteError(f"the run's model package is {package['ModelApprovalStatus']}: review it, then "
                          f"`spotrun approve {args.run} --stage {args.stage}`")
    job = sm.describe_training_job(TrainingJobName=output["report"]["job_name"])
    endpoint = resource_name(args.endpoint_name or output["report"]["run"])
    if _exists(sm.describe_endpoint, EndpointName=endpoint):
        raise RemoteError(f"endpoint {endpoint} exists: `spotrun undeploy {endpoint} --stage {args.stage}` first, or "
                          "choose another --endpoint-name")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = f"{resource_name(endpoint, 63 - len(stamp) - 1)}-{stamp}"
    tags = [{"Key": "project", "Value": "spotrun"}, {"Key": "run", "Value": output["report"]["run"][:256]},
            {"Key": "stage", "Value": args.stage}]
    sm.create_model(ModelName=name, ExecutionRoleArn=role_arn,
                    PrimaryContainer=container_for(package, job, merged=args.merged), Tags=tags)
    sm.create_endpoint_config(EndpointConfigName=name, Tags=tags, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": args.instance_type,
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=name, Tags=tags)
    return {"endpoint": endpoint, "endpoint_config": name, "model": name, "instance_type": args.instance_type,
            "method": parse(job.get("HyperParameters", {})).training.method, "execution": execution["name"],
            "invoke": f"aws sagemaker-runtime invoke-endpoint --endpoint-name {endpoint} --content-type "
                      "application/json --body '{\"inputs\": \"Hello\"}' out.json"}


def undeploy(args: argparse.Namespace) -> dict:
    """The endpoint named by the run (or --endpoint-name), its config and its models."""
    dep = deployment(args.stage, args.stack, args.region)
    sm = dep.client("sagemaker")
    endpoint = resource_name(args.endpoint_name or args.run)
    try:
        config_name = sm.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"]
    except Exception as exc:  # noqa: BLE001 - a ClientError for a missing endpoint
        raise RemoteError(f"no endpoint {endpoint} ({exc})") from None
    models: list[str] = []
    if _exists(sm.describe_endpoint_config, EndpointConfigName=config_name):
        models = [v["ModelName"] for v in sm.describe_endpoint_config(EndpointConfigName=config_name)
                  ["ProductionVariants"]]
    sm.delete_endpoint(EndpointName=endpoint)
    sm.delete_endpoint_config(EndpointConfigName=config_name)
    for model in models:
        sm.delete_model(ModelName=model)
    return {"endpoint": endpoint, "deleted": {"endpoint": endpoint, "endpoint_config": config_name,
                                              "models": models}}


def register(sub) -> None:
    p = sub.add_parser("approve", help="approve a finished run's model package (after reviewing its report)")
    p.add_argument("run", help="run name, execution name or ARN")
    common(p)
    p.set_defaults(func=lambda a: run_command(approve, a))
    p = sub.add_parser("deploy", help="a finished run's approved model to a SageMaker endpoint (LoRA: the base "
                       "model with the adapter)")
    p.add_argument("run", help="run name, execution name or ARN")
    p.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE, help=f"endpoint instance type (default "
                   f"{DEFAULT_INSTANCE_TYPE})")
    p.add_argument("--endpoint-name", help="default: the run's name")
    p.add_argument("--merged", action="store_true", help="LoRA: serve the merged export (export.merge_lora) instead "
                   "of the base model with the adapter")
    common(p)
    p.set_defaults(func=lambda a: run_command(deploy, a))
    p = sub.add_parser("undeploy", help="delete a run's endpoint, its endpoint config and its models")
    p.add_argument("run", help="the run's name (its endpoint's name)")
    p.add_argument("--endpoint-name", help="default: the run's name")
    common(p)
    p.set_defaults(func=lambda a: run_command(undeploy, a))
