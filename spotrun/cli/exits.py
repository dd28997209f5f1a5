"""The exit codes of every `spotrun` command: one table, printed by `spotrun --help` (docs/cli.md).

A refusal's code follows its status (spotrun.contract.refusal.Refusal, the state machine's named failures): InvalidRun
is 2 wherever it was found (the contract, the stage's rules, the sources or the planner's facts: an instance type the
catalog does not have, a run no instance fits, one longer than SageMaker's 28-day MaxRuntime), OverBudget is 3.
Each command uses the codes that can happen to it (validate: 0, 2, and 1 for an AWS error with --stage; estimate and
start: 0, 2, 3, and 1 for an AWS error; local: all of them). An AWS error is 1 from every command, missing
credentials included (they are not an invalid --stage: `spotrun.cli.remote.aws_message` says how to give them).
Invalid input wins: a run that is both invalid and over budget is refused as InvalidRun
(the run must change whatever the cap), and of several run files the code is 2 when any is invalid, else the
highest (`combined`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from enum import IntEnum
from typing import Any

from ..contract.strict_json import dumps as strict_dumps
from ..seams import PlanStatus


class Exit(IntEnum):
    OK = 0
    FAILED = 1
    INVALID = 2
    REFUSED = 3
    GATE_FAILED = 4
    STOPPED = 130


MEANING = {
    Exit.OK: "done (every run passed)",
    Exit.FAILED: "failed (training failed, an AWS error, or a package the command needs is not installed)",
    Exit.INVALID: "invalid input (InvalidRun: the run, an argument or the configuration; the message names the field)",
    Exit.REFUSED: "refused by the planner: over budget (OverBudget: the cap cannot carry the run)",
    Exit.GATE_FAILED: "trained but refused by registry.gate (not registered)",
    Exit.STOPPED: "stopped by Ctrl-C (`spotrun local --resume JOB` continues on its checkpoints)",
}
HELP = "exit codes:\n" + "\n".join(f"  {int(code):<4} {text}" for code, text in MEANING.items())
"""The table as `--help` prints it (an epilog under argparse.RawDescriptionHelpFormatter)."""


def for_status(status: str) -> Exit:
    """The exit code of a plan's status (PlanStatus value)."""
    return {PlanStatus.OK.value: Exit.OK, PlanStatus.OVER_BUDGET.value: Exit.REFUSED}.get(str(status), Exit.INVALID)


def combined(codes: Iterable[Exit]) -> Exit:
    """The exit code of several run files': 2 when any is invalid (the input to fix first), else the highest."""
    codes = list(codes)
    return Exit.INVALID if Exit.INVALID in codes else max(codes, default=Exit.OK)


def error_doc(error: str, message: str, field: str | None = None) -> dict:
    """The JSON error document every command prints with `--format json` (`message` one line, `excerpt` where the
    message has more: `split_excerpt`)."""
    doc: dict[str, Any] = {"error": error, "message": message}
    if field is not None:
        doc["field"] = field
    return split_excerpt(doc)


def split_excerpt(doc: dict) -> dict:
    """`doc` whose message has lines under its first (a JSON file's line and a caret under the column,
    spotrun/contract/json_text.py), with `message` its first line and `excerpt` the others; else `doc` itself."""
    first, more, excerpt = str(doc.get("message", "")).partition("\n")
    return {**doc, "message": first, "excerpt": excerpt} if more else doc


def fail(fmt: str, code: Exit, error: str, message: str, field: str | None = None) -> int:
    """Report an error the way the command's --format asks: one JSON document on stdout (json), or one line
    `error: <error>: <message>` on stderr (text); returns the exit code."""
    if fmt == "json":
        print(strict_dumps(error_doc(error, message, field), indent=2))
    else:
        print(f"error: {error}: {message}", file=sys.stderr)
    return int(code)
