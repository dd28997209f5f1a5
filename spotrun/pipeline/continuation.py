"""A run in a fresh execution before its history fills: what carries over, and how the new execution proves it
was started by the one it continues.

Step Functions Standard fails an execution at 25,000 history events. Each poll of a job is 9 events and each
segment restarts polling at the shortest interval, so a long chain of segments would fill one history. The
cost guard counts the events its execution has used (`Guard.history_events`, spotrun/pipeline/guard.py); at a
segment boundary where the next segment might not fit in what is left (`must_continue`), it answers `continue`
instead of creating the next job, and the state machine starts a new execution of itself (StartExecution, name
`continuation_name`) whose input carries the run, the plan and the guard (the next job's name, MaxRuntime, the
bills so far), then succeeds. No job runs across the handoff: the old execution's last job has ended, the new
one creates the next.

Trust: anyone allowed to start the pipeline could start an execution with such an input, skipping the estimate.
So the new execution's first step (`carried`, in the estimate Lambda) accepts it only when the parent it names is
an execution of this state machine whose history holds the StartExecution it scheduled for this very execution,
with exactly this input; the canceller applies the same check before it stops a continued run's jobs. The jobs
keep the first execution's name prefix and `execution` tag (the plan carries both), so the guard's ownership
check and the canceller find them as before. docs/cap-and-segments.md describes the design.
"""

from __future__ import annotations

import json
from typing import Any

from ..seams import EXECUTION_TAG

HISTORY_QUOTA = 25_000  # events per Standard execution (Step Functions quotas)
# The most events one segment's job can use: its polls over the longest job the contract allows, its stops and
# its create (tests/infra/test_seams.py proves the polls of a 56-day spot wait and a 28-day job stay under this).
SEGMENT_EVENTS_MAX = 12_500
# A continued execution's entry; a first execution's (FIRST_EXECUTION_EVENTS) is the seams', which the construct
# writes into the execution's first guard.
CONTINUED_EXECUTION_EVENTS = 40
END_EVENTS = 60  # registration, the report, a notice and the end
EVENTS_PER_POLL = 9  # Wait (2) + CostGuard (5) + NextAction (2)
EVENTS_PER_STOP = 5  # StopTrainingJob
EVENTS_PER_CREATE = 7  # NextSegment (2) + Create (5)
NAME_MAX = 80  # StartExecution's name
HISTORY_CHECKED = 30  # the parent's newest events read for its StartExecution (it is among the last ten)


def must_continue(history_events: int) -> bool:
    """Does the next segment go to a fresh execution? When it might not fit in what this history has left."""
    return history_events + EVENTS_PER_CREATE + SEGMENT_EVENTS_MAX + END_EVENTS > HISTORY_QUOTA


def continuation_name(first_execution: str, segment: int) -> str:
    """The execution that runs segment `segment` of the run whose first execution is `first_execution`."""
    suffix = f"-s{segment}"
    return first_execution[:NAME_MAX - len(suffix)] + suffix


class NotAContinuation(ValueError):
    """The input claims to continue an execution that did not start this one with it."""


def _scheduled_inputs(sfn: Any, parent_arn: str) -> list[tuple[str, dict]]:
    """(name, input) of every StartExecution among the parent's newest events, as the parent scheduled it."""
    events = sfn.get_execution_history(executionArn=parent_arn, reverseOrder=True,
                                       maxResults=HISTORY_CHECKED)["events"]
    found = []
    for event in events:
        details = event.get("taskScheduledEventDetails") or {}
        if event.get("type") != "TaskScheduled" or details.get("resource") != "startExecution":
            continue
        params = json.loads(details.get("parameters") or "{}")
        given = params.get("Input")
        found.append((str(params.get("Name")), json.loads(given) if isinstance(given, str) else given))
    return found


def carried(sfn: Any, state_machine_arn: str, execution: str, continuation: Any) -> dict:
    """The run, plan and guard a continued execution resumes with, once its parent is proven to have started it
    with exactly this input; NotAContinuation otherwise."""
    if not isinstance(continuation, dict) or not {"parent", "run", "plan", "guard"} <= set(continuation):
        raise NotAContinuation("continuation: expected the parent, run, plan and guard a continuing execution "
                               "passes")
    parent = continuation["parent"]
    executions = state_machine_arn.replace(":stateMachine:", ":execution:", 1) + ":"
    if not isinstance(parent, str) or not parent.startswith(executions):
        raise NotAContinuation(f"continuation.parent={parent!r}: expected an execution of {state_machine_arn}")
    if (execution, {"continuation": continuation}) not in _scheduled_inputs(sfn, parent):
        raise NotAContinuation(f"execution {execution}: its parent {parent.rsplit(':', 1)[-1]} did not start it "
                               "with this input")
    return {"run": continuation["run"], "plan": continuation["plan"],
            "guard": {**continuation["guard"], "history_events": CONTINUED_EXECUTION_EVENTS}}


def continued_run(sfn: Any, state_machine_arn: str, execution: str, execution_input: str | None) -> dict | None:
    """For the canceller: (the plan's) first job name and `execution` tag of a continued execution, or None when
    its input is no proven continuation."""
    try:
        continuation = json.loads(execution_input or "{}").get("continuation")
    except (json.JSONDecodeError, AttributeError):
        return None
    if continuation is None:
        return None
    try:
        plan = carried(sfn, state_machine_arn, execution, continuation)["plan"]
    except NotAContinuation:
        return None
    tags = {t.get("Key"): t.get("Value") for t in plan.get("tags") or []}
    return {"first_job": plan.get("job_name"), "tag": tags.get(EXECUTION_TAG)}
