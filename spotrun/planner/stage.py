"""The estimate step's planner stage (spotrun/pipeline/plan.py `plan`): a run's sources read, the utilization
measured for its model shape looked up, its estimate made, and what the trainer is sent checked against
CreateTrainingJob's limits. Also the training's smallest cap on a token count, which a preparation job must leave
of the cap (spotrun/pipeline/preparation.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..contract.spec import RunSpec
from .estimate import Estimate, LayoutCost, estimate
from .measured import shape_key
from .sources import read_sources, with_split


@dataclass(frozen=True)
class Planned:
    """The planner's answer for one run: the run as planned (with the validation split its prepared data holds),
    the estimate, and what the run record is made of (the model's config, the data's tokens, the shape key)."""

    run: RunSpec
    estimate: Estimate
    model_config: dict | None
    tokens: int | None
    shape: str | None
    # (cap, layout_cost) -> the estimate of `run` at that budget.max_usd on the same sources, its layouts ranked by
    # `layout_cost` (the policy stage ranks them at the cap to set: spotrun/pipeline/policy_stage.py)
    replan: Callable[[float, LayoutCost | None], Estimate] | None = None


def planned(run: RunSpec, *, catalog: dict, s3_client: Any, rates: dict[str, float] | None,
            mfu_lookup: Callable[[str, str], dict[str, tuple[float, int]]] | None,
            base_name: str | None, waits: dict[str, tuple[float, int]] | None = None,
            layout_cost: LayoutCost | None = None) -> Planned:
    """Plan `run` on the stage's catalog. `mfu_lookup(shape, method)`: instance type -> (MFU, runs) measured by
    earlier runs (spotrun/planner/measured.py); `waits`: instance type -> (mean wait for capacity after an
    interruption, waits) recorded (`recorded_waits`); `base_name`: the name an exported adapter gives its base model
    (a hub model's hub name, which from_pretrained takes, rather than its copy's place); `layout_cost`: the spot
    policy stage's bill of a layout (spotrun/planner/estimate.py `estimate`)."""
    sources = read_sources(run, s3_client=s3_client)
    run = with_split(run, sources)  # the validation split the prepared data holds, when the run names none
    config = run.model.config or sources.model_config
    shape = shape_key(config) if config else None
    measured = mfu_lookup(shape, run.training.method) if (mfu_lookup and shape) else None
    def replan(cap: float, cost: LayoutCost | None) -> Estimate:
        return estimate(dataclasses.replace(run, max_usd=cap), catalog=catalog, model_config=sources.model_config,
                        data_tokens=sources.tokens, recorded_rates=rates, recorded_mfu=measured,
                        recorded_waits=waits, validation_tokens=sources.validation_tokens, base_name=base_name,
                        layout_cost=cost)

    return Planned(run, replan(run.max_usd, layout_cost), sources.model_config, sources.tokens, shape, replan)


def smallest_cap(run: RunSpec, tokens: int, *, catalog: dict, s3_client: Any) -> float:
    """The smallest cap whose training chain finishes on `tokens` (spotrun/planner/segments.py `smallest_cap`,
    the planner's own figure). A model it cannot plan is refused here too, before a preparation bills anything."""
    # NOTE: raw text has no index.json yet: the probe names no data.source, only the token count.
    probe = dataclasses.replace(run, max_usd=math.inf, data=dataclasses.replace(run.data, tokens=tokens, source=None))
    sources = read_sources(probe, s3_client=s3_client)
    est = estimate(probe, catalog=catalog, model_config=sources.model_config, data_tokens=tokens,
                   tokens_lower_bound=True)
    return float(est.segments.min_cap_usd)
