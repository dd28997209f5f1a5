"""A hub model (`model.source` hf://org/name[@revision]) through the deployed pipeline, in moto's Step Functions
interpreter with the real handlers deciding.

The estimate answers Prepare with a fetch job (kind model); the rendered CreateModelFetchJob request (checked
against botocore's model) starts a Processing job that tests/infra/processing_sim.py runs for real here: the trainer
image's `python -m spotrun.pipeline.hub_fetch`, with huggingface_hub fetching from a loopback mirror of the hub's
API (tests/spotrun/hub_mirror.py, HF_ENDPOINT). FinishPreparation checks the copy, the estimate plans on it and the
training job reads it as its model channel. A second run with the same id: the copy is reused, no job, no request to
the hub.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from spotrun.seams import HUB_MANIFEST
from tests.infra.test_preparation import BILLED_S, RAW_RUN, prep_aws  # noqa: F401 (prep_aws: the fixture, moto with processing run for real)
from tests.infra.test_seams import request_problems
from tests.infra.test_state_machine_moto import BUCKET, REGION, RUN
from tests.spotrun.hub_mirror import HubMirror

pytestmark = pytest.mark.slow  # synthesizes the app and runs the fetch in a subprocess

HUB_RUN = {**RUN, "name": "hub-run", "model": {"source": "hf://tiny-org/tiny-llama"}}
COPY = f"s3://{BUCKET}/models/_hub/tiny-org/tiny-llama/main/"


@pytest.fixture
def hub(assets, monkeypatch):
    with HubMirror() as mirror:
        mirror.add("tiny-org/tiny-llama", Path(assets["model"]))
        monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)  # the fetch job's subprocess inherits it
        yield mirror


def test_a_hub_model_is_fetched_once_by_the_preparation_step_and_trained_from_the_stages_copy(prep_aws, hub,  # noqa: F811
                                                                                              assets):
    aws = prep_aws
    result = aws.execute("hub-1", HUB_RUN)
    assert result["status"] == "SUCCEEDED", (result, aws.ran)
    (name, request), = aws.recorded.requests.items()
    assert request_problems(request, "sagemaker", "CreateProcessingJob") == []
    # The fetch is the one job with network; spotrun.pipeline.hub_fetch in the trainer image; one instance; no inputs.
    assert request["NetworkConfig"]["EnableNetworkIsolation"] is False
    assert request["RoleArn"] == aws.hub_fetch_role_arn  # its own role: writes models/_hub/ only (test_data_access)
    assert request["AppSpecification"]["ContainerEntrypoint"][2:4] == ["spotrun.pipeline.hub_fetch",
                                                                       "hf://tiny-org/tiny-llama@main"]
    assert request["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 1
    assert request.get("ProcessingInputs", []) == []
    assert request["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"] == COPY

    # The copy: every model file with its SHA-256 and the commit the branch resolved to, fetched from the mirror.
    commit = hub.repos["tiny-org/tiny-llama"].commit
    manifest = json.loads(aws.s3.get_object(Bucket=BUCKET, Key=COPY.split(f"{BUCKET}/")[1] + HUB_MANIFEST)
                          ["Body"].read())
    assert manifest["commit"] == commit and manifest["revision"] == "main"
    here = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(assets["model"]).iterdir()
            if p.suffix in (".json", ".safetensors", ".txt", ".jinja", ".model")}
    assert {n: f["sha256"] for n, f in manifest["files"].items()} == here
    for file_name, entry in manifest["files"].items():
        body = aws.s3.get_object(Bucket=BUCKET, Key=COPY.split(f"{BUCKET}/")[1] + file_name)["Body"].read()
        assert hashlib.sha256(body).hexdigest() == entry["sha256"]

    # The training job reads the copy as its model channel; the fetch's bill is spent before its first job.
    p = aws.plan_of("hub-1")
    job = aws.sagemaker.describe_training_job(TrainingJobName=p["job_name"])
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in job["InputDataConfig"]}
    assert channels["model"] == COPY
    # An exported adapter names the hub's id of its base (from_pretrained loads it), not the stage's copy.
    assert job["HyperParameters"]["model.source"] == "tiny-org/tiny-llama"
    assert job["EnableNetworkIsolation"] is True
    assert p["spent_before_usd"] > 0 and p["max_usd"] == HUB_RUN["budget"]["max_usd"]

    # The same id again: the stage's copy is reused, no job and no request to the hub.
    asked = len(hub.requests)
    again = aws.execute("hub-2", HUB_RUN)
    assert again["status"] == "SUCCEEDED", again
    assert len(aws.recorded.requests) == 1 and len(hub.requests) == asked
    p2 = aws.plan_of("hub-2")
    assert p2["spent_before_usd"] == 0.0


def test_a_hub_id_the_hub_does_not_have_ends_the_run_with_the_hubs_reason_before_any_training(prep_aws, hub):  # noqa: F811
    aws = prep_aws
    result = aws.execute("hub-missing", {**HUB_RUN, "model": {"source": "hf://tiny-org/tiny-llama@v2"}})
    assert result["status"] == "FAILED"
    assert "no revision 'v2'" in aws.failure(result)["cause"], aws.failure(result)
    assert aws.sagemaker.list_training_jobs()["TrainingJobSummaries"] == []


def test_only_the_fetch_job_has_network_and_its_role_only_adds_files_under_models_hub(definition, template):
    from aws_cdk.assertions import Match

    states = definition["States"]
    fetch, prepare = states["CreateModelFetchJob"]["Parameters"], states["CreatePreparationJob"]["Parameters"]
    assert fetch["NetworkConfig"]["EnableNetworkIsolation"] is False
    assert prepare["NetworkConfig"]["EnableNetworkIsolation"] is True
    # GetAtt renders as the placeholder's ARN naming the logical ID: the fetch runs as its own role.
    assert "HubFetchRole" in fetch["RoleArn"] and "PreparationRole" in prepare["RoleArn"]
    choice = states["PrepareWhat"]
    assert choice["Choices"] == [{"Variable": "$.plan.preparation.kind", "StringEquals": "model",
                                  "Next": "CreateModelFetchJob"}] and choice["Default"] == "CreatePreparationJob"
    policies = template.find_resources("AWS::IAM::Policy", {"Properties": {
        "Roles": [{"Ref": Match.string_like_regexp("^HubFetchRole")}]}})
    statements = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]
    s3 = [s for s in statements if any(str(a).startswith("s3:") for a in
                                       (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))]
    assert [sorted(s["Action"]) for s in s3] == [["s3:AbortMultipartUpload", "s3:PutObject"]]
    assert json.dumps(s3[0]["Resource"]).endswith('"/models/_hub/*"]]}')


def test_a_hub_model_with_raw_data_counts_both_preparations_bills_before_the_first_job(prep_aws, hub):  # noqa: F811
    """Two preparations in one execution (the model's fetch, then the data's): the plan after the last counts both
    bills, each job's instances x its billed seconds at the catalog's processing rate (not only the latest job's)."""
    aws = prep_aws
    run = {**HUB_RUN, "name": "hub-raw", "data": RAW_RUN["data"]}
    result = aws.execute("hub-raw-1", run)
    assert result["status"] == "SUCCEEDED", (result, aws.ran)
    clusters = [r["ProcessingResources"]["ClusterConfig"] for r in aws.recorded.requests.values()]
    assert len(clusters) == 2  # the fetch, then the data's preparation
    billed = sum(BILLED_S * c["InstanceCount"] * _processing_rate_of(c["InstanceType"]) / 3600 for c in clusters)
    p = aws.plan_of("hub-raw-1")
    assert p["spent_before_usd"] == pytest.approx(billed, abs=1e-4) and p["max_usd"] == run["budget"]["max_usd"]
    guard0 = aws.functions_payloads("PipelineCostGuardFn")[0]["guard"]
    assert guard0["spent_before_usd"] == pytest.approx(billed, abs=1e-4)


def _processing_rate_of(instance_type: str) -> float:
    catalog = json.loads((Path(__file__).resolve().parents[2] / "spotrun" / "planner" / "catalog.json").read_text())
    return catalog["regions"][REGION]["processing_usd_per_hour"][instance_type]
