"""`spotrun validate` / `estimate`: exit codes, what they checked, stage targets, and the sources they read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from spotrun.cli.estimate import stage_target
from spotrun.cli.exits import Exit
from spotrun.cli.main import main
from spotrun.contract.spec import RunValidationError, parse_run
from spotrun.pipeline.validate import Target
from spotrun.planner.sources import read_sources, resolve

EXIT_INVALID, EXIT_REFUSED = Exit.INVALID, Exit.REFUSED

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "runs").glob("*.json"))
CONTRACT_KEYS = {"parameters", "trainable_parameters", "training_flops", "gpu_hours", "instance_type",
                 "instance_count", "max_runtime_seconds", "max_wait_seconds", "checkpoint_bytes",
                 "notice_upload_gb_per_s", "checkpoint_interval_s", "cost_usd", "warnings"}


def test_python_m_spotrun_estimates_every_example_as_json_offline():
    env = {"PATH": "/usr/bin:/bin", "AWS_EC2_METADATA_DISABLED": "true"}  # no credentials, no network use
    res = subprocess.run([sys.executable, "-m", "spotrun", "estimate", "--format", "json", *map(str, EXAMPLES)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    docs = json.loads(res.stdout)  # one JSON document for several files
    assert [d["file"] for d in docs] == [str(p) for p in EXAMPLES]
    for doc in docs:
        assert doc["status"] == "ok" and CONTRACT_KEYS <= doc.keys()
        assert set(doc["cost_usd"]) == {"on_demand", "spot"}
        assert doc["max_wait_seconds"] >= doc["max_runtime_seconds"]
        # It says plainly what it could not check offline, and why.
        assert any("stage's rules" in n for n in doc["not_checked"])
        assert any("model.source" in n and "placeholder" in n for n in doc["not_checked"])
        assert any(n.startswith("the planner") for n in doc["checked"])


def test_text_format_is_a_readable_table_with_what_was_checked(capsys):
    assert main(["estimate", str(EXAMPLES[0])]) == 0
    out = capsys.readouterr().out
    for label in ("parameters", "GPU-hours", "instances", "MaxRuntime / MaxWait", "checkpoint", "cost",
                  "checked: ", "not checked: "):
        assert label in out


def test_help_documents_the_exit_codes(capsys):
    for argv in (["--help"], ["validate", "--help"], ["estimate", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "2 invalid input" in text and "3 refused by the planner" in text


def test_invalid_and_refused_runs_exit_with_their_own_codes_and_the_field(tmp_path, capsys):
    example = json.loads(EXAMPLES[0].read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**example, "name": "no spaces allowed"}))
    assert main(["estimate", "--format", "json", str(bad)]) == EXIT_INVALID == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "InvalidRun" and out["field"] == "name"
    poor = tmp_path / "poor.json"
    poor.write_text(json.dumps({**example, "budget": {"max_usd": 1}}))
    assert main(["estimate", "--format", "json", str(poor)]) == EXIT_REFUSED == 3
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "OverBudget" and out["field"] == "budget.max_usd" and out["estimate"]["cost_usd"]["spot"] > 1
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["estimate", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "InvalidRun: run=" in err and "valid JSON" in err  # the line, a caret under it
    # validate does not plan: the over-budget run is a valid run file.
    assert main(["validate", str(poor)]) == 0
    assert main(["validate", str(poor), str(bad)]) == 2


def test_a_run_file_that_is_not_json_is_refused_in_the_users_words(tmp_path, capsys):
    """A missing comma was refused in the decoder's words ("Expecting ',' delimiter at line 4 column 3"): now the
    file, the line and column, what is needed there, and the line with a caret under the column."""
    lines = json.dumps(json.loads(EXAMPLES[0].read_text()), indent=2).splitlines()
    assert lines[2].endswith(",")
    lines[2] = lines[2][:-1]  # the comma after the second field left out
    broken = tmp_path / "broken.json"
    broken.write_text("\n".join(lines))
    for command in ("validate", "estimate"):
        assert main([command, str(broken)]) == 2
        first, shown, caret = capsys.readouterr().err.rstrip("\n").split("\n")
        assert first.startswith(f"{broken}: InvalidRun: run=") and first.endswith(
            " is invalid: expected valid JSON: at line 4 column 3, a ',' between this and what comes before it, or '}' "
            "to end the object"), first
        assert shown.strip() == lines[3].strip() and shown[caret.index("^")] == '"' and caret.strip() == "^"
        assert main([command, "--format", "json", str(broken)]) == 2
        doc = json.loads(capsys.readouterr().out)
        assert (doc["error"], doc["field"]) == ("InvalidRun", "run"), doc  # one line, the caret in `excerpt`
        assert (doc["message"], doc["excerpt"]) == (first.removeprefix(f"{broken}: InvalidRun: "), f"{shown}\n{caret}")
        assert "Expecting" not in doc["message"] and "delimiter" not in doc["message"]
    # UTF-16 without a byte-order mark is valid UTF-8 (NUL bytes): it read as a JSON error at line 1 column 1
    wide = tmp_path / "wide.json"
    wide.write_bytes(EXAMPLES[0].read_text().encode("utf-16-le"))
    assert main(["validate", str(wide)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "UTF-16 or UTF-32 without a byte-order mark" in err, err


def test_validate_applies_the_stage_rules_given_offline(tmp_path, capsys):
    example = EXAMPLES[0].read_text()
    assert main(["validate", "--bucket", "art-bucket", "--group", "spotrun-models", str(EXAMPLES[0])]) == 2
    err = capsys.readouterr().err
    assert "data.source=" in err and "replace the placeholder your-artifact-bucket" in err
    filled = tmp_path / "filled.json"
    filled.write_text(example.replace("your-artifact-bucket", "art-bucket"))
    assert main(["validate", "--bucket", "art-bucket", "--group", "spotrun-models", str(filled)]) == 0
    out = capsys.readouterr().out
    assert "s3://art-bucket/datasets/" in out and "not checked: the sources" in out
    grouped = tmp_path / "grouped.json"  # a run that names its model package group must name the stage's
    grouped.write_text(json.dumps({**json.loads(filled.read_text()),
                                   "registry": {"model_package_group": "spotrun-models"}}))
    assert main(["validate", "--bucket", "art-bucket", "--group", "spotrun-models", str(grouped)]) == 0
    capsys.readouterr()
    assert main(["validate", "--bucket", "art-bucket", "--group", "other-group", str(grouped)]) == 2
    assert "registry.model_package_group" in capsys.readouterr().err
    assert main(["validate", "--bucket", "art-bucket", str(filled)]) == 2
    assert "--group too" in capsys.readouterr().err


def test_a_shape_alone_estimates_but_never_trains_from_random_weights_silently(tmp_path, capsys):
    raw = {"version": 1, "name": "shape-only", "model": {"config": {"model_type": "gpt2"}},
           "data": {"source": "s3://art-bucket/datasets/d/", "tokens": 10**6, "seq_len": 128},
           "budget": {"max_usd": 10}}
    path = tmp_path / "shape.json"
    path.write_text(json.dumps(raw))
    assert main(["estimate", "--format", "json", str(path)]) == 0
    assert any("estimates only" in n for n in json.loads(capsys.readouterr().out)["not_checked"])
    assert main(["validate", "--format", "json", "--bucket", "art-bucket", "--group", "g", str(path)]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["field"] == "model.init" and '"random"' in out["message"]
    raw["model"]["init"] = "random"
    path.write_text(json.dumps(raw))
    assert main(["validate", "--bucket", "art-bucket", "--group", "g", str(path)]) == 0


def test_stage_names_come_from_the_stacks_outputs():
    from botocore.stub import Stubber  # checks each request and response against botocore's service model

    cfn = boto3.client("cloudformation", region_name="us-east-1")
    with Stubber(cfn) as stub:
        stub.add_response("describe_stacks", {"Stacks": [{
            "StackName": "dev-Spotrun", "CreationTime": "2026-01-01T00:00:00Z", "StackStatus": "CREATE_COMPLETE",
            "Outputs": [{"OutputKey": "ArtifactBucket", "OutputValue": "art-bucket"},
                        {"OutputKey": "ModelPackageGroupName", "OutputValue": "team-models"}]}]},
            {"StackName": "dev-Spotrun"})
        stub.add_client_error("describe_stacks", "ValidationError", "Stack with id prod-Spotrun does not exist",
                              expected_params={"StackName": "prod-Spotrun"})
        assert stage_target("dev", "us-east-1", cfn) == Target("art-bucket", "team-models")
        with pytest.raises(RunValidationError) as err:
            stage_target("prod", "us-east-1", cfn)
        assert err.value.field == "--stage" and "--bucket and --group" in str(err.value)


def _run_with_sources(model_source: str, data_source: str):
    return parse_run({"version": 1, "name": "src", "model": {"source": model_source},
                      "data": {"source": data_source, "seq_len": 128}, "budget": {"max_usd": 10}})


def test_local_sources_give_the_exact_config_and_token_count(assets):
    config, tokens = resolve(_run_with_sources(str(assets["model"]), str(assets["data"])))
    assert config["model_type"] == "llama"
    assert tokens == json.loads((assets["data"] / "index.json").read_text())["total_tokens"]


def test_s3_sources_are_read_with_boto3():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="runs-bucket")
        s3.put_object(Bucket="runs-bucket", Key="models/tiny/config.json",
                      Body=json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}))
        s3.put_object(Bucket="runs-bucket", Key="datasets/d1/index.json", Body=json.dumps({"total_tokens": 1234}))
        run = _run_with_sources("s3://runs-bucket/models/tiny/", "s3://runs-bucket/datasets/d1")
        config, tokens = resolve(run, s3_client=s3)
        assert config["n_embd"] == 64 and tokens == 1234
        with pytest.raises(RunValidationError) as err:
            resolve(_run_with_sources("s3://runs-bucket/models/missing/", "s3://runs-bucket/datasets/d1"), s3)
        assert err.value.field == "model.source"


def test_offline_the_inline_copy_stands_in_for_an_unreadable_source_and_says_so(tmp_path):
    from botocore.stub import Stubber

    run = parse_run({"version": 1, "name": "src", "model": {"source": "s3://art-bucket/models/m/", "config": {
        "model_type": "gpt2"}}, "data": {"tokens": 10_000, "seq_len": 128}, "budget": {"max_usd": 10}})
    s3 = boto3.client("s3", region_name="us-east-1")
    with Stubber(s3) as stub:
        for _ in range(2):
            stub.add_client_error("get_object", "AccessDenied", expected_params={"Bucket": "art-bucket",
                                                                                 "Key": "models/m/config.json"})
        with pytest.raises(RunValidationError) as err:
            resolve(run, s3)  # the pipeline reads strictly
        assert err.value.field == "model.source" and "AccessDenied" in str(err.value)
        sources = read_sources(run, s3, offline=True)  # the CLI: not checked, and it says so
    assert sources.model_config is None and "planned with the inline model.config" in sources.notes[0]
    missing = _run_with_sources(str(tmp_path / "absent"), str(tmp_path))  # read and found missing: wrong
    with pytest.raises(RunValidationError) as err:
        read_sources(missing, offline=True)
    assert err.value.field == "model.source" and "config.json" in str(err.value)
    too_long = _run_with_sources("/" + "a" * 1000, str(tmp_path))  # ENAMETOOLONG: an OSError, reported
    with pytest.raises(RunValidationError) as err:
        resolve(too_long)
    assert err.value.field == "model.source"


def test_a_source_config_the_planner_cannot_count_names_the_source(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                                   "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "vocab_size": 256, "tie_word_embeddings": "false"}))
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"version": 1, "name": "src", "model": {"source": str(model)},
                               "data": {"tokens": 10**6, "seq_len": 128}, "budget": {"max_usd": 10}}))
    assert main(["estimate", "--format", "json", str(run)]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["field"] == "model.source" and "model.config.tie_word_embeddings=\"false\"" in out["message"]


def test_a_required_field_left_out_is_missing_not_null(tmp_path, capsys):
    """A run without `data` was refused as `data=null is invalid`: the user wrote no null."""
    example = json.loads(EXAMPLES[0].read_text())
    del example["data"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps(example))
    assert main(["validate", "--format", "json", str(run)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["field"], doc["message"]) == ("data", "data is missing: expected a value (this field is required)")


def test_a_source_config_that_is_not_json_says_where(tmp_path, capsys):
    """A model.source whose config.json is not JSON was `expected a valid JSON config.json`, without where: now its
    line and column, what is needed there, and the line with a caret."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{\n  "model_type": "llama",\n  "hidden_size": 64,\n}\n')
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"version": 1, "name": "src", "model": {"source": str(model)},
                               "data": {"tokens": 10**6, "seq_len": 128}, "budget": {"max_usd": 10}}))
    assert main(["estimate", str(run)]) == 2
    first, shown, caret = capsys.readouterr().err.rstrip("\n").split("\n")
    assert first.startswith(f"{run}: InvalidRun: model.source=") and first.endswith(
        "is invalid: expected a valid JSON config.json (not JSON at line 4 column 1: expected another field after the "
        "',' (JSON allows no ',' before '}'))"), first
    assert (shown.strip(), caret.strip()) == ("}", "^") and shown[caret.index("^")] == "}"


def test_estimate_prices_in_the_region_it_names_and_refuses_a_region_without_prices(capsys):
    from spotrun.planner.estimate import load_catalog

    example = str(EXAMPLES[0])
    assert main(["estimate", "--format", "json", example]) == 0
    doc = json.loads(capsys.readouterr().out)
    as_of = load_catalog()["regions"]["us-east-1"]["as_of"]
    assert f"costs at on-demand list prices in us-east-1 (spotrun catalog as of {as_of}); --region prices another " \
           "region" in doc["checked"]
    assert not any(n.startswith("not checked") for n in doc["not_checked"])  # the heading is not repeated
    # The Lambda refuses a stage in a region the catalog has no prices for; the CLI does the same, by name.
    assert main(["estimate", "--region", "eu-west-1", example]) == EXIT_INVALID
    assert 'region="eu-west-1" is invalid: expected a region the catalog has prices for: us-east-1' in \
        capsys.readouterr().err


def test_a_remote_command_without_aws_credentials_is_an_aws_failure_not_a_missing_stage(no_aws_credentials, capsys):
    from spotrun.cli.main import main

    code = main(["status", "r", "--stage", "dev"])
    err = capsys.readouterr().err
    assert code == 1, err  # exits.py: 1 is an AWS failure
    assert "credentials" in err and "cdk deploy" not in err, err


def test_status_text_prints_each_ended_job_on_its_own_line(capsys):
    """`spotrun status` printed the run's ended jobs as a Python list of dicts on one line."""
    import argparse

    from spotrun.cli.remote import run_command

    ended = [{"segment": k, "job_name": f"run-{k}", "spot": k == 1, "status": "Stopped", "billable_seconds": 600 * k,
              "cost_usd": 0.5 * k, "exact": True, "interruptions": 0} for k in (1, 2)]
    status = [{"execution": "run-e", "state": "RUNNING", "job_name": "run-3", "segment": 3, "segments": ended,
               "spent_usd": 2.0, "cap_usd": 40.0}]
    assert run_command(lambda _: status, argparse.Namespace(format="text")) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("segments           2")
    assert lines[at + 1:at + 3] == [
        "  segment=1 job_name=run-1 spot=True status=Stopped billable_seconds=600 cost_usd=0.5 exact=True "
        "interruptions=0",
        "  segment=2 job_name=run-2 spot=False status=Stopped billable_seconds=1200 cost_usd=1.0 exact=True "
        "interruptions=0"], lines
    assert lines[at + 3] == "spent_usd          2.0" and not any("[{" in line for line in lines), lines


def test_the_estimate_says_in_json_as_in_text_whether_the_guard_runs_a_sentinel(capsys):
    """The estimate's text and JSON said nothing of the sentinel (decision.py `SentinelGreedy`): both now say, for
    the chosen policy, whether the guard runs one and with what settings."""
    from spotrun.policy.choose import policy_text
    from spotrun.policy.decision import RULES, sentinel_settings
    from spotrun.seams import SpotPolicy

    example = str(EXAMPLES[0])
    assert main(["estimate", "--format", "json", example]) == 0
    section = json.loads(capsys.readouterr().out)["spot_policy"]
    assert section["sentinel"] == sentinel_settings(section["policy"]) == {"used": False}
    assert main(["estimate", example]) == 0
    assert f"  sentinel: none ({section['policy']} keeps no spot job waiting beside an on-demand job)" in \
        capsys.readouterr().out.splitlines()
    # The policy that runs one: the same settings in the section's JSON and its text, the rule's own.
    rule = RULES["probing_sentinel"]
    probing = SpotPolicy.from_json({**section, "policy": "probing_sentinel",
                                    "sentinel": sentinel_settings("probing_sentinel")})
    assert probing.to_json()["sentinel"] == {"used": True, "stint_s": rule.stint_s, "poll_s": rule.sentinel_poll_s}
    line = next(x for x in policy_text(probing).splitlines() if "sentinel:" in x)
    assert line.startswith(f"  sentinel: yes (probing_sentinel): after {rule.stint_s / 3600:.2f} h on an "
                           "on-demand job") and f"every {rule.sentinel_poll_s / 60:.0f} min" in line, line


def test_an_on_demand_estimates_json_has_no_max_wait(tmp_path, capsys):
    """The text said 'none (compute.spot=false: an on-demand job has no MaxWait)' while the JSON still gave
    max_wait_seconds; a spot run's keeps it."""
    raw = json.loads(EXAMPLES[0].read_text())
    for spot in (False, True):
        raw["compute"] = {k: v for k, v in raw["compute"].items() if k not in ("max_wait_hours",
                                                                              "accepted_delay_hours")}
        raw["compute"]["spot"] = spot
        path = tmp_path / f"spot-{spot}.json"
        path.write_text(json.dumps(raw))
        assert main(["estimate", "--format", "json", str(path)]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["spot"] is spot and ("max_wait_seconds" in doc) is spot, doc.get("max_wait_seconds")


def test_a_text_answer_prints_a_dict_field_as_json_not_a_python_repr():
    """`spotrun start`'s estimated costs and `undeploy`'s deleted names were printed as Python dicts in text
    ({'on_demand': 0.2, ...}); they are JSON, as the user writes it."""
    from spotrun.cli.remote import _text

    text = _text({"estimated_cost_usd": {"on_demand": 0.2, "spot": 0.06},
                  "deleted": {"endpoint": "support-chat", "models": ["m-1"]}})
    assert text.splitlines() == ['estimated_cost_usd {"on_demand": 0.2, "spot": 0.06}',
                                 'deleted            {"endpoint": "support-chat", "models": ["m-1"]}'], text
