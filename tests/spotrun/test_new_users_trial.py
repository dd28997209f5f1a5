"""A new user's trial of the merged pipeline (validate, estimate, simulate; ~75 runs): what they found, each through
the CLI and, where it is a rule of the contract or the estimate, the estimate Lambda's handler.

The figures a test compares are the estimate's own, read from its output (an accepted estimate's cost row against
a refusal's), never recomputed here.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import boto3
from moto import mock_aws

from spotrun.cli.main import main
from spotrun.handlers import estimate as estimate_handler
from spotrun.pipeline.plan import PipelineSettings

ROOT = Path(__file__).parents[2]
BUCKET = "art-bucket"
SETTINGS = PipelineSettings(bucket=BUCKET, job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform")
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


def _lambda(monkeypatch, run: dict) -> dict:
    """The estimate Lambda's handler itself, with the stage's environment (as the construct writes it)."""
    for key, value in {**SETTINGS.to_env(), "AWS_REGION": "us-east-1"}.items():
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
