"""The run JSON contract: clear errors naming the field for any malformed input, never a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotrun.contract.refusal import Refusal
from spotrun.contract.spec import RunValidationError, decode_run, parse_run
from spotrun.contract.strict_json import show
from spotrun.planner.estimate import EstimateRefused, estimate

EXAMPLES = sorted(Path(__file__).resolve().parents[2].joinpath("examples", "runs").glob("*.json"))
VALID = json.loads(EXAMPLES[0].read_text())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, prefix + (key,))


def _set(obj, path, value):
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def _delete(obj, path):
    target = obj
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]


REQUIRED = [("version",), ("name",), ("model",), ("data",), ("budget",), ("data", "seq_len"), ("budget", "max_usd")]


@st.composite
def malformed_runs(draw):
    """A run that is certainly invalid: one known-bad change (a wrong value at a leaf, a required field removed,
    an unknown field added), plus up to two arbitrary mutations anywhere; or arbitrary JSON instead of a run."""
    if draw(st.integers(0, 9)) == 0:
        value = draw(json_values)
        if not isinstance(value, dict):
            return value
    raw = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(0, 2))):  # arbitrary changes first ...
        paths = [p for p in _paths(raw) if p]
        path = draw(st.sampled_from(paths))
        try:
            if draw(st.booleans()):
                _set(raw, path, draw(json_values))
            else:
                _delete(raw, path)
        except (KeyError, TypeError):
            pass  # an earlier mutation replaced a parent: this path no longer exists
    kind = draw(st.sampled_from(["confuse", "remove", "unknown"]))  # ... then one that is certainly invalid
    try:
        if kind == "confuse":
            path, value = draw(st.sampled_from(TYPE_CONFUSION))
            _set(raw, path, value)
        elif kind == "remove":
            _delete(raw, draw(st.sampled_from(REQUIRED)))
        else:
            section = draw(st.sampled_from([(), ("model",), ("data",), ("training",), ("compute",), ("budget",)]))
            target = raw
            for key in section:
                target = target[key]
            target[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in target))] = draw(json_values)
    except (KeyError, TypeError, AttributeError):
        raw["name"] = 42  # the section was already replaced by garbage: break a field that always exists
    return raw


BAD_INPUTS_SEEN = []


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(malformed_runs())
def test_malformed_runs_get_a_validation_error_naming_a_field_never_a_traceback(raw):
    with pytest.raises(RunValidationError) as err:  # any other exception fails the test
        parse_run(raw)
    assert err.value.field and str(err.value).startswith((err.value.field + "=", err.value.field + " is missing: "))
    assert "expected" in str(err.value)
    BAD_INPUTS_SEEN.append(err.value.field)


def test_the_fuzzing_covered_at_least_500_bad_inputs_across_many_fields():
    if not BAD_INPUTS_SEEN:  # run alone: drive the property test here
        test_malformed_runs_get_a_validation_error_naming_a_field_never_a_traceback()
    assert len(BAD_INPUTS_SEEN) >= 500
    assert len(set(BAD_INPUTS_SEEN)) >= 15


TYPE_CONFUSION = [
    (("name",), 42), (("name",), "has spaces"), (("version",), 2), (("version",), True),
    (("data", "seq_len"), "2048"), (("data", "seq_len"), 1), (("data", "tokens"), -5),
    (("training", "epochs"), 0), (("training", "lr"), "fast"), (("training", "micro_batch"), 1.5),
    (("training", "method"), "qlora"), (("compute", "spot"), "yes"), (("compute", "instance_count"), 0),
    (("compute", "instance_type"), "p5.48xlarge"), (("compute", "accepted_delay_hours"), -1),
    (("checkpoint", "keep"), 1), (("checkpoint", "interval_minutes"), "often"), (("budget", "max_usd"), 0),
    (("budget", "max_usd"), float("inf")), (("registry", "approval_status"), "Maybe"),
    (("registry", "model_package_group"), "bad group"), (("tags", "team"), 5),
]


@pytest.mark.parametrize("path, value", TYPE_CONFUSION, ids=lambda x: ".".join(x) if isinstance(x, tuple) else repr(x))
def test_wrong_value_names_exactly_its_field(path, value):
    raw = copy.deepcopy(VALID)
    _set(raw, path, value)
    with pytest.raises(RunValidationError) as err:
        parse_run(raw)
    assert err.value.field == ".".join(path)
    assert show(value)[:20] in str(err.value)


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.pop("budget"), "budget"),
    (lambda r: r["model"].update(parameters=5), "model"),  # two model sources at once
    (lambda r: r.update(extra=1), "extra"),
    (lambda r: r["compute"].update(gpus=8), "compute.gpus"),
    (lambda r: r["training"].update(method="lora"), "training.lora"),
    (lambda r: r.__setitem__("data", {"seq_len": 2048}), "data"),
])
def test_structural_errors_name_the_field(mutate, field):
    raw = copy.deepcopy(VALID)
    mutate(raw)
    with pytest.raises(RunValidationError) as err:
        parse_run(raw)
    assert err.value.field == field


def test_every_example_run_is_valid():
    assert len(EXAMPLES) >= 3
    for path in EXAMPLES:
        run = parse_run(json.loads(path.read_text()))
        assert run.name and run.max_usd > 0


@settings(max_examples=300, deadline=None)
@given(tokens=st.integers(1, 10**12), epochs=st.floats(0.01, 100), count=st.one_of(st.just("auto"), st.integers(1, 64)),
       spot=st.booleans(), budget=st.floats(0.01, 1e7), target=st.one_of(st.none(), st.floats(0.1, 600)),
       itype=st.sampled_from(["auto", "ml.g5.xlarge", "ml.p5.48xlarge", "ml.g6e.48xlarge"]),
       lora=st.one_of(st.none(), st.integers(1, 256)), wait=st.one_of(st.none(), st.floats(0.1, 1000)))
def test_valid_runs_always_get_an_estimate_or_a_named_refusal(tokens, epochs, count, spot, budget, target, itype,
                                                             lora, wait):
    raw = copy.deepcopy(VALID)
    raw["data"]["tokens"] = tokens
    raw["training"]["epochs"] = epochs
    if lora:
        raw["training"].update(method="lora", lora={"rank": lora})
    raw["compute"].update(instance_count=count, spot=spot, instance_type=itype)
    if target is not None:
        raw["compute"]["target_hours"] = target
    if wait is not None:
        raw["compute"]["max_wait_hours"] = wait
    raw["budget"]["max_usd"] = budget
    try:
        est = estimate(parse_run(raw))
    except Refusal as exc:  # the contract's (fewer tokens than one step) or the planner's
        assert exc.status in ("InvalidRun", "OverBudget") and exc.message
        return
    assert est.max_wait_seconds >= est.max_runtime_seconds or not spot
    assert 0 < est.max_runtime_seconds <= 28 * 24 * 3600
    assert est.cost_usd["spot" if spot else "on_demand"] <= budget + 0.005  # costs are rounded to cents


# ---- SageMaker's own limits, before launch ----------------------------------------------------------------------

RANDOM = {"version": 1, "name": "tiny", "model": {"init": "random", "config": {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 256}}, "data": {"tokens": 10**6, "seq_len": 128},
    "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 50}}


def _refused(raw) -> RunValidationError:
    with pytest.raises(RunValidationError) as err:
        parse_run(raw)
    assert "\n" not in str(err.value)
    return err.value


@pytest.mark.parametrize("mutate, field, says", [
    (lambda r: r.update(name="tiny\n"), "name", '"tiny\\n"'),  # anchored: a trailing newline is refused
    (lambda r: r.update(version=1.0), "version", "the integer 1"),
    (lambda r: r.update(tags={"project": "mine"}), "tags.project", "pipeline sets these"),
    (lambda r: r.update(tags={"Cost-Center": "x"}), "tags.Cost-Center", "pipeline sets these"),
    (lambda r: r.update(tags={"team": "a*b"}), "tags.team", "_.:/=+-@"),
    (lambda r: r.update(tags={"emoji\U0001F600": "v"}), 'tags."emoji\U0001F600"', "tag key"),
    (lambda r: r.update(tags={f"t{i}": "v" for i in range(44)}), "tags", "at most 43"),
    (lambda r: r["model"]["config"].update(pad="x" * 2500), "model.config", "this one has 2,"),
    (lambda r: r["model"].pop("init"), None, None),  # a shape alone parses (estimates); the pipeline refuses it
    (lambda r: r["model"].update(init="pretrained"), "model.source", "pretrained weights"),
    (lambda r: r["model"].update(source="s3://b-1/models/m/"), "model.source", 'no model.source with'),
    (lambda r: r["data"].update(tokens=10**16), "data.tokens", "1,000,000,000,000,000"),
    (lambda r: r.update(training={"method": "lora", "lora": {"rank": 8, "alpha": 0}}), "training.lora.alpha", "> 0"),
    (lambda r: r.update(training={"method": "lora", "lora": {"rank": 8, "dropout": 1}}), "training.lora.dropout",
     "<= 0.9"),
])
def test_sagemaker_limits_and_explicit_choices_are_checked_before_launch(mutate, field, says):
    raw = copy.deepcopy(RANDOM)
    mutate(raw)
    if field is None:
        assert parse_run(raw).model.init is None
        return
    err = _refused(raw)
    assert err.field == field and says in str(err), str(err)


def test_lora_alpha_and_dropout_are_read():
    raw = copy.deepcopy(RANDOM)
    raw["training"] = {"method": "lora",
                       "lora": {"rank": 8, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj"]}}
    lora = parse_run(raw).training.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.target_modules) == (8, 32.0, 0.05, ("q_proj",))


@pytest.mark.parametrize("data, field, says", [
    (b'{"version": 1, "name": "a", "name": "b"}', "name", "appears more than once"),
    (b'{"version": 1, "data": {"seq_len": 1, "seq_len": 2}}', "data.seq_len", "appears more than once"),
    (b'{"version": NaN}', "version", "finite number"),
    (b'{"version": 1e999}', "version", "finite number"),
    (b'{"version": ' + b"9" * 5000 + b"}", "version", "a number of at most"),
    (b"[" * 50_000 + b"]" * 50_000, "run", "nested at most"),
    ('{"name": "x"}'.encode("utf-16"), "run", "UTF-16"),
    (b'{"name": "\xff"}', "run", "byte 10 is not UTF-8"),
    (b'{"name": "\\ud800"}', "name", "lone surrogate"),
    (b'{"line\\nbreak": ' + b'"' + b"x" * 100 + b'"}', '"line\\nbreak"', "no such field"),
    (b'{"' + b"k" * 100_000 + b'": 1}', '"kkkk', "at most 256 characters"),
    (b" " * (256 * 1024 + 1), "run", "at most 262,144 bytes"),
])
def test_any_bytes_give_one_line_naming_the_field(data, field, says):
    with pytest.raises(RunValidationError) as err:
        parse_run(decode_run(data, "run.json"))
    message = str(err.value)
    assert err.value.field.startswith(field) and says in message and "\n" not in message and len(message) < 600


def test_booleans_the_count_depends_on_must_be_booleans():
    raw = copy.deepcopy(RANDOM)
    raw["model"]["config"]["tie_word_embeddings"] = "false"  # truthy: would count one embedding matrix too few
    with pytest.raises(RunValidationError) as err:
        estimate(parse_run(raw))
    assert err.value.field == "model.config.tie_word_embeddings" and "JSON boolean" in str(err.value)


def test_a_run_needing_more_than_28_days_is_refused_with_the_figure_unless_the_stop_is_accepted():
    raw = copy.deepcopy(RANDOM)
    raw["model"]["config"].update(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, vocab_size=32000)
    raw["data"]["tokens"] = 10**11
    raw["compute"] = {"instance_type": "ml.g6e.48xlarge"}
    raw["budget"]["max_usd"] = 10**7
    with pytest.raises(EstimateRefused) as err:
        estimate(parse_run(raw))
    assert err.value.field == "compute.accept_max_runtime_stop" and "days" in err.value.message
    days = float(err.value.message.split("needs about ")[1].split(" days")[0].replace(",", ""))
    assert days > 28
    raw["compute"]["accept_max_runtime_stop"] = True
    est = estimate(parse_run(raw))
    assert est.max_runtime_seconds == 28 * 24 * 3600 and any("stops it at 28 days" in w for w in est.warnings)


@pytest.mark.parametrize("minutes", [1e-9, 0.001, 0.004, 0.5, 7.25, 20])
def test_a_tiny_checkpoint_interval_reaches_the_trainer_as_planned_never_as_off(minutes):
    from spotrun.settings.wire import job_config

    raw = copy.deepcopy(RANDOM)
    raw["checkpoint"] = {"interval_minutes": minutes}
    est = estimate(parse_run(raw))
    cfg = job_config(est.hyperparameters, **{"model.config": "{}", "model.path": "/m",
                                                                    "data.path": "/d", "output_dir": "/o",
                                                                    "checkpoint.dir": "/opt/ml/checkpoints"})
    assert est.checkpoint_interval_s == max(1, round(minutes * 60))
    assert cfg.checkpoint.interval_s == est.checkpoint_interval_s > 0  # seconds end to end: exact


@pytest.mark.parametrize("field, value", [("max_wait_hours", 48), ("accepted_delay_hours", 0)])
def test_spot_only_settings_are_refused_on_an_on_demand_run_before_it_is_planned(field, value):
    """compute.spot=false with max_wait_hours or accepted_delay_hours (they size a spot job's MaxWait) was accepted
    silently; it is refused in one line naming the field, by the contract the CLI and the estimate Lambda share."""
    from spotrun.pipeline.plan import plan
    from tests.spotrun.test_handlers import RUN, SETTINGS

    raw = copy.deepcopy(RUN)
    raw["compute"].update(spot=False, **{field: value})
    with pytest.raises(RunValidationError) as refused:
        parse_run(raw)
    assert refused.value.field == f"compute.{field}"
    assert refused.value.message == f"compute.{field}={value} is invalid: expected no value with compute.spot=false " \
        "(an on-demand job has no MaxWait: it never waits for spot capacity), or compute.spot=true"
    lambda_plan = plan(raw, "exec-1", SETTINGS, started="2026-01-01T00:00:00Z")
    assert (lambda_plan["status"], lambda_plan["field"]) == ("InvalidRun", f"compute.{field}")
    raw["compute"]["spot"] = True  # with spot they size MaxWait, as before
    assert getattr(parse_run(raw).compute, field) == value
    if field == "max_wait_hours":  # null is no value (accepted_delay_hours refuses null of its own)
        raw["compute"].update(spot=False, max_wait_hours=None)
        assert parse_run(raw).compute.spot is False


@pytest.mark.parametrize("target, deadline, refused", [(20, 12, True), (12.5, 12, True), (12, 12, False),
                                                       (6, 12, False)])
def test_a_wall_time_goal_later_than_the_deadline_is_refused_naming_both(target, deadline, refused):
    """compute.target_hours picks the cheapest layout finishing within it; one later than compute.deadline_hours
    asks for a layout the deadline cannot wait for. It was accepted silently (a new user's trial); it is refused in
    one line naming both fields, by the contract the CLI and the estimate Lambda share."""
    from spotrun.pipeline.plan import plan
    from tests.spotrun.test_handlers import RUN, SETTINGS

    raw = copy.deepcopy(RUN)
    raw["compute"].update(target_hours=target, deadline_hours=deadline)
    if not refused:
        assert parse_run(raw).compute.target_hours == target
        return
    with pytest.raises(RunValidationError) as err:
        parse_run(raw)
    assert err.value.field == "compute.target_hours"
    assert "\n" not in str(err.value) and f"compute.deadline_hours={deadline}" in str(err.value)
    lambda_plan = plan(raw, "exec-1", SETTINGS, started="2026-01-01T00:00:00Z")
    assert (lambda_plan["status"], lambda_plan["field"]) == ("InvalidRun", "compute.target_hours")


@pytest.mark.parametrize("name", ["qwen2-0.5b-full-small", "mistral-7b-lora", "llama3-8b-full"])
def test_the_contract_refuses_a_seq_len_past_the_positions_its_inline_config_names(tmp_path, capsys, name):
    """An inline model.config's max_position_embeddings bounds data.seq_len in the contract itself: `spotrun
    validate` (which runs no planner) said "ok" to the Qwen example with `seq_len: 100000`, which only the estimate,
    or the training's out of memory, caught. At the limit the run is valid; one token past it, refused naming the
    field and the config's figure, as the run wrote it. Each example carries its model's figure (its Hugging Face
    config.json's)."""
    from spotrun.cli.main import main

    run = json.loads((Path(__file__).parents[2] / "examples" / "runs" / f"{name}.json").read_text())
    limit = run["model"]["config"]["max_position_embeddings"]
    assert parse_run({**run, "data": {**run["data"], "seq_len": limit}}).data.seq_len == limit
    with pytest.raises(RunValidationError) as refused:
        parse_run({**run, "data": {**run["data"], "seq_len": limit + 1}})
    assert (refused.value.field, str(refused.value)) == (
        "data.seq_len", f"data.seq_len={limit + 1} is invalid: expected at most the model's "
                        f"max_position_embeddings={limit} (model.config)"), str(refused.value)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**run, "data": {**run["data"], "seq_len": 100_000 if limit < 100_000 else limit + 1}}))
    code = main(["validate", str(path), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert (code, doc["field"]) == (2, "data.seq_len"), doc


def test_a_gpt2_shaped_inline_config_bounds_seq_len_by_its_n_positions():
    """GPT-2's config keeps its positions in n_positions: the contract reads the first of the fields a model type
    uses; a config naming none bounds nothing here (the planner reads the source's config.json)."""
    run = {"version": 1, "name": "g", "model": {"init": "random", "config": {
        "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000, "n_positions": 128}},
        "data": {"source": "s3://art-bucket/datasets/d/", "tokens": 10**6, "seq_len": 129},
        "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 5}}
    with pytest.raises(RunValidationError, match=r"at most the model's n_positions=128 \(model.config\)"):
        parse_run(run)
    del run["model"]["config"]["n_positions"]
    assert parse_run(run).data.seq_len == 129
