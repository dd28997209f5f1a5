"""The one refusal type: a run that must not start, with its status, the field to change and the estimate.

`Refusal` is what every layer raises (the contract's `RunValidationError`, the planner's `EstimateRefused` and the
stage's rules derive from it) and what every front end maps to its output in one place: `result()` for the
estimate Lambda's plan and the CLI's JSON, `line()` for the CLI's one line of text, and `spotrun.cli.exits.for_status`
for the exit code. The status is the state machine's named failure (`spotrun.seams.PlanStatus`): InvalidRun (the
run must change; the message names the field) or OverBudget (the cap cannot carry the run).
"""

from __future__ import annotations

from typing import Any, Iterable

from ..seams import PlanStatus


class Refusal(Exception):
    """A run that must not start. `status`: PlanStatus value; `field`: the dotted run field to change ("run" when
    the whole file is at fault); `message`: one line; `estimate`: the planner's Estimate when it got that far."""

    def __init__(self, status: str, message: str, *, field: str | None = None, estimate: Any = None):
        super().__init__(message)
        self.status = PlanStatus(status).value
        self.message = message
        self.field = field
        self.estimate = estimate

    def result(self, estimate_keys: Iterable[str] | None = None) -> dict:
        """{"status", "message", "field"[, "estimate"]}: the plan of a refused run (estimate_keys: the Lambda's
        subset of the estimate; None: all of it, as the CLI prints it)."""
        out: dict[str, Any] = {"status": self.status, "message": self.message, "field": self.field or "run"}
        if self.estimate is not None:
            est = self.estimate.to_json()
            out["estimate"] = est if estimate_keys is None else {k: est[k] for k in estimate_keys if k in est}
        return out

    def line(self) -> str:
        """`<status>: <message>`, the field first when the message does not already start with it."""
        named = self.field is None or self.message.startswith(self.field)
        return f"{self.status}: {self.message}" if named else f"{self.status}: {self.field}: {self.message}"
