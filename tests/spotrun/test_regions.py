"""Any region (issue #30 item 7): `spotrun catalog update --region R` prices a region from AWS's price list (the
Price List Query API's GetProducts), a region without prices is refused with that command, and every command that
talks to a stage does so in the stage's own region (stacks/config.py), never the AWS configuration's default.

moto has no Pricing API: the client is a real boto3 `pricing` client under botocore's Stubber, which checks each
request against botocore's service model (parameter names, types, the filter Type enum) and each response
against the model's output shape. The products are written in the shape of the price list's aws_v1 documents
(the attribute names AWS's published SageMaker price list uses: productFamily "ML Instance", regionCode,
platoinstancetype, instanceName; terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD); the prices in them are
made up for the test, not AWS's.
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from spotrun.cli.main import main
from spotrun.planner import catalog as catalog_module
from spotrun.planner.catalog import load_catalog, regional_catalog
from spotrun.planner.pricing import SERVICE_CODE, price_filters

REGION = "eu-west-1"



def _recording_clients() -> tuple[list[tuple[str, str]], object]:
    """A stand-in for boto3's Session.client that makes the real client and records (service, region) in the
    list returned beside it."""
    made: list[tuple[str, str]] = []
    real_client = boto3.session.Session.client

    def recording(self, service, *args, **kwargs):
        client = real_client(self, service, *args, **kwargs)
        made.append((service, client.meta.region_name))
        return client

    return made, recording

def _product(name: str, component: str, usd: str, region: str = REGION) -> str:
    sku = f"SKU{abs(hash((name, component))) % 10**8}"
    return json.dumps({
        "product": {"productFamily": "ML Instance", "sku": sku, "attributes": {
            "servicecode": SERVICE_CODE, "regionCode": region, "location": "EU (Ireland)", "instanceName": name,
            "instanceType": f"{name}-{component}", "platoinstancetype": component,
            "usagetype": f"EU-{'Train' if component == 'Training' else component}:{name}"}},
        "serviceCode": SERVICE_CODE, "publicationDate": "2026-11-20T00:00:00Z", "version": "20261120000000",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {"sku": sku, "offerTermCode": "JRTCKXETXF",
                                                      "effectiveDate": "2026-11-01T00:00:00Z", "termAttributes": {},
                                                      "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                                          "unit": "Hrs", "description": f"{name} {component}",
                                                          "pricePerUnit": {"USD": usd}}}}}}})


def _request(component: str, token: str | None = None) -> dict:
    params = {"ServiceCode": SERVICE_CODE, "FormatVersion": "aws_v1", "Filters": price_filters(REGION, component)}
    return {**params, "NextToken": token} if token else params


@pytest.fixture
def pricing(monkeypatch):
    """A real boto3 pricing client under Stubber, handed to the command in place of the one it makes."""
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    made = boto3.client
    monkeypatch.setattr(boto3, "client", lambda service, **kw: client if service == "pricing" else made(service, **kw))
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


def test_catalog_update_prices_a_region_from_the_price_list_and_every_command_uses_it(tmp_path, monkeypatch, capsys,
                                                                                     pricing):
    monkeypatch.setattr(catalog_module, "PRICES_DIR", tmp_path / "prices")
    run = {"version": 1, "name": "eu", "model": {"init": "random", "config": {"model_type": "gpt2", "n_embd": 64,
                                                                             "n_layer": 2, "n_head": 4}},
           "data": {"source": "s3://art-bucket/datasets/d/", "tokens": 3_000_000_000, "seq_len": 128},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert main(["estimate", "--format", "json", str(path)]) == 0  # us-east-1, the catalog's own prices
    home = json.loads(capsys.readouterr().out)["cost_usd"]["on_demand"]
    # Before: the region is refused, naming the command that prices it.
    assert main(["estimate", "--format", "json", "--region", REGION, str(path)]) == 2
    refused = json.loads(capsys.readouterr().out)
    assert refused["field"] == "region" and f"run `spotrun catalog update --region {REGION}`" in refused["message"]
    # Two pages of training products (one type the catalog lacks, one it has, priced on page two), then processing.
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "NextToken": "page-2", "PriceList": [
        _product("ml.g5.xlarge", "Training", "1.5710000000"), _product("ml.t3.medium", "Training", "0.05")]},
        _request("Training"))
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        _product("ml.p4d.24xlarge", "Training", "41.0000000000")]}, _request("Training", "page-2"))
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        _product("ml.m5.xlarge", "Processing", "0.2570000000")]}, _request("Processing"))
    assert main(["catalog", "update", "--region", REGION, "--out", str(tmp_path / "prices"), "--format", "json"]) == 0
    written = json.loads(capsys.readouterr().out)
    snapshot = json.loads((tmp_path / "prices" / f"{REGION}.json").read_text())
    assert snapshot["on_demand_usd_per_hour"] == {"ml.g5.xlarge": 1.571, "ml.p4d.24xlarge": 41.0}
    assert snapshot["processing_usd_per_hour"] == {"ml.m5.xlarge": 0.257}
    assert snapshot["as_of"] == written["as_of"] and len(snapshot["as_of"]) == 10  # the date it was read
    regional = regional_catalog(load_catalog(), REGION)
    assert set(regional["instances"]) == {"ml.g5.xlarge", "ml.p4d.24xlarge"}  # types not offered there: never chosen
    # After: the estimate prices the run in the region, from the snapshot, and says its date.
    assert main(["estimate", "--format", "json", "--region", REGION, str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cost_usd"]["on_demand"] == pytest.approx(home * 1.571 / 1.408, rel=0.01)  # the same hours
    assert any(f"in {REGION} (spotrun catalog as of {snapshot['as_of']})" in line for line in doc["checked"])


def test_two_prices_for_one_type_stop_the_update_without_writing(tmp_path, capsys, pricing):
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        _product("ml.g5.xlarge", "Training", "1.57"), _product("ml.g5.xlarge", "Training", "1.99")]},
        _request("Training"))
    assert main(["catalog", "update", "--region", REGION, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: PricingFailed: the price list gives more than one Training price for "
                          "{'ml.g5.xlarge': [1.57, 1.99]}"), err
    assert list(tmp_path.iterdir()) == []


def test_a_region_name_that_is_not_one_is_refused_before_any_request(tmp_path, capsys, pricing):
    assert main(["catalog", "update", "--region", "Ireland", "--out", str(tmp_path)]) == 2  # invalid input
    assert capsys.readouterr().err.startswith("error: InvalidArguments: --region=Ireland is invalid: expected an "
                                              "AWS region name")


def test_a_stage_in_an_unpriced_region_is_refused_at_synth_naming_the_command():
    from stacks.config import AccountConfig

    with pytest.raises(ValueError, match=r"run `spotrun catalog update --region ap-south-2` to price it"):
        AccountConfig(stage="far", account=None, region="ap-south-2", cost_center="x", monthly_budget_usd=10)


# ---- the stage's region, for every command -------------------------------------------------------------------------


STAGE_COMMANDS = [
    ["start", "RUN_FILE"], ["status", "r"], ["logs", "r"], ["report", "r"], ["cancel", "r"], ["list"],
    ["prepare", "CORPUS", "--tokenizer", "TOKENIZER", "--name", "d"], ["upload-model", "MODEL", "--name", "m"],
    ["approve", "r"], ["deploy", "r"], ["undeploy", "r"], ["validate", "RUN_FILE"], ["estimate", "RUN_FILE"],
]


@pytest.mark.parametrize("argv", STAGE_COMMANDS, ids=lambda argv: argv[0])
def test_no_command_falls_back_to_the_default_region(monkeypatch, tmp_path, capsys, assets, argv):
    """Every AWS client a command makes for `--stage dev` is in the stage's region (stacks/config.py), with the
    user's AWS configuration naming another one."""
    from stacks.config import ENVIRONMENTS

    region = next(env.region for env in ENVIRONMENTS if env.stage == "dev")
    elsewhere = "ap-southeast-2" if region != "ap-southeast-2" else "eu-west-1"
    monkeypatch.chdir(tmp_path)  # `prepare --stage` caches its shards in ./prepared
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", elsewhere)
    monkeypatch.delenv("AWS_REGION", raising=False)
    run = {"version": 1, "name": "r", "model": {"source": "s3://art-bucket/models/tiny/"},
           "data": {"source": "s3://art-bucket/datasets/d/", "seq_len": 64}, "budget": {"max_usd": 5}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    values = {"RUN_FILE": str(tmp_path / "run.json"), "CORPUS": str(assets["corpus"]),
              "TOKENIZER": str(assets["tokenizer"]), "MODEL": str(assets["model"])}
    made, recording = _recording_clients()

    with mock_aws():
        _deployed_stage(region)  # so that each command goes past finding the stage
        monkeypatch.setattr(boto3.session.Session, "client", recording)
        main([*(values.get(a, a) for a in argv), "--stage", "dev"])
    capsys.readouterr()
    assert made, "the command made no AWS client"
    assert {r for _, r in made} == {region}, made


def _deployed_stage(region: str, stage: str = "dev") -> None:
    """The `stage`'s stack in its region, with its bucket, state machine (one execution of run `r`) and outputs."""
    from spotrun.seams import PipelineSettings, StackOutput, stack_name

    s3 = boto3.client("s3", region_name=region)
    s3.create_bucket(Bucket="art-bucket", **({} if region == "us-east-1" else {
        "CreateBucketConfiguration": {"LocationConstraint": region}}))  # S3 refuses us-east-1's constraint
    sfn = boto3.client("stepfunctions", region_name=region)
    arn = sfn.create_state_machine(name="pipeline", roleArn="arn:aws:iam::123456789012:role/sfn", definition=json.dumps(
        {"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}}))["stateMachineArn"]
    sfn.start_execution(stateMachineArn=arn, name="r-20260101-000000", input="{}")
    settings = PipelineSettings(bucket="art-bucket", job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                                poll_seconds=60, project="spotrun", stage=stage, cost_center="ml-platform")
    outputs = {StackOutput.STATE_MACHINE_ARN.value: arn, StackOutput.ARTIFACT_BUCKET.value: "art-bucket",
               StackOutput.MODEL_PACKAGE_GROUP_NAME.value: "spotrun-models",
               StackOutput.ESTIMATE_SETTINGS.value: json.dumps(settings.to_env())}
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
    boto3.client("cloudformation", region_name=region).create_stack(StackName=stack_name(stage),
                                                                    TemplateBody=json.dumps(template))


def _forked_stage_region(monkeypatch, tmp_path, region: str) -> None:
    """The README's first deploy step: a fork edits stacks/config.py's region (every stage moves to `region`)."""
    import functools

    from spotrun.cli import estimate as estimate_command
    from spotrun.cli import remote

    config = tmp_path / "config.py"
    config.write_text(remote.STAGE_CONFIG.read_text().replace('region="us-east-1"', f'region="{region}"'))
    assert f'region="{region}"' in config.read_text()
    forked = functools.partial(remote.stage_region, config=config)
    monkeypatch.setattr(remote, "stage_region", forked)
    monkeypatch.setattr(estimate_command, "stage_region", forked)


def test_a_stage_in_a_priced_region_is_stocked_planned_and_started_there(tmp_path, monkeypatch, capsys, assets,
                                                                          pricing):
    """A fork deploys `dev` to eu-west-1 and prices it with `catalog update`; with the AWS configuration naming
    another region, the model and the data go to the stage's bucket, `estimate --stage` and `start` price the run
    from eu-west-1's snapshot (the estimate function's region: the stage's), and the execution starts there."""
    monkeypatch.setattr(catalog_module, "PRICES_DIR", tmp_path / "prices")
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        _product("ml.g5.xlarge", "Training", "1.5710000000"), _product("ml.p4d.24xlarge", "Training", "41.0")]},
        _request("Training"))
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        _product("ml.m5.xlarge", "Processing", "0.2570000000")]}, _request("Processing"))
    assert main(["catalog", "update", "--region", REGION, "--out", str(tmp_path / "prices"), "--format", "json"]) == 0
    as_of = json.loads(capsys.readouterr().out)["as_of"]
    _forked_stage_region(monkeypatch, tmp_path, REGION)  # loads only now that the region has prices
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-southeast-2")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.chdir(tmp_path)  # `prepare --stage` caches its shards in ./prepared
    run = {"version": 1, "name": "eu", "model": {"source": "s3://art-bucket/models/tiny/"},
           "data": {"source": "s3://art-bucket/datasets/d/", "seq_len": 64},
           "compute": {"instance_type": "ml.p4d.24xlarge"}, "budget": {"max_usd": 50}}  # dollars, not cents
    (tmp_path / "run.json").write_text(json.dumps(run))
    made, recording = _recording_clients()
    real_client = boto3.session.Session.client

    with mock_aws():
        _deployed_stage(REGION)
        monkeypatch.setattr(boto3.session.Session, "client", recording)
        assert main(["upload-model", str(assets["model"]), "--name", "tiny", "--stage", "dev"]) == 0
        assert main(["prepare", str(assets["corpus"]), "--tokenizer", str(assets["tokenizer"]), "--name", "d",
                     "--stage", "dev"]) == 0
        capsys.readouterr()
        assert main(["estimate", "--format", "json", str(tmp_path / "run.json"), "--stage", "dev"]) == 0
        staged = json.loads(capsys.readouterr().out)
        assert main(["start", str(tmp_path / "run.json"), "--stage", "dev", "--format", "json"]) == 0
        started = json.loads(capsys.readouterr().out)
        monkeypatch.setattr(boto3.session.Session, "client", real_client)
        # The same run priced in us-east-1 by the catalog's own prices (no stage: the default price region).
        assert main(["estimate", "--format", "json", str(tmp_path / "run.json")]) == 0
        home = json.loads(capsys.readouterr().out)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.list_state_machines()["stateMachines"][0]["stateMachineArn"]
        executions = [e["name"] for e in sfn.list_executions(stateMachineArn=arn)["executions"]]
    assert {r for _, r in made} == {REGION}, made
    assert started["started"] is True and started["execution"] in executions
    assert started["instance"] == "1 x ml.p4d.24xlarge"
    assert any(f"in {REGION} (spotrun catalog as of {as_of})" in line for line in staged["checked"]), staged
    ratio = 41.0 / 37.688  # the snapshot's price over the catalog's us-east-1 price of ml.p4d.24xlarge: same hours
    assert staged["cost_usd"]["on_demand"] == pytest.approx(home["cost_usd"]["on_demand"] * ratio, rel=0.01)
    assert started["estimated_cost_usd"] == pytest.approx(staged["cost_usd"], rel=0.01)


def test_a_stage_the_checkout_does_not_list_is_priced_where_its_stack_is(tmp_path, monkeypatch, capsys, pricing):
    """An installed spotrun (no stacks/config.py) or another checkout's stage: the stack is found in the AWS
    configuration's region, and `estimate --stage` prices the run there, as `start` (the stage's estimate
    settings) does, not in the CLI's default price region."""
    monkeypatch.setattr(catalog_module, "PRICES_DIR", tmp_path / "prices")
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        _product("ml.p4d.24xlarge", "Training", "41.0")]}, _request("Training"))
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, _request("Processing"))
    assert main(["catalog", "update", "--region", REGION, "--out", str(tmp_path / "prices"), "--format", "json"]) == 0
    as_of = json.loads(capsys.readouterr().out)["as_of"]
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_REGION", raising=False)
    run = {"version": 1, "name": "eu", "model": {"init": "random", "config": {"model_type": "gpt2", "n_embd": 64,
                                                                             "n_layer": 2, "n_head": 4}},
           "data": {"source": "s3://art-bucket/datasets/d/", "tokens": 3_000_000_000, "seq_len": 128},
           "compute": {"instance_type": "ml.p4d.24xlarge"}, "budget": {"max_usd": 500}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    with mock_aws():
        _deployed_stage(REGION, stage="elsewhere")  # stacks/config.py lists no such stage
        assert main(["estimate", "--format", "json", str(path), "--stage", "elsewhere"]) == 0
        staged = json.loads(capsys.readouterr().out)
        assert main(["start", str(path), "--stage", "elsewhere", "--format", "json"]) == 0
        started = json.loads(capsys.readouterr().out)
    assert any(f"in {REGION} (spotrun catalog as of {as_of})" in line for line in staged["checked"]), staged
    assert started["started"] is True and started["estimated_cost_usd"] == staged["cost_usd"]


def test_a_fork_whose_stage_is_in_an_unpriced_region_gets_one_line_from_every_stage_command(tmp_path, monkeypatch,
                                                                                              capsys):
    """The README's first deploy step edits stacks/config.py's region: a `--stage` command that loads it says what
    its checks say in one line (exit 2), not a traceback."""
    _forked_stage_region(monkeypatch, tmp_path, "eu-west-1")
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"version": 1, "name": "r", "model": {"source": "s3://b/models/m/"},
                                    "data": {"source": "s3://b/datasets/d/", "seq_len": 64},
                                    "budget": {"max_usd": 5}}))
    for argv in (["validate", str(run_file), "--stage", "dev"], ["status", "r", "--stage", "dev"]):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "--stage" in err and "run `spotrun catalog update --region eu-west-1`" in err, err
