"""The estimate's refusals that need the deployment: what must hold before an execution creates anything.

The execution's name (it becomes a tag), the account's SageMaker service quota (Service Quotas), and
`checkpoint.resume_from`: the execution it names exists in this pipeline, ran the same run and has ended (Step
Functions), and trained the same model shape on the same data, as that execution recorded in `spotrun-run.json`
beside its checkpoints (`run_record`, `record_run`). The stage's maxima are its rules
(spotrun/pipeline/validate.py `admit`). Each refusal is a RunValidationError naming the field. Clients are passed
in; nothing here reads the environment.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from botocore.exceptions import ClientError

from ..contract.aws_text import TAG_VALUE_MAX, aws_text_ok
from ..contract.spec import RunSpec, RunValidationError
from ..contract.strict_json import show
from ..seams import RUN_RECORD

QUOTA_SERVICE = "sagemaker"


def check_execution_name(execution: str) -> None:
    """The execution's name becomes the `execution` tag of its jobs (what ties a job to its execution): refuse a
    name Step Functions accepts but a tag value does not (`retrain(2)`), rather than tag a look-alike."""
    if not execution or len(execution) > TAG_VALUE_MAX or not aws_text_ok(execution):
        raise RunValidationError("execution", execution, "an execution name of letters, digits and _.:/=+-@ only "
                                 "(it is the training jobs' `execution` tag, whose pattern allows no other "
                                 "characters); e.g. retrain-2 instead of retrain(2)")


def checkpoint_prefix(run: RunSpec, execution: str) -> str:
    """One per execution, `checkpoints/<run>/<execution>/`, or the earlier execution's that
    `checkpoint.resume_from` names."""
    return f"checkpoints/{run.name}/{run.checkpoint.resume_from or execution}/"


def run_record(run: RunSpec, model_config: dict | None, tokens: int | None, parameters: int) -> dict:
    """What makes checkpoints resumable by a later execution: the model's shape and the data."""
    shape = json.dumps(model_config or run.model.config or {}, sort_keys=True, separators=(",", ":"))
    return {"run": run.name, "method": run.training.method, "parameters": parameters,
            "model_shape_sha256": hashlib.sha256(shape.encode()).hexdigest(),
            "data_source": run.data.source, "data_tokens": tokens or run.data.tokens, "seq_len": run.data.seq_len}


def write_run_record(record: dict, s3_client: Any, bucket: str, prefix: str, execution: str) -> None:
    """Write the execution's run record once: created only where none is (`If-None-Match: *`, the condition the
    run user's policy requires, so no one who may start runs can replace another run's record). The same record
    already there (the CLI's check, then the estimate Lambda's) is this execution's; another one is refused."""
    body = json.dumps(record, indent=1).encode()
    try:
        s3_client.put_object(Bucket=bucket, Key=prefix + RUN_RECORD, Body=body, IfNoneMatch="*")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "PreconditionFailed":
            raise
        earlier = json.loads(s3_client.get_object(Bucket=bucket, Key=prefix + RUN_RECORD)["Body"].read())
        if earlier != record:
            raise RunValidationError("execution", execution,
                                     f"a new execution name: s3://{bucket}/{prefix}{RUN_RECORD} already records "
                                     f"another run ({show(earlier.get('run'))}) under this one") from None


def check_resume(record: dict, s3_client: Any, bucket: str, prefix: str, resume_from: str) -> None:
    try:
        earlier = json.loads(s3_client.get_object(Bucket=bucket, Key=prefix + RUN_RECORD)["Body"].read())
    except ClientError:
        raise RunValidationError("checkpoint.resume_from", resume_from,
                                 f"an earlier execution of run {record['run']} (nothing recorded under "
                                 f"s3://{bucket}/{prefix})") from None
    for what, keys in (("model shape", ("method", "parameters", "model_shape_sha256")),
                       ("data", ("data_source", "data_tokens", "seq_len"))):
        differ = [k for k in keys if earlier.get(k) != record[k]]
        if differ:
            raise RunValidationError("checkpoint.resume_from", resume_from,
                                     f"an execution trained on the same {what}: {differ[0]} was "
                                     f"{show(earlier.get(differ[0]))}, this run has {show(record[differ[0]])}")


def check_before_creating(run: RunSpec, quotas_client: Any, execution_status: Any, est: Any) -> None:
    """What refuses the run before anything is created for it: `checkpoint.resume_from` (Step Functions) and the
    quota (Service Quotas) for the estimate's instance type and count. Before a preparation job (`est` None) the
    same checks, so that the job bills nothing for a run they refuse: the quota then only for an explicit instance
    type. (The registry status is the contract's: spotrun/contract/spec.py `registry.approval_status`.)"""
    if run.checkpoint.resume_from is not None and execution_status is not None:
        check_resumable(run, run.checkpoint.resume_from, execution_status(run.checkpoint.resume_from))
    if quotas_client is None:
        return
    if est is not None:
        check_quota(quotas_client, est.instance_type, est.instance_count, run.compute.spot)
    elif run.compute.instance_type != "auto":
        check_quota(quotas_client, run.compute.instance_type, run.compute.instance_count or 1, run.compute.spot)


def record_run(run: RunSpec, execution: str, s3_client: Any, bucket: str, model_config: dict | None,
               tokens: int | None, parameters: int) -> str:
    """The run record beside the execution's checkpoints (`run_record`): written for a new execution; for
    `checkpoint.resume_from`, the earlier execution's must match it (`check_resume`). Returns the checkpoint
    prefix (`checkpoint_prefix`)."""
    prefix = checkpoint_prefix(run, execution)
    record = run_record(run, model_config, tokens, parameters)
    if run.checkpoint.resume_from is not None:
        if s3_client is None:
            raise RunValidationError("checkpoint.resume_from", run.checkpoint.resume_from,
                                     "nothing here: resuming needs the artifact bucket to check the earlier run")
        check_resume(record, s3_client, bucket, prefix, run.checkpoint.resume_from)
    elif s3_client is not None:
        write_run_record(record, s3_client, bucket, prefix, execution)
    return prefix


def check_resumable(run: RunSpec, name: str, found: tuple[str, str | None] | None) -> None:
    """`checkpoint.resume_from` names an execution of this pipeline, of the same run, that has ended: a running
    one still writes its checkpoints, and another run's are not this run's."""
    if found is None:
        raise RunValidationError("checkpoint.resume_from", name, f"an ended execution of run {run.name} of this "
                                 "pipeline (no execution has this name)")
    status, run_name = found
    if status == "RUNNING":
        raise RunValidationError("checkpoint.resume_from", name, "an execution that has ended (this one is still "
                                 "running and writing its checkpoints: stop it first, or wait)")
    if run_name != run.name:
        raise RunValidationError("checkpoint.resume_from", name, f"an execution of run {run.name} (this one ran "
                                 f"{show(run_name)})")


def check_quota(quotas_client: Any, instance_type: str, count: int, spot: bool) -> None:
    """Refuse a run the account's SageMaker quota cannot hold (Service Quotas; quotas are per instance type)."""
    name = f"{instance_type} for {'spot ' if spot else ''}training job usage"
    try:
        pages = list(quotas_client.get_paginator("list_service_quotas").paginate(ServiceCode=QUOTA_SERVICE))
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "NoSuchResourceException":
            return  # Service Quotas has no SageMaker quotas in this region: nothing to check against
        raise
    for page in pages:
        for quota in page.get("Quotas", []):
            if quota.get("QuotaName") == name:
                if quota.get("Value", 0) < count:
                    raise RunValidationError(
                        "compute.instance_type", instance_type,
                        f"a type with quota for {count} instance(s): the account's SageMaker quota "
                        f"\"{name}\" ({quota.get('QuotaCode')}) is {quota.get('Value', 0):g}; raise it in the "
                        f"Service Quotas console or with `aws service-quotas request-service-quota-increase "
                        f"--service-code sagemaker --quota-code {quota.get('QuotaCode')} --desired-value {count}`")
                return
    # NOTE: a quota that is not listed is not refused: Service Quotas lists only quotas that exist in the region.


def count_running(sfn: Any, state_machine_arn: str, enough: int) -> int:
    """Running executions of the state machine, counted up to `enough` (the limit + 1 decides)."""
    count = 0
    for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=state_machine_arn,
                                                               statusFilter="RUNNING"):
        count += len(page["executions"])
        if count >= enough:
            break
    return count


def execution_of(sfn: Any, state_machine_arn: str, name: str) -> tuple[str, str | None] | None:
    """(status, run name of its input) of the state machine's execution `name`; None if there is none."""
    arn = state_machine_arn.replace(":stateMachine:", ":execution:", 1) + ":" + name
    try:
        desc = sfn.describe_execution(executionArn=arn)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("ExecutionDoesNotExist", "InvalidArn"):
            return None
        raise
    try:
        run_name = json.loads(desc.get("input") or "{}").get("name")
    except (json.JSONDecodeError, AttributeError):
        run_name = None
    return desc["status"], run_name
