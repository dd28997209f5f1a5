"""What every tracker of the trainer shares: the metric names, the interface (`NullTracker`, which does nothing)
and `Trackers`, which sends each call to several (MLflow and W&B at once). tracking.py (MLflow) and
wandb_tracking.py implement it; `tracking.make_tracker` chooses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Metric keys of the MLflow run (the step metrics use the words of the trainer's metric line, spotrun.seams).
LOSS = "loss"
STEP_METRICS = ("lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_device", "mfu", "mem_gb")
VAL_LOSS, VAL_PPL = "val_loss", "val_ppl"
RESUMED_FROM_STEP = "resumed_from_step"
SUMMARY_PREFIX = "summary."

class NullTracker:
    """No tracking: every call does nothing (ranks other than 0, and runs that name no tracking server)."""

    def begin(self, ids: dict, *, step: int, segments: list[dict]) -> None:
        """At each start, after the checkpoint restored `ids` (TrainState.tracking, mutated in place) and the
        earlier starts' `segments` ({start_step, end_step, seconds} as of their last checkpoint)."""

    def losses(self, flushed: Iterable[tuple[int, float]]) -> None:
        """Every step's loss as the trainer read it (its loss_history.jsonl lines)."""

    def step_metrics(self, step: int, values: Mapping[str, float | None]) -> None:
        """A log step's metrics (STEP_METRICS; None: not measured, not logged)."""

    def evaluation(self, step: int, *, val_loss: float, val_ppl: float) -> None:
        """One evaluation's validation loss and perplexity."""

    def summary(self, step: int, summary: Mapping[str, Any]) -> None:
        """metrics.json at the end: each number as `summary.<key>`."""

    def close(self, *, step: int, reason: str, completed: bool, signalled: bool = False) -> bool:
        """End of this job (completed, or stopped for `reason`); True when everything queued reached the server."""
        return True


class Trackers(NullTracker):
    """Several trackers behind the one interface (MLflow and W&B at once): each call goes to each."""

    def __init__(self, trackers: list[NullTracker]):
        self.trackers = trackers

    def begin(self, ids: dict, *, step: int, segments: list[dict]) -> None:
        for t in self.trackers:
            t.begin(ids, step=step, segments=segments)

    def losses(self, flushed: Iterable[tuple[int, float]]) -> None:
        flushed = list(flushed)  # each tracker reads it
        for t in self.trackers:
            t.losses(flushed)

    def step_metrics(self, step: int, values: Mapping[str, float | None]) -> None:
        for t in self.trackers:
            t.step_metrics(step, values)

    def evaluation(self, step: int, *, val_loss: float, val_ppl: float) -> None:
        for t in self.trackers:
            t.evaluation(step, val_loss=val_loss, val_ppl=val_ppl)

    def summary(self, step: int, summary: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.summary(step, summary)

    def close(self, *, step: int, reason: str, completed: bool, signalled: bool = False) -> bool:
        return all([t.close(step=step, reason=reason, completed=completed, signalled=signalled)
                    for t in self.trackers])
