"""Run the container's entry point locally, as SageMaker would, and interrupt it the ways spot capacity does.

Used by `make demo`, the tests and the torture tool: a SageMaker-shaped root (examples.write_sagemaker_root),
the launcher started as its own process, SIGTERM to it (a stop or spot notice) or SIGKILL to the whole process
tree (the instance vanishing; torchrun's workers live in their own sessions, so the tree is walked in /proc).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

TRAINER_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and everything below it, at once (no process gets to react)."""
    pids = [proc.pid] + descendants(proc.pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and _alive(p) for p in pids):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_launcher(sm_root: Path, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TRAINER_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "spotrun_trainer.launcher", "train", "--sm-root", str(sm_root)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def loss_history(output_dir: Path) -> dict[int, float]:
    """step -> loss (exact floats); a step run twice (after a SIGKILL) keeps its last value."""
    path = Path(output_dir) / "loss_history.jsonl"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by SIGKILL
        out[rec["step"]] = float.fromhex(rec["loss"])
    return out


def wait_for_step(proc: subprocess.Popen, output_dir: Path, step: int, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hist = loss_history(output_dir)
        if hist and max(hist) >= step:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    raise TimeoutError(f"step {step} not reached in {timeout}s")
