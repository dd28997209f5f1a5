"""How each training worker ended, as the launcher reads it: one `rank<N>.json` per worker in the outcome dir.

The worker (train.py) writes it last; the launcher (launcher.py) reads every local worker's file after torchrun
exits and turns them into the container's exit code and SageMaker's failure file. One definition for both sides.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

# The launcher passes the directory to its workers in this environment variable.
OUTCOME_DIR_ENV = "SPOTRUN_OUTCOME_DIR"


@dataclass(frozen=True)
class Outcome:
    status: Literal["completed", "stopped", "failed", "segment_end"]
    """segment_end: the segment's time was up (`segment_seconds`): saved and exited cleanly, not completed."""
    step: int
    message: str = ""
    """failed: the cause; stopped: the step and which checkpoint a restart resumes from."""
    signalled: bool = False
    """stopped: whether this worker received the stop signal itself (False: a peer's stop reached it through the
    per-step agreement)."""

    @classmethod
    def from_dict(cls, raw: dict) -> "Outcome":
        return cls(status=raw["status"], step=int(raw.get("step", -1)), message=str(raw.get("message", "")),
                   signalled=bool(raw.get("signalled", False)))


def write_outcome(outcome_dir: str | Path, rank: int, outcome: Outcome) -> None:
    if not outcome_dir:
        return
    Path(outcome_dir).mkdir(parents=True, exist_ok=True)
    Path(outcome_dir, f"rank{rank}.json").write_text(json.dumps(asdict(outcome)))


def read_outcomes(outcome_dir: Path) -> list[Outcome]:
    return [Outcome.from_dict(json.loads(p.read_text())) for p in sorted(Path(outcome_dir).glob("rank*.json"))]
