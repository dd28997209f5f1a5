"""The preparation branch, executed in moto's Step Functions interpreter with the real handlers deciding.

A run whose data.source is raw text under the stage's datasets/: the estimate answers Prepare, the rendered
CreatePreparationJob request (checked against botocore's model, full-match patterns) starts a Processing job that
tests/infra/processing_sim.py runs for real here (the trainer's own `prepare --sagemaker-processing` on two
instances, each with its share of the files), FinishPreparation merges the parts, the estimate plans on the
prepared shards with the cap less the job's bill, and the run trains, registers and reports the preparation. The
same inputs and tokenizer again: the prepared output is reused, no job.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from unittest import mock

import boto3
import pytest
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.sagemaker.models import sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse
from moto.servicequotas.responses import ServiceQuotasResponse

from spotrun.cli.remote import pipeline_state
from spotrun.handlers import cancel as cancel_handler
from spotrun.pipeline.preparation import STOP_BILL_S
from spotrun.pipeline.report import summary_text
from spotrun.seams import PREPARED_PREFIX, PreparationSettings
from tests.infra.processing_sim import RecordedRequests, run_processing_job
from tests.infra.statements import as_list
from tests.infra.test_seams import request_problems
from tests.infra.test_state_machine_moto import (
    ACCOUNT,
    BUCKET,
    GROUP,
    QUOTAS,
    REGION,
    RUN,
    Driver,
    _finished,
    _list_service_quotas,
    _stop_training_job,
)

pytestmark = pytest.mark.slow  # synthesizes the app and runs the trainer's prepare

RAW_RUN = {**RUN, "name": "raw-run", "model": {"source": f"s3://{BUCKET}/models/tok/"},
           "data": {"source": f"s3://{BUCKET}/datasets/raw-chat/", "seq_len": 64, "validation_fraction": 0.1}}
BILLED_S = 600.0  # the simulated processing job's time, per instance


class PreparingDriver(Driver):
    """The moto Driver, plus a SageMaker Processing that runs the created job for real (processing_sim)."""

    def __init__(self, synth, workdir: Path):
        super().__init__(synth)
        self.workdir, self.recorded, self.ran = workdir, RecordedRequests(), []
        self.billed_s: float | None = BILLED_S  # None: the job hangs until its MaxRuntime and a stop end it

    def invoke(self, backend, function_name, qualifier, body, headers, response_headers) -> bytes:
        payload = json.loads(body)
        if "preparation" in payload:  # the job ran between its creation and this step: as SageMaker would
            name = payload["preparation"]["job_name"]
            job = sagemaker_backends[ACCOUNT][REGION].processing_jobs[name]
            request = self.recorded.requests[name]
            billed = self.billed_s if self.billed_s is not None else \
                request["StoppingCondition"]["MaxRuntimeInSeconds"] + STOP_BILL_S
            self.ran.append(run_processing_job(self.s3, job, request, self.workdir, billed_s=billed))
        return super().invoke(backend, function_name, qualifier, body, headers, response_headers)


@pytest.fixture
def prep_aws(synth, assets, tmp_path):
    driver = PreparingDriver(synth, tmp_path / "processing")
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}), \
            mock.patch.object(LambdaSimpleBackend, "invoke", lambda backend, *a: driver.invoke(backend, *a)), \
            mock.patch.object(SageMakerResponse, "stop_training_job", _stop_training_job, create=True), \
            mock.patch.object(SageMakerResponse, "create_processing_job",
                              driver.recorded.wrap(SageMakerResponse.create_processing_job)), \
            mock.patch.object(ServiceQuotasResponse, "list_service_quotas", _list_service_quotas, create=True):
        QUOTAS[:] = [{"ServiceCode": "sagemaker", "QuotaCode": "L-00000001", "Value": 2.0,
                      "QuotaName": "ml.g5.2xlarge for spot training job usage"}]
        driver.setup()
        for path in sorted(Path(assets["model"]).iterdir()):  # the model with its tokenizer files
            driver.s3.upload_file(str(path), BUCKET, f"models/tok/{path.name}")
        lines = Path(assets["corpus"]).read_text().splitlines()
        for i, name in enumerate(("a.jsonl", "b.jsonl", "c.jsonl")):
            driver.s3.put_object(Bucket=BUCKET, Key=f"datasets/raw-chat/{name}",
                                 Body=("\n".join(lines[i::3]) + "\n").encode())
        yield driver


def _processing_rate() -> float:
    catalog = json.loads((Path(__file__).resolve().parents[2] / "spotrun" / "planner" / "catalog.json").read_text())
    return catalog["regions"][REGION]["processing_usd_per_hour"][PreparationSettings().instance_type]


def test_raw_text_is_prepared_by_a_processing_job_then_trained_and_its_cost_counts(prep_aws):
    aws = prep_aws
    result = aws.execute("raw-1", RAW_RUN)
    assert result["status"] == "SUCCEEDED", (result, aws.ran)
    # One processing job, its request valid for the real API (botocore's model, full-match patterns).
    (name, request), = aws.recorded.requests.items()
    assert request_problems(request, "sagemaker", "CreateProcessingJob") == []
    # It runs as the preparation role, the only job role that writes datasets/_prepared/ (test_data_access.py).
    assert request["RoleArn"] == aws.preparation_role_arn != aws.role_arn
    cluster = request["ProcessingResources"]["ClusterConfig"]
    assert (cluster["InstanceType"], cluster["InstanceCount"]) == ("ml.m5.xlarge", 2)
    data, tokenizer = request["ProcessingInputs"]
    assert data["S3Input"]["S3Uri"] == RAW_RUN["data"]["source"]
    assert data["S3Input"]["S3DataDistributionType"] == "ShardedByS3Key"
    assert tokenizer["S3Input"]["S3DataType"] == "ManifestFile"  # the tokenizer files, not the weights
    assert request["NetworkConfig"]["EnableNetworkIsolation"] is True
    assert request["AppSpecification"]["ContainerEntrypoint"][:5] == [
        "python", "-m", "spotrun_trainer", "prepare", "--sagemaker-processing"]
    assert all("prepared part algo-" in out for out in aws.ran[0])  # both instances ran the trainer's prepare
    # MaxRuntime: the stage's limit, and never more than the cap buys at the processing rate.
    rate = _processing_rate() * 2
    max_runtime = request["StoppingCondition"]["MaxRuntimeInSeconds"]
    assert max_runtime == min(24 * 3600, int(RAW_RUN["budget"]["max_usd"] / (rate / 3600) - 120))

    p = aws.plan_of("raw-1")
    prep = p["preparation"]
    assert prep["reused"] is False and prep["job_name"] == name
    assert prep["data_source"].startswith(f"s3://{BUCKET}/{PREPARED_PREFIX}")
    assert prep["cost_usd"] == pytest.approx(BILLED_S * rate / 3600, abs=1e-4)
    assert p["spent_before_usd"] == prep["cost_usd"] and p["max_usd"] == RAW_RUN["budget"]["max_usd"]
    # The merged index is what the estimate planned with, and what the training job reads.
    index = json.loads(aws.s3.get_object(Bucket=BUCKET, Key=prep["data_source"].split(BUCKET + "/")[1]
                                         + "index.json")["Body"].read())
    assert index["parts"] == ["algo-1", "algo-2"] and index["total_tokens"] == prep["tokens"] > 0
    job = aws.sagemaker.describe_training_job(TrainingJobName=p["job_name"])
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in job["InputDataConfig"]}
    assert channels["train"] == prep["data_source"]
    # The first job's room is the cap less the preparation's bill; the report counts and shows it.
    guard0 = aws.functions_payloads("PipelineCostGuardFn")[0]["guard"]
    assert guard0["spent_before_usd"] == prep["cost_usd"]
    output = json.loads(result["output"])
    assert output["preparation"]["cost_usd"] == prep["cost_usd"]
    assert output["report"]["cost_usd"] >= prep["cost_usd"]
    # `spotrun status` reads the plan made on the prepared shards; `spotrun report` prints the preparation.
    assert pipeline_state(aws.sfn, result["executionArn"])[0]["preparation"] == prep
    text = summary_text({**output["report"], "preparation": output["preparation"]})
    assert (f"preparation      {name} (2 x ml.m5.xlarge): 600 s, ${prep['cost_usd']:.4f} (in the cost above), "
            f"{prep['tokens']:,} tokens") in text

    # The same inputs and tokenizer: reused, no second job, nothing spent on it.
    again = aws.execute("raw-2", RAW_RUN)
    assert again["status"] == "SUCCEEDED", again
    assert len(aws.recorded.requests) == 1
    p2 = aws.plan_of("raw-2")
    assert p2["preparation"]["reused"] is True and p2["preparation"]["data_source"] == prep["data_source"]
    assert p2["spent_before_usd"] == 0.0


def test_a_preparation_job_that_fails_ends_the_run_with_its_reason_before_any_training(prep_aws):
    aws = prep_aws
    aws.s3.put_object(Bucket=BUCKET, Key="datasets/raw-bad/x.jsonl", Body=b'{"text": "fine"}\n{"no text": 1}\n')
    run = copy.deepcopy(RAW_RUN)
    run["data"] = {"source": f"s3://{BUCKET}/datasets/raw-bad/", "seq_len": 64}
    result = aws.execute("raw-bad", run)
    assert result["status"] == "FAILED"
    failure = aws.failure(result)
    assert failure["error"] == "PreparationFailed"
    assert "x.jsonl:2" in failure["cause"] and "billed" in failure["cause"]  # the file and line, and the bill
    assert aws.sagemaker.list_training_jobs()["TrainingJobSummaries"] == []
    assert aws.sagemaker.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"] == []


def test_a_cap_that_cannot_carry_the_preparation_is_refused_before_any_job(prep_aws):
    aws = prep_aws
    run = copy.deepcopy(RAW_RUN)
    run["budget"] = {"max_usd": 0.05}  # 0.05 / $0.46 per hour: 391 s of two m5.xlarge, less the stop's 120 s
    result = aws.execute("raw-poor", run)
    failure = aws.failure(result)
    assert failure["error"] == "OverBudget" and "preparation" in failure["cause"]
    assert aws.recorded.requests == {}
    assert boto3.client("sagemaker", region_name=REGION).list_processing_jobs()["ProcessingJobSummaries"] == []


def test_a_preparation_that_cannot_leave_room_for_the_training_is_refused_before_it_bills_anything(prep_aws):
    """$0.12 buys the 600 s a preparation job needs at least (two m5.xlarge at $0.46/h, and the 120 s a stop
    bills), but then nothing is left for any training job (a g5.2xlarge at $1.515/h must at least start, train a
    step and save): refused before the job, naming the training's minimum."""
    aws = prep_aws
    run = copy.deepcopy(RAW_RUN)
    run["budget"] = {"max_usd": 0.12}
    assert 0.12 / (_processing_rate() * 2 / 3600) - 120 >= 600  # the preparation alone would fit
    failure = aws.failure(aws.execute("raw-no-room", run))
    assert failure["error"] == "OverBudget" and "after the training's minimum of $" in failure["cause"]
    assert aws.recorded.requests == {}
    assert boto3.client("sagemaker", region_name=REGION).list_processing_jobs()["ProcessingJobSummaries"] == []


def test_a_hung_preparation_stopped_at_its_maxruntime_leaves_the_training_enough_to_finish(prep_aws):
    """The processing job bills its whole MaxRuntime and the stop: the training is still planned, runs and is
    registered, and the run's bill (preparation + training) stays under the cap."""
    aws = prep_aws
    aws.billed_s = None  # hangs until SageMaker stops it at MaxRuntime
    run = copy.deepcopy(RAW_RUN)
    run["budget"] = {"max_usd": 1.0}
    result = aws.execute("raw-hung", run)
    assert result["status"] == "SUCCEEDED", (result, aws.ran)
    (request,) = aws.recorded.requests.values()
    max_runtime = request["StoppingCondition"]["MaxRuntimeInSeconds"]
    rate = _processing_rate() * 2
    assert max_runtime < 24 * 3600  # the cap, not the stage's limit, sized the job
    p = aws.plan_of("raw-hung")
    assert p["preparation"]["cost_usd"] == pytest.approx((max_runtime + STOP_BILL_S) * rate / 3600, abs=1e-3)
    report = json.loads(result["output"])["report"]
    assert report["cost_usd"] <= run["budget"]["max_usd"]


def test_stopping_the_execution_during_its_preparation_stops_the_processing_job(prep_aws):
    aws = prep_aws
    aws.recorded.keep_running = True  # the job runs on: the state machine polls it
    arn = aws.start("raw-aborted", RAW_RUN)
    deadline = time.monotonic() + 60
    while not aws.recorded.requests and time.monotonic() < deadline:
        time.sleep(0.2)
    (name,) = aws.recorded.requests
    aws.sfn.stop_execution(executionArn=arn)
    desc = aws.wait(arn)
    assert desc["status"] == "ABORTED"
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "stateMachineArn": aws.sm_arn, "name": "raw-aborted",
                        "status": "ABORTED", "input": json.dumps(RAW_RUN)}}
    env = aws.functions[next(k for k in aws.functions if k.startswith("PipelineCancelFn"))]["env"]
    with mock.patch.dict(os.environ, {**env, "AWS_REGION": REGION}):
        assert cancel_handler.handler(event, None) == {"stopped": [name]}
        assert cancel_handler.handler(event, None) == {"stopped": []}  # a duplicate delivery does nothing
    assert sagemaker_backends[ACCOUNT][REGION].processing_jobs[name].processing_job_status == "Stopped"


def test_the_preparations_bill_comes_out_of_the_cap_the_training_jobs_maxruntime_is_set_from(prep_aws):
    aws = prep_aws
    run = copy.deepcopy(RAW_RUN)
    run["budget"] = {"max_usd": 1.0}

    def progress(job, poll):  # SageMaker ends the job at its MaxRuntime, billed at on-demand rates all along
        _finished(job, "Stopped", "MaxRuntimeExceeded", billable=job.stopping_condition["MaxRuntimeInSeconds"])
    aws.progress = progress
    result = aws.execute("raw-capped", run)
    failure = aws.failure(result)
    p = aws.plan_of("raw-capped")
    prep = p["preparation"]["cost_usd"]
    assert prep == pytest.approx(BILLED_S * _processing_rate() * 2 / 3600, abs=1e-4)
    # What $1 less the preparation buys at $1.515/h on-demand, less the 120 s a stop bills.
    max_runtime = aws.job(p["job_name"]).stopping_condition["MaxRuntimeInSeconds"]
    assert max_runtime == int((1.0 - prep) / (1.515 / 3600) - 120)
    billed = prep + max_runtime * 1.515 / 3600
    assert billed <= 1.0 and failure["error"] == "OverBudget"
    assert f"${billed:.2f} billed" in failure["cause"]


def test_the_processing_job_may_only_add_its_parts_and_logs_and_the_finish_step_only_touch_prepared_data(template):
    from aws_cdk.assertions import Match

    bucket_arn = {"Fn::GetAtt": ["ArtifactsBucket88671897", "Arn"]}
    # The preparation role (the job's) has write-only access under datasets/_prepared/ and the processing logs.
    template.has_resource_properties("AWS::IAM::Policy", {
        "Roles": [{"Ref": Match.string_like_regexp("^PreparationRole")}],
        "PolicyDocument": {"Statement": Match.array_with([
            {"Action": ["s3:AbortMultipartUpload", "s3:PutObject"], "Effect": "Allow",
             "Resource": {"Fn::Join": ["", [bucket_arn, f"/{PREPARED_PREFIX}*"]]}},
            Match.object_like({"Resource": {"Fn::Join": ["", Match.array_with([
                Match.string_like_regexp(":log-group:/aws/sagemaker/ProcessingJobs\\*$")])]}})])}})
    # The finish function reads and writes datasets/_prepared/ only (no delete), and describes processing jobs.
    policies = template.find_resources("AWS::IAM::Policy", {"Properties": {
        "Roles": [{"Ref": Match.string_like_regexp("^PipelinePrepareFnRole")}]}})
    statements = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]
    s3_resources = json.dumps([s["Resource"] for s in statements if any(a.startswith("s3:") for a in
                                                                        as_list(s["Action"]))])
    assert "/datasets/_prepared/*" in s3_resources and "/datasets/*" not in s3_resources
    assert not any("s3:DeleteObject" in json.dumps(s["Action"]) for s in statements)
    assert any(s["Action"] == "sagemaker:DescribeProcessingJob" for s in statements)


def test_a_run_its_quota_cannot_hold_is_refused_before_its_preparation_bills_anything(prep_aws):
    QUOTAS[0]["Value"] = 0.0  # ml.g5.2xlarge for spot training: none
    result = prep_aws.execute("raw-no-quota", RAW_RUN)
    failure = prep_aws.failure(result)
    assert failure["error"] == "InvalidRun" and "ml.g5.2xlarge for spot training job usage" in failure["cause"]
    assert prep_aws.recorded.requests == {}
