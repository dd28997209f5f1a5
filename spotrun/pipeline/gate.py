"""The registry gate: whether a trained model may be registered, decided from its validation losses.

One rule for both registries: the cost guard applies it when the training job completes (the state machine then
registers the model or ends in `GateFailed`), and `spotrun local` applies it before its local registry. The gate
is the run's `registry.gate` (`max_val_loss`, `min_improvement`: the relative drop of the exported weights'
validation loss against the base model's, `(base - final) / base`); the losses are the trainer's (the
`run_completed` line's `val_loss` and `base_val_loss`, in DescribeTrainingJob's FinalMetricDataList on AWS and in
metrics.json locally). A gate that cannot be checked (no validation loss reported) fails: it never passes a model
it could not judge.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..contract.spec import GateSpec, RunSpec


def gate_of(run: RunSpec) -> dict:
    """The run's gate as the plan carries it ({} when the run has none)."""
    return {} if run.gate is None else {k: v for k, v in asdict(run.gate).items() if v is not None}


@dataclass(frozen=True)
class GateResult:
    passed: bool
    cause: str  # one line with both losses and every bound: the execution's failure cause, the report's note


def _num(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def check_gate(gate: dict | GateSpec | None, *, base: float | None, final: float | None) -> GateResult:
    """Pass or fail `final` (the exported weights' validation loss) against `gate`, `base` the base model's."""
    if isinstance(gate, GateSpec):
        gate = {k: v for k, v in asdict(gate).items() if v is not None}
    if not gate:
        return GateResult(True, "no registry.gate")
    base, final = _num(base), _num(final)
    losses = f"exported weights' validation loss {final if final is None else f'{final:.4f}'}, base model's " \
             f"{base if base is None else f'{base:.4f}'}"
    failures = []
    if final is None:
        failures.append("the run reported no validation loss")
    if gate.get("max_val_loss") is not None and final is not None and final > gate["max_val_loss"]:
        failures.append(f"above max_val_loss {gate['max_val_loss']}")
    if gate.get("min_improvement") is not None and final is not None:
        if base is None or base <= 0:
            failures.append("no base validation loss to measure the improvement against")
        else:
            improvement = (base - final) / base
            losses += f", improvement {improvement:.2%}"
            if improvement < gate["min_improvement"]:
                failures.append(f"improvement below min_improvement {gate['min_improvement']:.2%}")
    if failures:
        return GateResult(False, f"registry gate failed: {losses}: {'; '.join(failures)}")
    return GateResult(True, f"registry gate passed: {losses}")
