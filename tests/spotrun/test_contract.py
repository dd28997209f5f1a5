"""The run JSON contract: clear errors naming the field for any malformed input, never a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotrun.contract import RunValidationError, parse_run
from spotrun.planner import EstimateRefused, estimate

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


ALL_PATHS = [p for p in _paths(VALID) if p]


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


@st.composite
def malformed_runs(draw):
    raw = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(raw) if p]
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        try:
            if action == "replace":
                _set(raw, path, draw(json_values))
            elif action == "delete":
                _delete(raw, path)
            else:
                parent = raw
                for key in path[:-1]:
                    parent = parent[key]
                if isinstance(parent, dict):
                    parent[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
        except (KeyError, TypeError):
            pass  # an earlier mutation replaced a parent: this path no longer exists
    return draw(st.sampled_from([raw, raw, raw, draw(json_values)]))


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(malformed_runs())
def test_malformed_runs_get_a_validation_error_naming_a_field_never_a_traceback(raw):
    try:
        run = parse_run(raw)
    except RunValidationError as exc:
        assert exc.field and str(exc).startswith(exc.field + "=") and "expected" in str(exc)
        return
    try:  # it parsed: the estimate must still answer with a result or a named refusal
        estimate(run)
    except EstimateRefused as exc:
        assert exc.code in ("InvalidRun", "OverBudget") and exc.message
    except RunValidationError as exc:
        assert exc.field.startswith(("model.", "training."))


TYPE_CONFUSION = [
    (("name",), 42), (("name",), "has spaces"), (("version",), 2), (("version",), True),
    (("data", "seq_len"), "2048"), (("data", "seq_len"), 1), (("data", "tokens"), -5),
    (("training", "epochs"), 0), (("training", "lr"), "fast"), (("training", "micro_batch"), 1.5),
    (("training", "method"), "qlora"), (("compute", "spot"), "yes"), (("compute", "instance_count"), 0),
    (("compute", "instance_type"), "p5.48xlarge"), (("compute", "accepted_delay_hours"), -1),
    (("checkpoint", "keep"), 1), (("checkpoint", "interval_minutes"), "often"), (("budget", "max_usd"), 0),
    (("budget", "max_usd"), float("inf")), (("registry", "approval_status"), "Maybe"),
    (("registry", "model_package_group"), "bad group"), (("tags", "cost-center"), 5),
]


@pytest.mark.parametrize("path, value", TYPE_CONFUSION, ids=lambda x: ".".join(x) if isinstance(x, tuple) else repr(x))
def test_wrong_value_names_exactly_its_field(path, value):
    raw = copy.deepcopy(VALID)
    _set(raw, path, value)
    with pytest.raises(RunValidationError) as err:
        parse_run(raw)
    assert err.value.field == ".".join(path)
    assert repr(value)[:20] in str(err.value)


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
