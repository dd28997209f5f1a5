"""A user's day against moto, never typing an ARN: raw chat JSONL and a model directory in, `spotrun prepare` and
`upload-model` into the stage's bucket, `start`, `status`, `report` (the rendered state machine run by moto's
interpreter with the real handlers deciding), `approve`, `deploy` (full model and LoRA: the base with the adapter),
`undeploy`. Every SageMaker request the deploy commands send is checked against botocore's service model,
patterns matched in full."""

from __future__ import annotations

import gzip
import json
import shutil

import boto3
import botocore.session
import pytest
import regex  # the service models' patterns use \p{...} classes, which `re` lacks

from spotrun.cli.deploy import ADAPTER_DIR
from spotrun.cli.main import main
from tests.infra.people import assert_people_may
from tests.infra.test_cli_remote import cli_json, stage, wait_until  # noqa: F401 - `stage` is a fixture
from tests.infra.test_state_machine_moto import BUCKET, REGION, _finished, aws  # noqa: F401 - `aws` is a fixture

pytestmark = pytest.mark.slow
DEPLOY_CALLS = {"CreateModel", "CreateEndpointConfig", "CreateEndpoint", "DeleteEndpoint", "DeleteEndpointConfig",
                "DeleteModel", "UpdateModelPackage"}


def full_match_problems(value, shape, where: str) -> list[str]:
    """Lengths, enums and patterns (full match) of a request against its botocore shape (ParamValidator, which
    boto3 runs too, checks types and required members only)."""
    meta, out = shape.metadata, []
    if shape.type_name == "structure":
        for name, member in shape.members.items():
            if name in value:
                out += full_match_problems(value[name], member, f"{where}.{name}")
    elif shape.type_name == "list":
        out += [f"{where}: > {meta['max']} items" for _ in [1] if "max" in meta and len(value) > meta["max"]]
        for i, item in enumerate(value):
            out += full_match_problems(item, shape.member, f"{where}[{i}]")
    elif shape.type_name == "map":
        for k, v in value.items():
            out += full_match_problems(k, shape.key, f"{where} key") + full_match_problems(v, shape.value,
                                                                                           f"{where}[{k}]")
    elif shape.type_name == "string":
        if not meta.get("min", 0) <= len(value) <= meta.get("max", len(value)):
            out.append(f"{where}: length {len(value)} outside [{meta.get('min', 0)}, {meta.get('max')}]")
        if shape.enum and value not in shape.enum:
            out.append(f"{where}: {value!r} not in {shape.enum}")
        if "pattern" in meta and not regex.fullmatch(meta["pattern"], value):
            out.append(f"{where}: {value!r} does not fully match {meta['pattern']}")
    return out


@pytest.fixture
def requests(monkeypatch):
    """Every SageMaker request of the deploy commands, as the CLI's clients send it."""
    sent: list[tuple[str, dict]] = []
    session = boto3.session.Session(region_name=REGION)
    session.events.register("provide-client-params.sagemaker",
                            lambda params, model, **_: sent.append((model.name, json.loads(json.dumps(params)))))
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", session)
    return sent


def _day_inputs(tmp_path, assets):
    rows = [{"messages": [{"role": "user", "content": f"what does node {i} save?"},
                          {"role": "assistant", "content": "the node saves the weights and the optimizer."}]}
            for i in range(50)]
    raw = tmp_path / "raw" / "chat.jsonl.gz"
    raw.parent.mkdir()
    with gzip.open(raw, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    model = tmp_path / "support-base"
    shutil.copytree(assets["model"], model)
    (model / "chat_template.jinja").write_text("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
                                               "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return raw, model


def _finish_run(driver, capsys, tmp_path, name: str, data_source: str, model_source: str, **training) -> str:
    run = {"version": 1, "name": name, "model": {"source": model_source},
           "data": {"source": data_source, "seq_len": 64}, "training": training,
           "compute": {"instance_type": "ml.g5.2xlarge"}, "budget": {"max_usd": 25}, "tags": {"team": "nlp"}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(run))
    code, started = cli_json(capsys, "start", str(path), "--stage", "dev")
    assert code == 0 and started["started"], started
    done = wait_until(driver.sfn, started["execution_arn"], lambda d: d["status"] != "RUNNING", timeout=90)
    assert done["status"] == "SUCCEEDED", done
    return started["execution"]


def test_a_users_day_from_raw_chat_to_a_deployed_endpoint_without_an_arn(stage,  # noqa: F811
                                                                         tmp_path, capsys, assets,
                                                                         requests, monkeypatch, synth):
    monkeypatch.chdir(tmp_path)
    stage.progress = lambda job, poll: _finished(job, "Completed", "Completed", billable=600, training=2000)
    raw, model = _day_inputs(tmp_path, assets)

    code, prepared = cli_json(capsys, "prepare", str(raw), "--tokenizer", str(model), "--stage", "dev",
                              "--name", "support-chat")
    assert code == 0 and prepared["data_source"] == f"s3://{BUCKET}/datasets/support-chat/"
    code, uploaded = cli_json(capsys, "upload-model", str(model), "--stage", "dev")
    assert code == 0 and uploaded["model_source"] == f"s3://{BUCKET}/models/support-base/"

    execution = _finish_run(stage, capsys, tmp_path, "support-full", prepared["data_source"],
                            uploaded["model_source"])
    code, statuses = cli_json(capsys, "status", "support-full", "--stage", "dev")
    assert code == 0 and statuses[0]["state"] == "SUCCEEDED"
    code, rep = cli_json(capsys, "report", "support-full", "--stage", "dev")
    assert code == 0 and rep["execution"] == execution and rep["data_source"] == prepared["data_source"]

    assert main(["deploy", "support-full", "--stage", "dev"]) == 2  # registered PendingManualApproval
    assert "spotrun approve support-full --stage dev" in capsys.readouterr().err
    assert cli_json(capsys, "approve", "support-full", "--stage", "dev")[1]["approval"] == "Approved"
    # NOTE: moto's list of endpoint instance types stops before g5 (botocore's model has them): a g4dn here.
    code, deployed = cli_json(capsys, "deploy", "support-full", "--stage", "dev", "--instance-type", "ml.g4dn.xlarge")
    assert code == 0
    assert deployed["endpoint"] == "support-full" and deployed["method"] == "full"
    sm = stage.sagemaker
    endpoint = sm.describe_endpoint(EndpointName="support-full")
    config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    variant = config["ProductionVariants"][0]
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.g4dn.xlarge", 1)
    created = sm.describe_model(ModelName=variant["ModelName"])
    assert created["PrimaryContainer"]["ModelPackageName"] == rep["model_package_arn"]
    # The stack's serving role (its ServingRoleArn output), not the run's training role, which may not read output/.
    job = sm.describe_training_job(TrainingJobName=rep["job_name"])
    assert created["ExecutionRoleArn"] == stage.serving_role_arn != job["RoleArn"]
    assert main(["deploy", "support-full", "--stage", "dev", "--instance-type", "ml.g4dn.xlarge"]) == 2  # it exists
    assert "spotrun undeploy support-full" in capsys.readouterr().err

    code, gone = cli_json(capsys, "undeploy", "support-full", "--stage", "dev")
    assert code == 0 and gone["deleted"]["models"] == [variant["ModelName"]]
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []

    # A LoRA run of the same data: the package's serving image with the base model and the adapter.
    _finish_run(stage, capsys, tmp_path, "support-lora", prepared["data_source"], uploaded["model_source"],
                method="lora", lora={"rank": 8})
    assert cli_json(capsys, "approve", "support-lora", "--stage", "dev")[0] == 0
    code, deployed = cli_json(capsys, "deploy", "support-lora", "--stage", "dev", "--instance-type", "ml.g4dn.xlarge")
    assert code == 0 and deployed["method"] == "lora"
    lora_config = sm.describe_endpoint_config(
        EndpointConfigName=sm.describe_endpoint(EndpointName="support-lora")["EndpointConfigName"])
    container = sm.describe_model(ModelName=lora_config["ProductionVariants"][0]["ModelName"])["PrimaryContainer"]
    package = sm.describe_model_package(ModelPackageName=cli_json(capsys, "report", "support-lora", "--stage",
                                                                  "dev")[1]["model_package_arn"])
    spec = package["InferenceSpecification"]["Containers"][0]
    assert container["Image"] == spec["Image"]
    assert container["ModelDataSource"]["S3DataSource"]["S3Uri"] == uploaded["model_source"]
    adapter = container["AdditionalModelDataSources"][0]
    assert adapter["S3DataSource"]["S3Uri"] == spec["ModelDataUrl"]
    assert container["Environment"]["LORA_ADAPTERS"] == f"{adapter['ChannelName']}={ADAPTER_DIR}"
    assert sm.describe_model(ModelName=lora_config["ProductionVariants"][0]["ModelName"])["ExecutionRoleArn"] == \
        stage.serving_role_arn

    model = botocore.session.get_session().get_service_model("sagemaker")
    checked = [(name, params) for name, params in requests if name in DEPLOY_CALLS]
    assert {name for name, _ in checked} == DEPLOY_CALLS
    for name, params in checked:
        assert full_match_problems(params, model.operation_model(name).input_shape, name) == [], name
    # Every call of every command above is allowed by the person's managed policy (approve: the approver's; the
    # rest: the run user's, which cannot approve), decided by iam-simulate.
    assert_people_may(synth, stage, stage.recorder.calls)
