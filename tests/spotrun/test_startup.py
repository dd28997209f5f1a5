"""Every start pulls the trainer image: its size is part of the estimate's startup, on the first start and on each
spot restart (spotrun.planner.estimate.startup_seconds; sizes and rate cited in spotrun/planner/catalog.json)."""

from __future__ import annotations

import copy

import pytest

from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import estimate, load_catalog

RUN = {"version": 1, "name": "startup", "model": {"parameters": 1_000_000_000},
       "data": {"tokens": 100_000_000, "seq_len": 2048}, "budget": {"max_usd": 1000},
       "compute": {"instance_type": "ml.g6e.xlarge", "spot": True}}


def _with_image(gb: float) -> dict:
    catalog = copy.deepcopy(load_catalog())
    catalog["defaults"]["trainer_image_gb"] = gb
    return catalog


def test_the_image_pull_is_in_the_wall_time_and_in_every_restart():
    catalog = load_catalog()
    d = catalog["defaults"]
    assert d["trainer_image_gb"] > 0 and d["image_pull_gb_per_s"] > 0
    run = parse_run(RUN)
    small, large = estimate(run, catalog=_with_image(0)), estimate(run, catalog=_with_image(10))
    pull = 10 / d["image_pull_gb_per_s"]
    assert large.wall_seconds - small.wall_seconds == pytest.approx(pull, abs=1)
    # More interruptions over the longer wall, and each restart pulls again: the spot overhead grows by more
    # than the interruptions alone would add.
    assert large.expected_interruptions > small.expected_interruptions
    assert large.max_runtime_seconds > small.max_runtime_seconds + 2 * pull - 2
    assert large.cost_usd["spot"] > small.cost_usd["spot"]
