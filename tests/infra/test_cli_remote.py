"""`spotrun start|status|logs|report|cancel|list` against moto: the synthesized state machine run by moto's
interpreter with the real handlers deciding (tests/infra/test_state_machine_moto.py's Driver), the stack's real
output keys in a CloudFormation stack, the trainer's real metric lines in CloudWatch Logs."""

from __future__ import annotations

import copy
import json
import time

import boto3
import pytest

from spotrun.cli.main import main
from spotrun.cli.remote import TRAINING_LOG_GROUP
from spotrun.seams import StackOutput, stack_name
from spotrun.seams import format_metric_line as format_line
from tests.infra.people import Recorder, assert_people_may
from tests.infra.render import render
from tests.infra.test_state_machine_moto import (  # noqa: F401 - `aws` is the moto fixture
    BUCKET,
    GROUP,
    REGION,
    RUN,
    _finished,
    _running,
    aws,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def stage(aws, synth, tmp_path, monkeypatch):  # noqa: F811 - the moto fixture imported above
    """The `dev` stack in moto's CloudFormation with the synthesized template's output keys."""
    manifest = json.loads((synth.outdir / "assembly-dev" / "manifest.json").read_text())
    names = [a["properties"].get("stackName", key) for key, a in manifest["artifacts"].items()
             if a["type"] == "aws:cloudformation:stack"]
    assert names == [stack_name("dev")]  # the name the CLI looks for is the one CDK deploys
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                                "Principal": {"Service": "sagemaker.amazonaws.com"}}]})
    aws.serving_role_arn = boto3.client("iam", region_name=REGION).create_role(
        RoleName="serving-role", AssumeRolePolicyDocument=trust)["Role"]["Arn"]

    def resolve(logical: str, attr: str | None) -> str:  # the Driver's resources, and the serving role
        if logical.startswith("ServingRole") and attr == "Arn":
            return aws.serving_role_arn
        return aws.resolve(logical, attr)

    values = {StackOutput.STATE_MACHINE_ARN: aws.sm_arn, StackOutput.ARTIFACT_BUCKET: BUCKET,
              StackOutput.MODEL_PACKAGE_GROUP_NAME: GROUP,
              StackOutput.SERVING_ROLE_ARN: render(synth.template["Outputs"][StackOutput.SERVING_ROLE_ARN]["Value"],
                                                   resolve),
              # rendered from the synthesized output, as CloudFormation would with the Driver's resources
              StackOutput.ESTIMATE_SETTINGS: render(synth.template["Outputs"][StackOutput.ESTIMATE_SETTINGS]["Value"],
                                                    aws.resolve)}
    outputs = {key: {"Value": values.get(key, f"placeholder-{key}")} for key in synth.template["Outputs"]}
    assert {v.value for v in values} <= set(outputs) and set(outputs) == {o.value for o in StackOutput}
    cfn = boto3.client("cloudformation", region_name=REGION)
    cfn.create_stack(StackName=stack_name("dev"), TemplateBody=json.dumps(
        {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}, "Outputs": outputs}))
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    aws.recorder = Recorder()  # every call the commands make, for the people policies (assert_people_may)
    aws.recorder.install(monkeypatch)
    return aws


def write_run(tmp_path, **changes) -> str:
    run = {**copy.deepcopy(RUN), **changes}
    path = tmp_path / f"{run['name']}.json"
    path.write_text(json.dumps(run))
    return str(path)


def cli_output(capsys) -> str:
    """What the CLI printed, less the metric lines the real handlers print (CloudWatch's embedded metric
    format) while the Driver runs them in this process for moto's interpreter."""
    out = capsys.readouterr().out
    return "".join(line for line in out.splitlines(keepends=True) if not line.startswith('{"_aws": '))


def cli_json(capsys, *argv) -> tuple[int, object]:
    code = main([*argv, "--format", "json"])
    out = cli_output(capsys)
    return code, json.loads(out) if out.strip() else None


def wait_until(sfn, arn: str, predicate, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = sfn.describe_execution(executionArn=arn)
        if predicate(desc):
            return desc
        time.sleep(0.2)
    raise TimeoutError(arn)


def test_start_status_logs_cancel_and_list_a_running_run(stage, tmp_path, capsys, synth):
    sfn, sm = stage.sfn, stage.sagemaker
    stage.progress = lambda job, poll: _running(job)  # SageMaker reports the job training at every poll

    code, started = cli_json(capsys, "start", write_run(tmp_path), "--stage", "dev")
    assert code == 0 and started["started"] is True
    assert started["execution"].startswith("moto-run-") and started["cap_usd"] == 25
    wait_until(sfn, started["execution_arn"], lambda d: stage.polls or d["status"] != "RUNNING")
    assert sfn.describe_execution(executionArn=started["execution_arn"])["status"] == "RUNNING"
    p = {"job_name": sm.list_training_jobs()["TrainingJobSummaries"][0]["TrainingJobName"]}
    # The CLI checked the run with the stage's own settings (its EstimateSettings output): the same plan.
    assert started["job_name"] == p["job_name"]

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
    assert st["segment"] == 1 and st["segments"] == []  # the first job, none ended yet
    assert st["market"] == "spot" and st["spot_policy"] and "sentinel" not in st  # the policy the guard executes
    assert cli_json(capsys, "status", "--stage", "dev")[1][0]["execution"] == started["execution"]  # the running one

    assert main(["logs", "moto-run", "--stage", "dev"]) == 0
    assert cli_output(capsys).splitlines() == lines

    # The Driver adds moto's missing StopTrainingJob; botocore validates the request against the service model.
    code, cancelled = cli_json(capsys, "cancel", "moto-run", "--stage", "dev")
    assert code == 0 and cancelled == {"execution": started["execution"], "execution_stopped": True,
                                       "job_stopped": True, "job_name": p["job_name"]}
    assert stage.job(p["job_name"]).training_job_status == "Stopping"
    # NOTE: moto's interpreter reflects a StopExecution when its worker thread ends (asynchronously, unlike AWS),
    # so the status is read once it has left RUNNING.
    ended = wait_until(sfn, started["execution_arn"], lambda d: d["status"] != "RUNNING")
    assert ended["status"] == "ABORTED"
    assert main(["cancel", "moto-run", "--stage", "dev"]) == 2  # nothing left to cancel
    # The run user's managed policy allows every call these commands made (iam-simulate decides).
    assert_people_may(synth, stage, stage.recorder.calls)
    assert "ABORTED" in capsys.readouterr().err

    # --follow ends once the execution and the job have ended, each line printed once.
    stage.job(p["job_name"]).training_job_status = "Stopped"
    assert main(["logs", "moto-run", "--follow", "--poll-seconds", "0", "--stage", "dev"]) == 0
    assert cli_output(capsys).splitlines() == lines

    code, listed = cli_json(capsys, "list", "--stage", "dev")
    assert code == 0 and [(r["execution"], r["state"]) for r in listed] == [(started["execution"], "ABORTED")]


def test_start_refuses_an_invalid_run_before_anything_starts(stage, tmp_path, capsys):
    bad = write_run(tmp_path, data={"source": "s3://elsewhere/datasets/x/", "seq_len": 128})
    code, refused = cli_json(capsys, "start", bad, "--stage", "dev")
    assert code == 2 and refused["error"] == "InvalidRun" and "data.source" in refused["message"]
    poor = write_run(tmp_path, name="poor-run", budget={"max_usd": 0.01})
    assert cli_json(capsys, "start", poor, "--stage", "dev")[0] == 3
    assert stage.sfn.list_executions(stateMachineArn=stage.sm_arn)["executions"] == []


def test_start_accepts_raw_text_which_the_pipeline_prepares_first(stage, tmp_path, capsys):
    stage.s3.put_object(Bucket=BUCKET, Key="datasets/raw/a.jsonl", Body=b'{"text": "hello"}\n')
    stage.s3.put_object(Bucket=BUCKET, Key="models/tiny/tokenizer.json", Body=b"{}")
    raw = write_run(tmp_path, name="raw-run", data={"source": f"s3://{BUCKET}/datasets/raw/", "seq_len": 128})
    code, started = cli_json(capsys, "start", raw, "--stage", "dev")
    assert code == 0 and started["started"] is True
    assert "preparing it with 1 x ml.m5.xlarge" in started["preparation"]  # one file: one instance
    # moto's processing job "completes" having written nothing (tests/infra/test_preparation.py runs it for real):
    # the finish step refuses an empty output by name, and nothing is trained.
    done = wait_until(stage.sfn, started["execution_arn"], lambda d: d["status"] != "RUNNING", timeout=90)
    history = stage.sfn.get_execution_history(executionArn=started["execution_arn"])["events"]
    failed = [e for e in history if e["type"] == "ExecutionFailed"][0]["executionFailedEventDetails"]
    assert done["status"] == "FAILED" and failed["error"] == "PreparationFailed"
    assert "no part wrote an index.json" in failed["cause"]
    assert stage.sagemaker.list_training_jobs()["TrainingJobSummaries"] == []


def test_report_of_a_finished_run_gives_billing_savings_cost_and_the_package(stage, tmp_path, capsys):
    def progress(job, poll):  # interrupted once, then completed: billable 900 s of 3,000 s training
        job.secondary_status_transitions = [{"Status": "Training", "StartTime": job.creation_time},
                                            {"Status": "Interrupted", "StartTime": job.creation_time},
                                            {"Status": "Training", "StartTime": job.creation_time}]
        _finished(job, "Completed", "Completed", billable=900, training=3000,
                  final_metric_data_list=[{"MetricName": "train:loss", "Value": 2.5,
                                           "Timestamp": job.creation_time}])
    stage.progress = progress
    code, started = cli_json(capsys, "start", write_run(tmp_path), "--stage", "dev")
    assert code == 0
    done = wait_until(stage.sfn, started["execution_arn"], lambda d: d["status"] != "RUNNING", timeout=90)
    assert done["status"] == "SUCCEEDED", done

    code, rep = cli_json(capsys, "report", "moto-run", "--stage", "dev")
    assert code == 0
    assert (rep["billable_seconds"], rep["training_seconds"], rep["spot_savings_pct"]) == (900, 3000, 70.0)
    assert rep["interruptions"] == 1 and rep["final_loss"] == 2.5
    packages = stage.sagemaker.list_model_packages(ModelPackageGroupName=GROUP)
    assert rep["model_package_arn"] == packages["ModelPackageSummaryList"][0]["ModelPackageArn"]

    assert main(["report", started["execution"], "--stage", "dev"]) == 0
    text = cli_output(capsys)
    assert "900.0 s / 3000.0 s" in text and "spot savings 70.0%" in text and rep["model_package_arn"] in text
    assert f"segment 1        {rep['job_name']} (spot): Completed/Completed, billable 900 s" in text


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_list_refuses_a_limit_below_one_before_reading_the_stage(capsys, limit):
    """`list --limit -3` listed all but the oldest 3 runs (a Python slice), `--limit 0` none, without a word."""
    assert main(["list", "--limit", limit, "--stage", "dev"]) == 2
    assert capsys.readouterr().err == (f"error: InvalidArguments: --limit={limit} is invalid: expected a whole number "
                                       "of runs, 1 or more (default 50)\n")


def test_commands_name_the_missing_stack(monkeypatch, capsys):
    from moto import mock_aws

    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        assert main(["list", "--stage", "prod"]) == 2
    # named as every other error is (`error: InvalidInput: ...`); the line began `error: stack ...`
    assert capsys.readouterr().err.startswith(f"error: RemoteError: stack {stack_name('prod')} not readable")


def test_deploy_names_a_stack_without_a_serving_role(monkeypatch, capsys):
    from moto import mock_aws

    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():  # a stack deployed by an older spotrun: every output but the serving role
        outputs = {o.value: {"Value": f"placeholder-{o.value}"} for o in StackOutput
                   if o is not StackOutput.SERVING_ROLE_ARN}
        template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}, "Outputs": outputs}
        boto3.client("cloudformation", region_name=REGION).create_stack(StackName=stack_name("dev"),
                                                                        TemplateBody=json.dumps(template))
        assert main(["deploy", "support-full", "--stage", "dev"]) == 2
    err = capsys.readouterr().err
    assert f"stack {stack_name('dev')} has no {StackOutput.SERVING_ROLE_ARN.value} output" in err
    assert "cdk deploy" in err
