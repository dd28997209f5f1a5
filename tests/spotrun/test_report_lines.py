"""The local report's interruption lines say what the restart did: a hard kill before the first checkpoint was
reported as 'resumed from checkpoint step 0' (a new user's trial), where the run started again from its start."""

from __future__ import annotations

from spotrun.pipeline.report import _event_line


def _event(checkpoint_step: int) -> dict:
    return {"kind": "sigkill", "trigger": "12", "late": None, "at_s": 30.0, "step": 10,
            "checkpoint_step": checkpoint_step, "lost_s": 8.0}


def test_a_restart_without_a_checkpoint_says_it_started_again():
    line = _event_line(1, _event(0))
    assert "started again from the beginning (no checkpoint was committed before it)" in line, line
    assert "resumed from" not in line
    assert "resumed from checkpoint step 8;" in _event_line(1, _event(8))
