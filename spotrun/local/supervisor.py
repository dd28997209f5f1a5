"""The training stage of `spotrun local`: the launcher started, interrupted as asked, restarted like managed spot.

What it measures is kept in a timeline (`timeline.json` in the job directory, rewritten after every start, so
an interrupted session can be resumed with `spotrun local --resume JOB`):

    starts         each launcher process: started_s, ended_s, exit_code, restart_s (start to its first new step)
    interruptions  each injected one: the trigger asked for, when the signal was really sent (at_s, and
                   signalled_at_step: the step training had reached then), the step it stopped at, the checkpoint
                   it resumed from, and lost_s: from the signal until training passed the highest step reached
                   before it, or until the next interruption, whichever came first (every interruption has one)
    user_stops     Ctrl-C: the trainer was asked to save and stop (SIGTERM, as SageMaker does)
    not_injected   triggers that never fired, with the reason (the run had finished, or reached its last step)

Seconds are on one clock per job, from the first start; a resumed session continues it (the time between
sessions is not counted). NOTE: the signal path imports nothing: with interruptions asked for, the checkpoint
reader (torch) is imported before the clock starts, since an import of torch there took 6-8 s and let the
trainer run 8-9 steps past the step asked for.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .harness import kill_tree, launchers_running, loss_records, start_launcher
from .progress import Progress

MAX_RESTARTS = 20
STOP_TIMEOUT_S = 180  # SageMaker allows 120 s after SIGTERM; a local save gets a little more
POLL_S = 0.05
TIMELINE_FILE = "timeline.json"
CONFIG_EXIT_CODE = 2  # the launcher's exit code for a configuration error (spotrun_trainer.launcher.main)


class LocalRunError(RuntimeError):
    """The local run could not finish; the message says at which stage and why (with the log's path)."""


class LocalConfigError(LocalRunError):
    """The launcher refused the job's configuration before starting any worker (its exit code 2)."""


class LocalStopped(LocalRunError):
    """Ctrl-C (or SIGTERM): the job was stopped cleanly; `resume_hint` says how to continue it, `by` what stopped
    it ("Ctrl-C" or "SIGTERM")."""

    def __init__(self, message: str, resume_hint: str, by: str = "Ctrl-C"):
        super().__init__(message)
        self.resume_hint, self.by = resume_hint, by


class Terminated(KeyboardInterrupt):
    """SIGTERM to `spotrun local` itself (`kill PID`, `timeout`, a CI runner's cancel) or SIGHUP (its terminal
    closed) while a job runs: stopped as Ctrl-C stops it. Without it the CLI died at once and left the launcher,
    torchrun and the workers training on in the background. `by`: the signal's name."""

    def __init__(self, by: str = "SIGTERM"):
        super().__init__(by)
        self.by = by


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _terminated(signum: int, _frame=None) -> None:  # signal.signal passes the number and the frame
    raise Terminated(signal.Signals(signum).name)


@dataclass(frozen=True)
class InterruptAt:
    """One injected interruption: when training reaches `step`, or `seconds` after the job's first start."""

    step: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> "InterruptAt":
        m = re.fullmatch(r"\s*(\d+)\s*", text) or re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*s\s*", text)
        if not m or float(m[1]) <= 0:
            raise ValueError(f"--interrupt-at={shlex.quote(text)} is invalid: expected a step (e.g. 12) or seconds "
                             "after the start (e.g. 30s), greater than 0")
        return cls(step=int(m[1])) if text.strip().isdigit() else cls(seconds=float(m[1]))

    def due(self, step: int, elapsed_s: float) -> bool:
        return step >= self.step if self.step is not None else elapsed_s >= self.seconds

    def sort_key(self) -> tuple[int, float]:
        return (0, self.step) if self.step is not None else (1, self.seconds)

    def __str__(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.seconds:g}s"


@dataclass
class Job:
    root: Path
    log: Path

    @property
    def sm(self) -> Path:
        return self.root / "sm"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def output(self) -> Path:
        return self.sm / "model"

    @property
    def finished(self) -> bool:
        return (self.output / "metrics.json").is_file()


def empty_timeline() -> dict:
    return {"starts": [], "interruptions": [], "user_stops": [], "not_injected": [], "wall_s": 0.0, "sessions": 0}


def load_timeline(root: Path) -> dict:
    path = Path(root) / TIMELINE_FILE
    return json.loads(path.read_text()) if path.is_file() else empty_timeline()


def finish_lost_time(timeline: dict) -> None:
    """lost_s for every interruption: until training passed the step reached before it (resumed_s), or until the
    next interruption, or the end of the run, whichever came first. The sum is the time spent below the high-water
    mark after interruptions, each second counted once."""
    events = timeline["interruptions"]
    for i, event in enumerate(events):
        ends = [timeline["wall_s"], event.get("resumed_s", float("inf"))]
        if i + 1 < len(events):
            ends.append(events[i + 1]["at_s"])
        event["lost_s"] = round(max(0.0, min(ends) - event["at_s"]), 3)


class Supervisor:
    """One session of the training stage on a job directory (a fresh job, or one resumed)."""

    def __init__(self, job: Job, *, triggers: tuple[InterruptAt, ...], hard_kill: bool, progress: str,
                 emit: Callable[[str], None], resume_hint: str):
        self._committed = None
        if triggers:  # before the clock starts: the signal path must not import anything slow (see the docstring)
            self._checkpoint_reader()
        self.job, self.hard_kill, self.emit, self.resume_hint = job, hard_kill, emit, resume_hint
        self.pending = sorted(triggers, key=InterruptAt.sort_key)
        self.progress = Progress(job.log, mode=progress, emit=emit)
        self.timeline = load_timeline(job.root)
        self.timeline["sessions"] += 1
        for start in self.timeline["starts"]:  # a session that was killed outright left its last start open
            start.setdefault("ended_s", self.timeline["wall_s"])
            start.setdefault("exit_code", None)
        self.t0 = time.monotonic() - self.timeline["wall_s"]
        self.high_water = max((s for s, _ in loss_records(job.output)), default=0)
        self.restart_from = self._checkpoint_step()  # where a start begins, until its first step line
        self.proc: subprocess.Popen | None = None

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def _save(self) -> None:
        self.timeline["wall_s"] = self.now()
        (self.job.root / TIMELINE_FILE).write_text(json.dumps(self.timeline, indent=2))

    def _checkpoint_reader(self):
        if self._committed is None:
            from spotrun_trainer.checkpoint import committed_checkpoints  # imports torch: 6-8 s here

            self._committed = committed_checkpoints
        return self._committed

    def _checkpoint_step(self) -> int:
        if not self.job.checkpoints.is_dir():
            return 0
        newest = self._checkpoint_reader()(self.job.checkpoints)
        return newest[0][0] if newest else 0

    def run(self) -> dict:
        """Until the trainer completes; returns the timeline (with lost_s and wall_s)."""
        running = launchers_running(self.job.sm)
        if running:
            raise LocalRunError(f"job {self.job.root} is still running (launcher pid {', '.join(map(str, running))}): "
                                "stop it before resuming")
        main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
        previous = {s: signal.signal(s, _terminated) for s in STOP_SIGNALS} if main else {}
        try:
            while not self._one_start():
                pass
        except KeyboardInterrupt as exc:
            self.progress.close()
            raise self._user_stop(exc.by if isinstance(exc, Terminated) else "Ctrl-C") from None
        except BaseException:  # an error here: leave no training processes behind
            if self.proc is not None:
                kill_tree(self.proc)
            self.progress.close()
            raise
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        self.progress.close()
        for left in self.pending:
            self.timeline["not_injected"].append({"trigger": str(left), "reason": "the run finished first"})
            self.emit(f"[local] interruption at {left} not injected: the run finished first")
        self._save()
        finish_lost_time(self.timeline)
        self._save()
        return self.timeline

    def _one_start(self) -> bool:
        """Start the launcher once and watch it; True when the run is complete."""
        starts = self.timeline["starts"]
        if len(starts) > MAX_RESTARTS:
            raise LocalRunError(f"more than {MAX_RESTARTS} restarts; see {self.job.log}")
        seen = len(loss_records(self.job.output))
        self.proc = start_launcher(self.job.sm, self.job.log)
        self.progress.start_attempt()
        start = {"started_s": self.now()}
        starts.append(start)
        interrupted = None
        while self.proc.poll() is None:
            records = loss_records(self.job.output)
            fresh = len(records) > seen
            # The step training is at: its newest line, or (a restart before its first line) the checkpoint.
            step = records[-1][0] if fresh else self.restart_from
            if fresh and "restart_s" not in start and len(starts) > 1:
                start["restart_s"] = round(self.now() - start["started_s"], 3)
            self._note_resumed(step)
            self.progress.update(step, interruptions=len(self.timeline["interruptions"]), measured=fresh)
            trigger = next((t for t in self.pending if t.due(step, self.now())), None)
            if trigger is not None:
                self.pending.remove(trigger)
                interrupted = self._interrupt(trigger, step, seen)
                if interrupted is not None:
                    break
            time.sleep(POLL_S)
        rc = self.proc.wait()
        self._record_end(start)
        self.high_water = max(self.high_water, max((s for s, _ in loss_records(self.job.output)), default=0))
        if interrupted is not None:
            self.timeline["interruptions"].append(interrupted)
            self.restart_from = interrupted["checkpoint_step"]
            self._save()
            self.progress.note(f"interruption {len(self.timeline['interruptions'])} ({interrupted['kind']}, "
                               f"{interrupted['trigger']}): signal sent at step {interrupted['signalled_at_step']}, "
                               f"stopped at step {interrupted['step']}, exit {rc}, newest checkpoint step "
                               f"{interrupted['checkpoint_step']}; restarting on the same checkpoint directory")
            return rc == 0 and self.job.finished  # finished while the signal was on its way
        self._save()
        if rc == 0 and self.job.finished:
            return True
        failure = self.job.sm / "output" / "failure"
        reason = failure.read_text().strip() if failure.is_file() else f"exit code {rc}"
        if rc == CONFIG_EXIT_CODE and reason.startswith("invalid configuration"):
            raise LocalConfigError(f"{reason} (found by the launcher before any worker started; see {self.job.log})")
        raise LocalRunError(f"training failed: {reason}; see {self.job.log}")

    def _record_end(self, start: dict) -> None:
        start["ended_s"] = self.now()
        start["exit_code"] = self.proc.poll()

    def _note_resumed(self, step: int) -> None:
        for event in self.timeline["interruptions"]:
            if "resumed_s" not in event and step > event["high_water_step"]:
                event["resumed_s"] = self.now()

    def _interrupt(self, trigger: InterruptAt, step: int, seen: int) -> dict | None:
        """Send the interruption now (training is at `step`); None (and a note) when the run already finished its
        last step. `seen`: loss lines written before this start."""
        total = self.progress.total
        if self.job.finished or (total is not None and step >= total):
            self.timeline["not_injected"].append({"trigger": str(trigger), "reason": f"training had reached its last "
                                                  f"step ({step}) when it came due"})
            self.emit(f"[local] interruption at {trigger} not injected: training had reached its last step ({step})")
            return None
        at_s = self.now()
        if self.hard_kill:
            kill_tree(self.proc)
        else:
            self.proc.send_signal(signal.SIGTERM)
        records = loss_records(self.job.output)
        signalled_at = records[-1][0] if len(records) > seen else step  # where training was when it was sent
        if not self.hard_kill:
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc)
        reached = max((s for s, _ in loss_records(self.job.output)), default=step)
        late = signalled_at - trigger.step if trigger.step is not None else round(at_s - trigger.seconds, 3)
        return {"trigger": str(trigger), "kind": "hard-kill" if self.hard_kill else "sigterm", "at_s": at_s,
                "signalled_at_step": signalled_at, "late": late, "step": reached,
                "high_water_step": max(self.high_water, reached), "stop_s": round(self.now() - at_s, 3),
                "checkpoint_step": self._checkpoint_step()}

    def _user_stop(self, by: str = "Ctrl-C") -> LocalStopped:
        """Ctrl-C (or SIGTERM to this process): SIGTERM to the job (the trainer agrees on a step and saves), a
        second one kills the job outright."""
        proc = self.proc
        at_s = self.now()
        if proc is None:
            return LocalStopped("before the first start of the launcher", self.resume_hint, by)
        if proc.poll() is None:
            self.emit(f"[local] {by}: stopping the job cleanly (the trainer saves a checkpoint; {by} again "
                      "to kill it)")
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                kill_tree(proc)
        records = loss_records(self.job.output)
        checkpoint = self._checkpoint_step()
        start = self.timeline["starts"][-1]
        start["ended_s"], start["exit_code"] = self.now(), proc.poll()
        self.timeline["user_stops"].append({"at_s": at_s, "step": records[-1][0] if records else 0,
                                            "checkpoint_step": checkpoint, "by": by})
        self._save()
        return LocalStopped(f"at step {records[-1][0] if records else 0}; newest checkpoint: step {checkpoint} in "
                            f"{self.job.checkpoints}", self.resume_hint, by)
