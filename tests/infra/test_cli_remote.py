"""`spotrun start|status|logs|report|cancel|list` against moto: the synthesized state machine run by moto's
interpreter, the stack's real output keys in a CloudFormation stack, the trainer's real metric lines in
CloudWatch Logs. The estimate and cost-guard Lambdas cannot run in moto: their real handlers' outputs are queued
(tests/infra/test_state_machine_moto.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
import time

import boto3
import pytest

from spotrun.cli import main
from spotrun.handlers.cost_guard import decide
from spotrun.handlers.estimate import plan
from spotrun.remote import TRAINING_LOG_GROUP, stack_name
from spotrun_trainer.metrics import format_line
from tests.infra.test_state_machine_moto import BUCKET, REGION, RUN, aws, queue_lambda_results  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture
def stage(aws, synth, tmp_path, monkeypatch):  # noqa: F811 - the moto fixture imported above
    """The `dev` stack in moto's CloudFormation with the synthesized template's output keys."""
    manifest = json.loads((synth.outdir / "assembly-dev" / "manifest.json").read_text())
    names = [a["properties"].get("stackName", key) for key, a in manifest["artifacts"].items()
             if a["type"] == "aws:cloudformation:stack"]
    assert names == [stack_name("dev")]  # the name the CLI looks for is the one CDK deploys
    values = {"StateMachineArn": aws["sm_arn"], "ArtifactBucket": BUCKET, "ModelPackageGroupName": "spotrun-models"}
    outputs = {key: {"Value": values.get(key, f"placeholder-{key}")} for key in synth.template["Outputs"]}
    assert set(values) <= set(outputs)
    cfn = boto3.client("cloudformation", region_name=REGION)
    cfn.create_stack(StackName=stack_name("dev"), TemplateBody=json.dumps(
        {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}, "Outputs": outputs}))
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    return aws


def write_run(tmp_path, **changes) -> str:
    run = {**copy.deepcopy(RUN), **changes}
    path = tmp_path / f"{run['name']}.json"
    path.write_text(json.dumps(run))
    return str(path)


def cli_json(capsys, *argv) -> tuple[int, object]:
    code = main([*argv, "--format", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def wait_until(sfn, arn: str, predicate, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = sfn.describe_execution(executionArn=arn)
        if predicate(desc):
            return desc
        time.sleep(0.2)
    raise TimeoutError(arn)


def test_start_status_logs_cancel_and_list_a_running_run(stage, tmp_path, capsys, monkeypatch):
    sfn, sm = stage["sfn"], stage["sagemaker"]
    # A plan that polls slowly: the execution waits in WaitForJob while the commands look at it.
    p = plan(copy.deepcopy(RUN), "cli", dataclasses.replace(stage["settings"], poll_seconds=600),
             s3_client=stage["s3"])
    queue_lambda_results(p)

    code, started = cli_json(capsys, "start", write_run(tmp_path), "--stage", "dev")
    assert code == 0 and started["started"] is True
    assert started["execution"].startswith("moto-run-") and started["cap_usd"] == 25
    wait_until(sfn, started["execution_arn"],
               lambda d: sm.list_training_jobs()["TrainingJobSummaries"] or d["status"] != "RUNNING")

    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_group(logGroupName=TRAINING_LOG_GROUP)
    stream = f"{p['job_name']}/algo-1-1700000000"
    logs.create_log_stream(logGroupName=TRAINING_LOG_GROUP, logStreamName=stream)
    lines = ["run_start params=1000 world=1 blocks=2 start_step=0 total_steps=40 device=cuda",
             format_line(10, loss=3.25, lr=1e-4, grad_norm=0.5, tokens_per_s=900, mfu=0.3, mem_gb=2.0),
             format_line(20, loss=2.75, lr=1e-4, grad_norm=0.4, tokens_per_s=950, mfu=0.3, mem_gb=2.0)]
    now = int(time.time() * 1000)
    logs.put_log_events(logGroupName=TRAINING_LOG_GROUP, logStreamName=stream,
                        logEvents=[{"timestamp": now + i, "message": m} for i, m in enumerate(lines)])

    code, statuses = cli_json(capsys, "status", "moto-run", "--stage", "dev")
    assert code == 0 and len(statuses) == 1
    st = statuses[0]
    assert st["state"] == "RUNNING" and st["run"] == "moto-run" and st["job_name"] == p["job_name"]
    assert (st["step"], st["total_steps"], st["loss"]) == (20, 40, 2.75)
    assert st["cap_usd"] == 25 and st["spent_usd"] >= 0 and st["interruptions"] == 0
    assert cli_json(capsys, "status", "--stage", "dev")[1][0]["execution"] == started["execution"]  # the running one

    assert main(["logs", "moto-run", "--stage", "dev"]) == 0
    assert capsys.readouterr().out.splitlines() == lines

    # moto has no StopTrainingJob: with the job made InProgress, botocore still validates the request against
    # the service model before this hook answers it.
    from moto.sagemaker.models import sagemaker_backends

    sagemaker_backends["123456789012"][REGION].training_jobs[p["job_name"]].training_job_status = "InProgress"
    from types import SimpleNamespace

    stopped = []

    def stop_hook(params, **_):
        stopped.append(json.loads(params["body"])["TrainingJobName"])
        return SimpleNamespace(status_code=200), {}

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a fresh default session for this test only
    boto3.setup_default_session(region_name=REGION)
    boto3.DEFAULT_SESSION.events.register("before-call.sagemaker.StopTrainingJob", stop_hook)
    code, cancelled = cli_json(capsys, "cancel", "moto-run", "--stage", "dev")
    assert code == 0 and cancelled == {"execution": started["execution"], "execution_stopped": True,
                                       "job_stopped": True, "job_name": p["job_name"]}
    assert stopped == [p["job_name"]]
    assert sfn.describe_execution(executionArn=started["execution_arn"])["status"] == "ABORTED"
    assert main(["cancel", "moto-run", "--stage", "dev"]) == 2  # nothing left to cancel
    assert "ABORTED" in capsys.readouterr().err

    # --follow ends once the execution and the job have ended, each line printed once.
    sagemaker_backends["123456789012"][REGION].training_jobs[p["job_name"]].training_job_status = "Stopped"
    assert main(["logs", "moto-run", "--follow", "--poll-seconds", "0", "--stage", "dev"]) == 0
    assert capsys.readouterr().out.splitlines() == lines

    code, listed = cli_json(capsys, "list", "--stage", "dev")
    assert code == 0 and [(r["execution"], r["state"]) for r in listed] == [(started["execution"], "ABORTED")]


def test_start_refuses_an_invalid_run_before_anything_starts(stage, tmp_path, capsys):
    bad = write_run(tmp_path, data={"source": "s3://elsewhere/datasets/x/", "seq_len": 128})
    code, refused = cli_json(capsys, "start", bad, "--stage", "dev")
    assert code == 2 and refused["error"] == "InvalidRun" and "data.source" in refused["message"]
    poor = write_run(tmp_path, name="poor-run", budget={"max_usd": 0.01})
    assert cli_json(capsys, "start", poor, "--stage", "dev")[0] == 3
    assert stage["sfn"].list_executions(stateMachineArn=stage["sm_arn"])["executions"] == []


def test_report_of_a_finished_run_gives_billing_savings_cost_and_the_package(stage, tmp_path, capsys):
    p = plan(copy.deepcopy(RUN), "done", stage["settings"], s3_client=stage["s3"])
    guard0 = {"action": "wait", "job_name": p["job_name"], "spot": True, "spent_before_usd": 0,
              "interruptions_before": 0}
    completed = decide(p, guard0, {
        "TrainingJobStatus": "Completed", "BillableTimeInSeconds": 900, "TrainingTimeInSeconds": 3000,
        "SecondaryStatusTransitions": [{"Status": "Training"}, {"Status": "Interrupted"}, {"Status": "Training"}],
        "FinalMetricDataList": [{"MetricName": "train:loss", "Value": 2.5}],
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://{BUCKET}/output/{p['job_name']}/output/model.tar.gz"}},
        now=time.time())
    queue_lambda_results(p, completed)
    code, started = cli_json(capsys, "start", write_run(tmp_path), "--stage", "dev")
    assert code == 0
    wait_until(stage["sfn"], started["execution_arn"], lambda d: d["status"] != "RUNNING")

    code, rep = cli_json(capsys, "report", "moto-run", "--stage", "dev")
    assert code == 0
    assert (rep["billable_seconds"], rep["training_seconds"], rep["spot_savings_pct"]) == (900, 3000, 70.0)
    assert rep["interruptions"] == 1 and rep["final_loss"] == 2.5
    packages = stage["sagemaker"].list_model_packages(ModelPackageGroupName="spotrun-models")
    assert rep["model_package_arn"] == packages["ModelPackageSummaryList"][0]["ModelPackageArn"]

    assert main(["report", started["execution"], "--stage", "dev"]) == 0
    text = capsys.readouterr().out
    assert "900.0 s / 3000.0 s" in text and "spot savings 70.0%" in text and rep["model_package_arn"] in text


def test_commands_name_the_missing_stack(monkeypatch, capsys):
    from moto import mock_aws

    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        assert main(["list", "--stage", "prod"]) == 2
    assert f"stack {stack_name('prod')} not readable" in capsys.readouterr().err
