"""A new user's trial of the merged pipeline (validate, estimate, simulate; ~75 runs): what they found, each through
the CLI and, where it is a rule of the contract or the estimate, the estimate Lambda's handler.

The figures a test compares are the estimate's own, read from its output (an accepted estimate's cost row against
a refusal's), never recomputed here.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from spotrun.cli.main import main
from spotrun.handlers import estimate as estimate_handler
from spotrun.pipeline.plan import PipelineSettings

from .stage_settings import BUCKET, SETTINGS

ROOT = Path(__file__).parents[2]
RUN = {"version": 1, "name": "trial", "model": {"init": "random", "config": {
    "model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 4}},
    "data": {"source": f"s3://{BUCKET}/datasets/d1/", "tokens": 200_000_000, "seq_len": 512},
    "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 500}}


def _with(run: dict, **sections) -> dict:
    out = copy.deepcopy(run)
    for section, values in sections.items():
        out[section] = {**out.get(section, {}), **values}
    return out


def _cli(tmp_path: Path, capsys, command: str, run: dict, *flags: str) -> tuple[int, dict]:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main([command, "--format", "json", str(path), *flags])
    return code, json.loads(capsys.readouterr().out)


class _NoQuotasListed:
    """Service Quotas as moto lacks it (no list_service_quotas): a region that lists no SageMaker quota."""

    def get_paginator(self, _name):
        return self

    def paginate(self, **_kwargs):
        return [{"Quotas": []}]


def _lambda(monkeypatch, run: dict, settings: PipelineSettings = SETTINGS) -> dict:
    """The estimate Lambda's handler itself, with the stage's environment (as the construct writes it)."""
    for key, value in {**settings.to_env(), "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    real = boto3.client
    monkeypatch.setattr(estimate_handler.boto3, "client",
                        lambda name, *a, **k: _NoQuotasListed() if name == "service-quotas" else real(name, *a, **k))
    with mock_aws():
        return estimate_handler.handler({"run": run, "execution": "exec-1", "started": "2026-01-01T00:00:00Z"}, None)


def _dollars(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"\$([0-9][0-9,]*\.[0-9]+)", text)]


# ---- 2 and 3. a refusal quotes the figure the accepted estimate shows --------------------------------------------


def _accepted_cost(tmp_path, capsys, run: dict) -> tuple[float, float]:
    """The cost row's figure of the run's own market at a cap that carries it, and the smallest cap it names."""
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, doc
    market = "spot" if run["compute"].get("spot", True) else "on_demand"
    return doc["cost_usd"][market], doc["segments"]["min_cap_usd"]


def _refusals(tmp_path, capsys, monkeypatch, run: dict) -> list[str]:
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert (code, doc["error"]) == (3, "OverBudget"), doc
    out = _lambda(monkeypatch, run)
    assert out["status"] == "OverBudget", out
    return [doc["message"], out["message"]]


def test_a_spot_refusal_quotes_the_chains_cost_the_accepted_estimate_shows(tmp_path, capsys, monkeypatch):
    """Refusals quoted the layout's bare spot cost ($132.05 for llama3) where the accepted estimate shows the
    chain's ($132.88): a cap between the two was refused as 'estimated $132.05 exceeds $132.50'."""
    shown, smallest = _accepted_cost(tmp_path, capsys, RUN)
    for cap in (round(shown * 0.9, 2), round((shown + smallest) / 2, 2)):  # under the cost; between it and the least
        for message in _refusals(tmp_path, capsys, monkeypatch, _with(RUN, budget={"max_usd": cap})):
            assert f"estimated ${shown:,.2f} spot" in message or f"estimated ${shown:,.2f} (spot)" in message, message
            assert f"${smallest:,.2f}" in message, message


def test_an_on_demand_run_is_refused_on_its_on_demand_figure_naming_a_cap(tmp_path, capsys, monkeypatch):
    """`spot: false`: the cost row said on-demand $0.74, refusals 'estimated $0.62' (the layout's bare cost), a cap
    under it named no cap to set, and the chain refusal spoke of the '(spot) bill'."""
    run = _with(RUN, compute={"spot": False})
    shown, smallest = _accepted_cost(tmp_path, capsys, run)
    for cap in (round(shown * 0.5, 2), round((shown + smallest) / 2, 2)):
        for message in _refusals(tmp_path, capsys, monkeypatch, _with(run, budget={"max_usd": cap})):
            assert f"estimated ${shown:,.2f}" in message and "on-demand" in message, message
            assert "spot" not in message, message
            assert f"the smallest cap whose chain finishes is ${smallest:,.2f}" in message, message


# ---- 1. with a deadline, one cap to set ----------------------------------------------------------------------------


def test_with_a_deadline_the_estimate_names_one_cap_to_set_which_holds_when_set(tmp_path, capsys):
    """llama3 with an 11 h deadline and a $300 cap named $346.85 in the deadline warning ('lets the estimate choose
    a policy that meets it') and $383.78 as 'the cap to set' (the P95 finish cap of a policy the $300 cap left out),
    without saying which to use; set at $346.85 the run would have been warned under $383.78."""
    example = json.loads((ROOT / "examples/runs/llama3-8b-full.json").read_text())
    run = _with(example, compute={"deadline_hours": 11}, budget={"max_usd": 300})
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, doc
    deadline = [w for w in doc["warnings"] if "lets the estimate choose a policy that meets it" in w]
    assert len(deadline) == 1, doc["warnings"]
    named = _dollars(deadline[0].split("a cap of ")[1])[0]
    # the deadline warning names the cap to set; a second warning under it said it again (#26: never twice)
    assert [w for w in doc["warnings"] if f"${named:,.2f}" in w] == deadline, doc["warnings"]
    assert doc["spot_policy"]["deadline_cap_usd"] == named >= doc["spot_policy"]["p95_finish_cap_usd"], doc
    path = tmp_path / "run.json"
    assert main(["estimate", str(path)]) == 0
    summary = [line for line in capsys.readouterr().out.splitlines() if "the cap to set:" in line]
    assert len(summary) == 1 and _dollars(summary[0])[0] == named, summary
    # set: the deadline is met, no warning, and the cap to set is within it
    code, there = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": named}))
    assert code == 0 and not [w for w in there["warnings"] if "deadline" in w or "under the cap" in w], there
    assert there["spot_policy"]["p95_finish_cap_usd"] <= named and there["spot_policy"]["deadline_cap_usd"] is None


# ---- 4. the first runs a new user tries ---------------------------------------------------------------------------


def test_the_demo_run_estimated_before_make_demo_says_to_run_it(capsys):
    """examples/demo/run.json names assets/ that `make demo` builds beside its copy: before it, the estimate said
    'did you mean hf://assets/model'."""
    for command in ("validate", "estimate"):
        code = main([command, "--format", "json", str(ROOT / "examples/demo/run.json")])
        doc = json.loads(capsys.readouterr().out)
        assert (code, doc["error"], doc["field"]) == (2, "InvalidRun", "model.source"), doc
        assert "make demo" in doc["message"] and "demo-output/run.json" in doc["message"], doc["message"]
        assert "hf://" not in doc["message"], doc["message"]


def test_an_s3_uri_typo_is_quoted_as_written_not_as_a_local_path(tmp_path, capsys, monkeypatch):
    """`s3:/bucket/...` (one slash) was read as a relative path: the error showed /tmp/.../s3:/bucket/..."""
    for field, run in (("model.source", _with(RUN, model={"init": None, "source": f"s3:/{BUCKET}/models/m/"})),
                       ("data.source", _with(RUN, data={"source": f"s3:/{BUCKET}/datasets/d1/"}))):
        if run["model"].get("init") is None:
            run["model"].pop("init")
        typo = run["model"]["source"] if field == "model.source" else run["data"]["source"]
        for command in ("validate", "estimate"):
            code, doc = _cli(tmp_path, capsys, command, run)
            assert (code, doc["field"]) == (2, field), doc
            assert f'{field}="{typo}" is invalid' in doc["message"] and "s3://" in doc["message"], doc["message"]
            assert str(tmp_path) not in doc["message"], doc["message"]
        out = _lambda(monkeypatch, run)
        assert (out["status"], out["field"]) == ("InvalidRun", field) and typo in out["message"], out


def _readme_run(tmp_path: Path) -> Path:
    text = (ROOT / "README.md").read_text()
    path = tmp_path / "readme.json"
    path.write_text(text.split("## A run JSON\n\n```json\n")[1].split("```")[0])
    return path


def test_the_readmes_sample_offline_names_model_config(tmp_path, capsys):
    """The README's sample names the placeholder bucket: offline it cannot be read, and the error did not say that
    an inline model.config (as examples/runs/ give) plans without it."""
    code = main(["estimate", "--format", "json", str(_readme_run(tmp_path))])
    doc = json.loads(capsys.readouterr().out)
    assert (code, doc["field"]) == (2, "model.source") and "model.config" in doc["message"], doc


def test_the_readme_says_what_validate_does_on_its_sample(tmp_path, capsys):
    """The README said validate 'checks it against every rule the pipeline applies'; on that very run validate
    says NOT CHECKED (the split on S3 data, the deadline): the README says so now."""
    code = main(["validate", "--format", "json", str(_readme_run(tmp_path))])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["status"] == "unchecked", doc
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "every rule the pipeline applies" not in readme and "`NOT CHECKED`" in readme
    for setting in ("validation split", "deadline"):
        assert any(setting in u for u in doc["unchecked"]) and setting in readme, (setting, doc["unchecked"])


# ---- 5. no credentials: one exit code; the input before the credentials ------------------------------------------


def test_no_credentials_is_the_same_aws_error_from_every_command(tmp_path, capsys, no_aws_credentials):
    """`validate --stage` exited 2 (an 'invalid --stage'), `start` and `status` 1, for the same missing
    credentials: 1 from each (exits.py's 'an AWS error'), one message that says how to give them."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RUN))
    told = set()
    for argv in (["validate", str(path)], ["estimate", str(path)], ["start", str(path)], ["status"], ["list"]):
        code = main([*argv, "--stage", "dev", "--format", "json"])
        doc = json.loads(capsys.readouterr().out)
        assert (code, doc["error"]) == (1, "AWS"), (argv, doc)
        told.add(doc["message"])
    assert len(told) == 1 and "aws configure" in told.pop()


def test_prepare_refuses_an_empty_file_before_it_asks_for_credentials(tmp_path, capsys, no_aws_credentials):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    code = main(["prepare", str(empty), "--tokenizer", str(tmp_path / "tok"), "--stage", "dev", "--name", "d",
                 "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and "no documents" in doc["message"] and "credentials" not in doc["message"], doc


# ---- 6. wording ----------------------------------------------------------------------------------------------------


def test_a_chain_short_of_the_end_never_reads_100_percent_of_the_training(tmp_path, capsys):
    """A cap a cent under the smallest that finishes: the refusal read 'after 9 job(s) and 100% of the training',
    and then said the next job was needed."""
    example = json.loads((ROOT / "examples/runs/llama3-8b-full.json").read_text())
    _, smallest = _accepted_cost(tmp_path, capsys, example)
    code, doc = _cli(tmp_path, capsys, "estimate", _with(example, budget={"max_usd": round(smallest - 0.01, 2)}))
    assert code == 3 and "the next job needs" in doc["message"], doc
    done = re.search(r"job\(s\) and ([0-9.]+)% of the training", doc["message"])
    assert done and float(done[1]) < 100, doc["message"]


def test_argument_type_errors_are_in_the_refusals_words_and_an_unknown_flag_is_the_field(capsys):
    """`--n abc` printed argparse's 'argument --n: invalid int value: 'abc''; `--format json --bogus` had no field."""
    with pytest.raises(SystemExit) as done:
        main(["simulate", "run.json", "--n", "abc"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--n=abc is invalid: expected a whole number" in err, err
    assert "argument --n" not in err and "invalid int value" not in err, err
    with pytest.raises(SystemExit) as done:  # argparse's choices as typed, not Python's reprs ('xml', 'text')
        main(["simulate", "run.json", "--format", "xml"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--format=xml is invalid: expected one of text, json (" in err, err
    with pytest.raises(SystemExit) as done:
        main(["estimate", "--format", "json", "--bogus", "run.json"])
    doc = json.loads(capsys.readouterr().out)
    assert done.value.code == 2 and doc["field"] == "--bogus", doc


def test_a_cap_over_the_stages_maximum_is_refused_with_the_stage_and_warned_without(tmp_path, capsys, monkeypatch):
    """A $5,000,000 cap was accepted by validate and estimate without a word; the estimate Lambda refuses a cap over
    the stage's max_usd_per_run (stacks/config.py). With --stage the CLI refuses it in the Lambda's words; without,
    both commands warn (the stage is not known, the file lists the stages)."""
    from stacks.config import ENVIRONMENTS

    limit = next(env.max_usd_per_run for env in ENVIRONMENTS if env.stage == "dev")
    run = _with(RUN, budget={"max_usd": 5_000_000})
    for command in ("validate", "estimate"):
        code, doc = _cli(tmp_path, capsys, command, run)
        assert code == 0 and any("over every stage's max_usd_per_run" in w and "$5,000,000.00" in w
                                 for w in doc["warnings"]), doc
        code, doc = _cli(tmp_path, capsys, command, run, "--stage", "dev", "--bucket", BUCKET, "--group", "g")
        assert (code, doc["field"]) == (2, "budget.max_usd") and f"at most ${limit:,.2f}" in doc["message"], doc
        code, doc = _cli(tmp_path, capsys, command, _with(RUN, budget={"max_usd": limit}))
        assert not [w for w in doc.get("warnings", []) if "max_usd_per_run" in w], doc
    out = _lambda(monkeypatch, run, dataclasses.replace(SETTINGS, max_usd_per_run=limit))
    assert (out["status"], out["field"]) == ("InvalidRun", "budget.max_usd"), out
    assert f"at most ${limit:,.2f}" in out["message"], out


# ---- also ----------------------------------------------------------------------------------------------------------


def test_upload_model_without_a_stage_names_the_flag(tmp_path, capsys):
    """`upload-model DIR --format json` without --stage: an 'InvalidInput' document with no field, and in text a line
    without the error's name, unlike every other missing flag."""
    assert main(["upload-model", str(tmp_path), "--format", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["error"], doc.get("field")) == ("InvalidArguments", "--stage"), doc
    assert main(["upload-model", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: InvalidArguments: --stage is required")


def test_hyperparameters_over_createtrainingjobs_limit_win_over_the_budget(tmp_path, capsys, monkeypatch):
    """The planner checks the hyperparameters it sends against CreateTrainingJob's limits after the budget: a run
    over both was refused OverBudget (exit 3), and raising the cap only found the invalid input next. The contract
    already bounds what a run can put there, so the limit is lowered here to make the planner's check the one that
    fires (the inline model.config, as compact JSON, is over 50 characters)."""
    from spotrun.planner import outputs

    monkeypatch.setattr(outputs, "HYPERPARAMETER_VALUE_MAX", 50)
    run = _with(RUN, budget={"max_usd": 0.01})
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert (code, doc["error"], doc["field"]) == (2, "InvalidRun", "model.config"), doc
    assert "at most 50 characters" in doc["message"], doc["message"]
    out = _lambda(monkeypatch, run)
    assert (out["status"], out["field"]) == ("InvalidRun", "model.config"), out


def test_refusals_spell_values_as_the_run_file_does(tmp_path, capsys, monkeypatch):
    """Refusals printed Python's reprs of what the user wrote in JSON: `eval.keep_best=True`, `compute.spot='yes'`,
    `compute.on_demand_fallback=None`, a cap of 5000000 as `5000000.0`."""
    cases = ((_with(RUN, eval={"keep_best": True}, export={"from": "best"}, data={"validation_fraction": 0.1}),
              "eval.keep_best=true is invalid"),
             (_with(RUN, compute={"spot": "yes"}), 'compute.spot="yes" is invalid'),
             (_with(RUN, compute={"on_demand_fallback": None}), "compute.on_demand_fallback=null is invalid"))
    for run, says in cases:
        code, doc = _cli(tmp_path, capsys, "estimate", run)
        assert code == 2 and says in doc["message"], (says, doc)
        out = _lambda(monkeypatch, run)
        assert says in out["message"], (says, out)
    limited = dataclasses.replace(SETTINGS, max_usd_per_run=5000)
    out = _lambda(monkeypatch, _with(RUN, budget={"max_usd": 5_000_000}), limited)
    assert "budget.max_usd=5000000 is invalid" in out["message"], out


# ---- a second trial (main ec4faf0): strict JSON, the refusal's figures, values as written -------------------------


def _strict(text: str):
    """Parse as a strict parser does: NaN and Infinity are not JSON."""
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_an_over_budget_refusal_is_strict_json_from_the_cli_and_the_lambda(tmp_path, capsys, monkeypatch):
    """`estimate --format json` of a refusal whose chain never fits printed `"spot_cost_usd": Infinity`."""
    run = _with(RUN, budget={"max_usd": 0.001})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert main(["estimate", "--format", "json", str(path)]) == 3
    doc = _strict(capsys.readouterr().out)
    assert doc["error"] == "OverBudget" and doc["estimate"]["segments"]["fits"] is False, doc
    assert doc["estimate"]["segments"]["spot_cost_usd"] is None, doc["estimate"]["segments"]
    out = _lambda(monkeypatch, run)
    assert out["status"] == "OverBudget", out
    _strict(json.dumps(out))


def test_a_refusals_json_carries_the_figure_its_message_quotes_and_a_tiny_cap_as_given(tmp_path, capsys,
                                                                                       monkeypatch):
    """At a $0.001 cap the JSON's cost_usd.spot was 0.22 (the layout's bare cost) where the message said '$0.26
    (spot)', and the chain's advice read 'no chain of jobs fits $0.00'."""
    run = _with(RUN, budget={"max_usd": 0.001})
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 3, doc
    quoted = re.search(r"estimated \$([0-9.,]+) \(spot\)", doc["message"])
    assert quoted, doc["message"]
    assert doc["estimate"]["cost_usd"]["spot"] == pytest.approx(float(quoted.group(1).replace(",", ""))), doc
    texts = [doc["message"], *doc["estimate"]["advice"], doc["estimate"]["segments"]["line"]]
    assert not [t for t in texts if "$0.00" in t.replace("$0.001", "")], texts
    assert any("no chain of jobs fits $0.001" in t for t in texts), texts
    out = _lambda(monkeypatch, run)
    assert out["status"] == "OverBudget" and "$0.00:" not in out["message"], out


def test_a_number_where_an_integer_goes_is_quoted_as_written(tmp_path, capsys, monkeypatch):
    """`seq_len: 2048.0` was refused as 'data.seq_len=2048 is invalid: expected an integer', `tokens: 2e7` as
    'data.tokens=20000000 ... expected an integer': the refusal contradicted itself."""
    for field, written in (("seq_len", "2048.0"), ("tokens", "2e7")):
        path = tmp_path / "run.json"
        path.write_text(json.dumps(RUN).replace(f'"{field}": {RUN["data"][field]}', f'"{field}": {written}'))
        for command in ("validate", "estimate"):
            assert main([command, "--format", "json", str(path)]) == 2
            doc = _strict(capsys.readouterr().out)
            assert doc["message"].startswith(f"data.{field}={written} is invalid: expected an integer"), doc
    out = _lambda(monkeypatch, _with(RUN, data={"seq_len": 2048.0}))  # the runtime's own parse: a float
    assert out["message"].startswith("data.seq_len=2048.0 is invalid: expected an integer"), out


def test_an_empty_local_data_source_is_named_by_validate_and_estimate(tmp_path, capsys):
    """An empty directory as data.source: `validate` said ok and `estimate` blamed model.source's tokenizer."""
    (tmp_path / "empty").mkdir()
    run = _with(RUN, data={"source": "empty"})
    run["model"] = {"source": f"s3://{BUCKET}/models/m/", "config": run["model"]["config"]}
    for command in ("validate", "estimate"):
        code, doc = _cli(tmp_path, capsys, command, run)
        assert (code, doc.get("field")) == (2, "data.source"), doc
        assert "raw text files" in doc["message"] and "index.json" in doc["message"], doc


def test_a_null_section_is_refused_saying_to_leave_it_out_as_the_fields_page_says(tmp_path, capsys, monkeypatch):
    """`compute: null` was refused as 'expected an object' while the run-fields page read as if null were the same
    as leaving it out; the page and the refusal now say the same: null only where the default is null."""
    page = (ROOT / "docs" / "run-fields.md").read_text()
    assert "`null` there is refused" in " ".join(page.split()), "the page says what the contract does"
    for section in ("compute", "checkpoint"):
        run = {**copy.deepcopy(RUN), section: None}
        code, doc = _cli(tmp_path, capsys, "validate", run)
        out = _lambda(monkeypatch, run)
        for message in (doc["message"], out["message"]):
            assert message.startswith(f"{section}=null is invalid: expected an object; null is refused here: leave "
                                      "it out"), message
        assert code == 2 and out["field"] == section, (doc, out)
    code, doc = _cli(tmp_path, capsys, "validate", _with(RUN, compute={"max_wait_hours": None}))
    assert code == 0, doc  # an optional field's null is its default


def test_a_placeholder_data_source_is_named_as_model_source_is_and_one_sample_is_singular(tmp_path, capsys,
                                                                                          no_aws_credentials):
    """data.source in the examples' placeholder bucket (no data.tokens) was refused as 'NoCredentialsError', where
    model.source gets 'still names the placeholder bucket'; a one-sample step read '1 samples per step'."""
    run = copy.deepcopy(RUN)
    run["data"] = {"source": "s3://your-artifact-bucket/datasets/quick/", "seq_len": 512}
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert (code, doc["field"]) == (2, "data.source"), doc
    assert "still names the placeholder bucket your-artifact-bucket" in doc["message"], doc
    assert "NoCredentials" not in doc["message"], doc
    path = tmp_path / "one.json"
    path.write_text(json.dumps(_with(RUN, data={"tokens": 2_000_000}, training={"micro_batch": 1, "grad_accum": 1})))
    assert main(["estimate", str(path)]) == 0
    text = capsys.readouterr().out
    assert "1 sample per step" in text and "1 samples" not in text, text


def test_the_emitting_edges_refuse_a_non_finite_figure_loudly():
    """The CLI's prints and the Lambdas' answers go through strict_json.dumps / strict: an Infinity that slips in
    again is an error where it is made, not invalid JSON for the user or Step Functions."""
    from spotrun.contract.strict_json import dumps, strict

    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError):
            strict({"segments": {"spot_cost_usd": bad}})
        with pytest.raises(ValueError):
            dumps([bad])
    assert strict({"spot_cost_usd": None}) == {"spot_cost_usd": None}


def test_nan_and_infinity_are_quoted_as_json_writes_them(tmp_path, capsys, monkeypatch):
    """NaN and Infinity in a run were quoted as Python's `nan` and `inf`."""
    for value, written in ((float("nan"), "NaN"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity")):
        run = _with(RUN, budget={"max_usd": value})
        path = tmp_path / "run.json"
        path.write_text(json.dumps(run))  # Python's json writes NaN / Infinity
        assert main(["validate", "--format", "json", str(path)]) == 2
        doc = _strict(capsys.readouterr().out)
        out = _lambda(monkeypatch, run)
        for message in (doc["message"], out["message"]):
            assert message.startswith(f"budget.max_usd={written} is invalid"), message


def test_an_advisor_band_says_how_far_it_is_from_the_estimates_rate(tmp_path, capsys):
    """`simulate --band ">20%"` read as the worst case by a new user gave every policy the bill of no interruption:
    the band is a monthly share of instances reclaimed, hundreds of times calmer than the estimate's rate. The
    source line says by how much, against the estimate's rate printed by the estimate itself."""
    run = json.loads((ROOT / "examples/runs/qwen2-0.5b-full-small.json").read_text())
    code, est = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0
    code, sim = _cli(tmp_path, capsys, "simulate", run, "--band", ">20%", "--n", "20", "--no-optimum",
                     "--out", str(tmp_path / "out"))
    assert code == 0
    said = re.search(r"Advisor band >20% \(a monthly share of instances reclaimed: ([\d,]+)x fewer interruptions "
                     r"than the estimate's ([\d.]+) per job-hour\): generated: ([\d.e-]+) interruptions",
                     sim["source"])
    assert said, sim["source"]
    assert float(said[2]) == pytest.approx(est["interruptions_per_hour"], rel=0.05)
    assert int(said[1].replace(",", "")) == round(est["interruptions_per_hour"] / float(said[3]))


def test_an_on_demand_periodic_layouts_advice_prints_no_python_infinity(tmp_path, capsys):
    """A 70B on-demand run's checkpoint advice said 'x inf h between interruptions' (Python's float)."""
    run = _with(RUN, model={"init": "random", "config": {
        "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}},
        compute={"instance_type": "auto", "instance_count": "auto", "spot": False},
        data={"tokens": 20_000_000, "seq_len": 2048}, budget={"max_usd": 20000})
    code, est = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, est
    periodic = [a for a in est["advice"] if "cannot leave within the stop notice" in a]
    assert periodic and "no interruptions expected" in periodic[0]
    assert not re.search(r"\binf\b|\bnan\b", json.dumps(est).replace("Infinity", ""), re.I)
