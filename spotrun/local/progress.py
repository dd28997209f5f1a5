"""Progress of a local run: step/total, loss, tokens/s, ETA and interruptions so far.

A progress bar (tqdm) on a terminal, plain lines otherwise (CI, logs). The numbers come from the trainer's own
output: `run_start ... total_steps=N` and its metric lines in the launcher log (parsed by spotrun.seams), the step
from loss_history.jsonl.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable

from ..seams import parse_metric_line, run_start_total_steps


class Progress:
    def __init__(self, log: Path, *, mode: str = "auto", emit: Callable[[str], None] = print):
        if mode not in ("auto", "bar", "lines", "none"):
            raise ValueError(f"progress={mode!r} is invalid: expected auto, bar, lines or none")
        self.mode = ("bar" if sys.stdout.isatty() else "lines") if mode == "auto" else mode
        self.log, self.emit = Path(log), emit
        self.offset = 0
        self.total: int | None = None
        self.loss: float | None = None
        self.tokens_per_s: float | None = None
        self.step = 0
        self.samples: deque[tuple[float, int]] = deque(maxlen=30)
        self.bar = None
        self._last_line_step = -1

    def _read_log(self) -> bool:
        """New metric lines since the last call: True when one arrived."""
        if not self.log.is_file():
            return False
        with self.log.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        cut = chunk.rfind(b"\n") + 1  # only whole lines
        self.offset += cut
        fresh = False
        for line in chunk[:cut].decode(errors="replace").splitlines():
            started = run_start_total_steps(line)
            self.total = self.total if started is None else started
            parsed = parse_metric_line(line)
            if parsed:
                self.loss, self.tokens_per_s, fresh = parsed["loss"], parsed["tokens_per_s"], True
        return fresh

    def eta_s(self) -> float | None:
        if self.total is None or len(self.samples) < 2:
            return None
        (t_a, s_a), (t_b, s_b) = self.samples[0], self.samples[-1]
        if s_b <= s_a or t_b <= t_a:
            return None
        return (self.total - self.step) * (t_b - t_a) / (s_b - s_a)

    def text(self, interruptions: int) -> str:
        eta = self.eta_s()
        parts = [f"step {self.step}/{self.total if self.total is not None else '?'}",
                 f"loss {self.loss:.4f}" if self.loss is not None else "loss -",
                 f"tokens/s {self.tokens_per_s:.0f}" if self.tokens_per_s is not None else "tokens/s -",
                 f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}" if eta is not None else "ETA -",
                 f"interruptions {interruptions}"]
        return "  ".join(parts)

    def start_attempt(self) -> None:
        """A start of the launcher (the first, or after an interruption, or `--resume`): the rate is measured
        again from its own first step, so its start-up (minutes on a busy machine) never counts as step time."""
        self.samples.clear()

    def update(self, step: int, *, interruptions: int, measured: bool = True) -> None:
        """`step`: where training stands; `measured`: it comes from a loss line of this attempt (not the
        checkpoint a start resumes from, which is where it stands before its first step)."""
        fresh = self._read_log()
        if step < self.step:  # a restart after a hard kill redoes steps: the rate restarts too
            self.samples.clear()
        if measured and (not self.samples or step != self.samples[-1][1]):
            self.samples.append((time.monotonic(), step))
        self.step = step
        if self.mode == "bar":
            if self.bar is None and self.total is not None:
                # tqdm comes with the trainer's requirements (transformers), not the CLI's: only the bar mode needs it
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, unit="step", dynamic_ncols=True)
            if self.bar is not None:
                self.bar.n = step
                self.bar.set_postfix_str(self.text(interruptions).split("  ", 1)[1], refresh=True)
        elif self.mode == "lines" and (fresh or step == self.total) and step != self._last_line_step:
            self._last_line_step = step
            self.emit(f"[local] {self.text(interruptions)}")

    def note(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(f"[local] {message}")
        elif self.mode != "none":
            self.emit(f"[local] {message}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
