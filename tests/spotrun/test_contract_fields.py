"""The run contract's declarations are the one definition: the docs' field reference (docs/run-fields.md) is generated
from them, every documented field is the one the decoder reads and refuses by name, a new field needs only its
declaration, and `tracking.mlflow_uri` accepts exactly what SageMaker's service model (botocore) accepts for a
tracking server."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import botocore.session
import pytest

from spotrun.contract.decoder import decode, reference, spec
from spotrun.contract.spec import RunSpec, RunValidationError, field_reference, parse_run
from spotrun.contract.values import MLFLOW_TRACKING_SERVER_ARN, MLFLOW_TRACKING_SERVER_NAME, MLFLOW_URI_MAX

ROOT = Path(__file__).resolve().parents[2]
RUN = {"version": 1, "name": "tiny", "model": {"init": "random", "config": {"model_type": "llama"}},
       "data": {"tokens": 10**6, "seq_len": 128, "validation_fraction": 0.1}, "budget": {"max_usd": 50},
       "training": {"method": "lora", "lora": {"rank": 8}}, "registry": {"gate": {"max_val_loss": 2.0}}}


def _set(raw: dict, path: str, value) -> dict:
    out = copy.deepcopy(raw)
    *parents, last = path.split(".")
    target = out
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return out


def _refused(raw) -> RunValidationError:
    with pytest.raises(RunValidationError) as err:
        parse_run(raw)
    return err.value


def test_the_docs_field_reference_is_generated_at_the_pages_mark():
    page = (ROOT / "docs" / "run-fields.md").read_text(encoding="utf-8")
    assert "| `training.lr` |" not in page  # no copy to go stale: docs/hooks.py writes the table at the mark
    assert page.count("<!-- run-fields: the table is generated here") == 1
    assert all(f"| `{path}` |" in field_reference() for path, *_ in reference(RunSpec))


def test_every_documented_field_is_read_and_refused_by_its_own_name_with_the_documented_text():
    rows = reference(RunSpec)
    assert len(rows) >= 45 and len({path for path, *_ in rows}) == len(rows)
    assert parse_run(RUN).training.lora.rank == 8  # the base run every field is broken on, one at a time
    for path, accepted, _default, doc in rows:
        assert doc.strip() and accepted.strip(), path
        raw = {**RUN, "model": {}} if path == "model.parameters" else RUN  # a bare count stands alone
        err = _refused(_set(raw, path, [[]]))  # a value no field accepts
        assert err.field == path and str(err) == f"{path}=[[]] is invalid: expected {accepted}", str(err)


@pytest.mark.parametrize("section", ["", "model", "data", "training", "training.lora", "compute", "checkpoint",
                                     "budget", "registry", "registry.gate", "eval", "export", "tracking"])
def test_an_unknown_key_is_refused_with_exactly_the_documented_fields_of_its_object(section):
    prefix = f"{section}." if section else ""
    documented = sorted({path[len(prefix):].split(".")[0] for path, *_ in reference(RunSpec)
                         if path.startswith(prefix)})
    err = _refused(_set(RUN, f"{prefix}nope", 1))
    assert err.field == f"{prefix}nope" and str(err).endswith("accepted fields: " + ", ".join(documented))


def test_null_is_not_given_for_an_optional_field_and_refused_for_the_others():
    run = parse_run(_set(_set(RUN, "compute.max_wait_hours", None), "tracking.mlflow_uri", None))
    assert run.compute.max_wait_hours is None and run.tracking.mlflow_uri is None
    err = _refused(_set(RUN, "training.epochs", None))
    assert err.field == "training.epochs" and "a number > 0" in str(err)


# ---- the decoder on a field that no other code knows --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Limits:
    """A section a new feature might add."""

    window: int = spec("Steps in the window.", default=4, lo=1, hi=64)
    mode: Literal["fast", "exact"] = spec("How to count.", default="exact")


@dataclass(frozen=True, kw_only=True)
class _Toy:
    """A document with a flattened field (`at`), an auto field, a required one and a nested section."""

    rate: float = spec("Per second.", lo=0, hi=10, lo_open=True)
    count: int | None = spec("How many (auto: chosen).", default=None, auto=True, lo=1, hi=8)
    cap: float = spec("The cap.", default=1.0, at="budget.cap", lo=0, hi=100)
    limits: _Limits = spec("The limits.", default_factory=_Limits)


def test_a_new_field_is_one_declaration_decoded_checked_and_documented():
    toy = decode(_Toy, {"rate": 2, "count": "auto", "budget": {"cap": 5}, "limits": {"mode": "fast"}})
    assert toy == _Toy(rate=2.0, count=None, cap=5.0, limits=_Limits(window=4, mode="fast"))
    assert decode(_Toy, {"rate": 1}).limits == _Limits()
    for raw, field, says in [
        ({}, "rate", "a value (this field is required)"),
        ({"rate": 0}, "rate", "a number > 0 and <= 10"),
        ({"rate": 1, "count": 9}, "count", '"auto" or an integer in [1, 8]'),
        ({"rate": 1, "budget": {"cap": True}}, "budget.cap", "a number >= 0 and <= 100"),
        ({"rate": 1, "budget": {"limit": 1}}, "budget.limit", "no such field; accepted fields: cap"),
        ({"rate": 1, "limits": {"mode": "slow"}}, "limits.mode", "fast or exact"),
        ({"rate": 1, "limits": {"window": 1.0}}, "limits.window", "an integer in [1, 64]"),
        ({"rate": 1, "extra": 1}, "extra", "accepted fields: budget, count, limits, rate"),
        ({"rate": 1, "budget": {"caps": 1}}, "budget.caps", "no such field (did you mean cap?); accepted fields: cap"),
    ]:
        with pytest.raises(RunValidationError) as err:
            decode(_Toy, raw)
        assert err.value.field == field and str(err.value).endswith(says), str(err.value)
    assert [row[0] for row in reference(_Toy)] == ["rate", "count", "budget.cap", "limits.window", "limits.mode"]
    assert reference(_Toy)[1][1:] == ('"auto" or an integer in [1, 8]', '`"auto"`', "How many (auto: chosen).")


# ---- tracking.mlflow_uri against SageMaker's service model ---------------------------------------------------

SAGEMAKER = botocore.session.get_session().get_service_model("sagemaker")


def _botocore_accepts_arn(arn: str) -> bool:
    """CreateMlflowTrackingServer's TrackingServerArn, with its name part a TrackingServerName (both full-matched)."""
    arn_shape, name_shape = SAGEMAKER.shape_for("TrackingServerArn"), SAGEMAKER.shape_for("TrackingServerName")
    name = arn.partition(":mlflow-tracking-server/")[2]
    return (re.fullmatch(arn_shape.metadata["pattern"], arn) is not None and len(arn) <= arn_shape.metadata["max"]
            and re.fullmatch(name_shape.metadata["pattern"], name) is not None
            and len(name) <= name_shape.metadata["max"])


def test_the_tracking_server_patterns_are_botocores():
    assert MLFLOW_TRACKING_SERVER_ARN == SAGEMAKER.shape_for("TrackingServerArn").metadata["pattern"]
    assert MLFLOW_TRACKING_SERVER_NAME == SAGEMAKER.shape_for("TrackingServerName").metadata["pattern"]
    assert MLFLOW_URI_MAX == SAGEMAKER.shape_for("TrackingServerArn").metadata["max"] \
        == SAGEMAKER.shape_for("TrackingServerUrl").metadata["max"]
    # The ARN CreateMlflowTrackingServer returns is the one a run names.
    assert SAGEMAKER.operation_model("CreateMlflowTrackingServer").output_shape.members["TrackingServerArn"].name \
        == "TrackingServerArn"


ARNS = ["arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team-tracker",
        "arn:aws-cn:sagemaker:cn-north-1:123456789012:mlflow-tracking-server/a",
        "arn:aws-us-gov:sagemaker:us-gov-west-1:123456789012:mlflow-tracking-server/x--y9",
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/" + "n" * 256,
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/",  # no name
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/" + "n" * 257,
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team_tracker",
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/-team",
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team\n",
        "arn:aws:sagemaker:us-east-1:12345:mlflow-tracking-server/team",
        "arn:aws:sagemaker:US-EAST-1:123456789012:mlflow-tracking-server/team",
        "arn:aws:s3:us-east-1:123456789012:mlflow-tracking-server/team",
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-app/app-ABC123",  # an MLflow App is not a server
        "arn:aws:sagemaker:us-east-1:123456789012:training-job/team",
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team/extra"]


@pytest.mark.parametrize("arn", ARNS, ids=range(len(ARNS)))
def test_a_tracking_server_arn_is_accepted_exactly_when_botocore_accepts_it(arn):
    raw = _set(RUN, "tracking.mlflow_uri", arn)
    if _botocore_accepts_arn(arn):
        assert parse_run(raw).tracking.mlflow_uri == arn
    else:
        err = _refused(raw)
        assert err.field == "tracking.mlflow_uri" and "mlflow-tracking-server/NAME" in str(err)


@pytest.mark.parametrize("uri", ["https://mlflow.example.com", "http://127.0.0.1:5000", "https://host:8443/mlflow/",
                                 "HTTPS://Tracker.Internal"])
def test_an_http_tracking_url_is_accepted(uri):
    assert parse_run(_set(RUN, "tracking.mlflow_uri", uri)).tracking.mlflow_uri == uri


@pytest.mark.parametrize("uri, says", [
    ("file:///tmp/mlruns", "http(s):// URL"), ("localhost:5000", "http(s):// URL"), ("databricks", "http(s):// URL"),
    ("https://", "http(s):// URL"), ("http://host:99999", "http(s):// URL"), ("http://[::1", "http(s):// URL"),
    ("https://mlflow.example.com/\n", "http(s):// URL"), ("https://a b", "http(s):// URL"),
    ("https://user:secret@mlflow.example.com", "without user:password@"), ("", "at most 2,048"),
    (5, "at most 2,048"), ("https://h/" + "p" * 2048, "at most 2,048"),
])
def test_anything_else_is_refused_by_field(uri, says):
    err = _refused(_set(RUN, "tracking.mlflow_uri", uri))
    assert err.field == "tracking.mlflow_uri" and says in str(err) and "\n" not in str(err)


def test_no_tracking_is_the_default():
    assert parse_run(RUN).tracking.mlflow_uri is None
    assert parse_run({**RUN, "tracking": {}}).tracking.mlflow_uri is None
