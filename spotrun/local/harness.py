"""Run the container's entry point locally, as SageMaker would, and interrupt it the ways spot capacity does.

Used by `spotrun local`, `make demo`, the tests and the benchmarks: a SageMaker-shaped root
(`write_sagemaker_root`), the launcher started as its own process, SIGTERM to it (a stop or spot notice) or
SIGKILL to the whole process tree (the instance vanishing; torchrun's workers live in their own sessions, so the
tree is walked in /proc).
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

LOSS_FILE = "loss_history.jsonl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_sagemaker_root(root: Path, *, hyperparameters: dict, channels: dict[str, Path], checkpoint_dir: Path | None,
                         hosts: tuple[str, ...] = ("algo-1",), current_host: str = "algo-1",
                         network_interface_name: str = "eth0") -> Path:
    """Lay out the files SageMaker gives a training container under `root` (instead of /opt/ml), so the
    launcher runs locally exactly as in the job. Channels are symlinked; hyperparameter values become strings.
    `network_interface_name`: SageMaker's is eth0; hosts on loopback (several nodes on one machine) need `lo`."""
    root = Path(root)
    cfg = root / "input" / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "resourceconfig.json").write_text(json.dumps(
        {"current_host": current_host, "hosts": list(hosts), "network_interface_name": network_interface_name}))
    (cfg / "hyperparameters.json").write_text(json.dumps(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in hyperparameters.items()}))
    if checkpoint_dir is not None:
        (cfg / "checkpointconfig.json").write_text(json.dumps({"LocalPath": str(checkpoint_dir)}))
    data = root / "input" / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, path in channels.items():
        link = data / name
        if not link.exists():
            link.symlink_to(Path(path).resolve(), target_is_directory=True)
    return root


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


def launchers_running(sm_root: Path) -> list[int]:
    """Processes still running the launcher on `sm_root` (left behind by a `spotrun local` that was killed)."""
    wanted = str(Path(sm_root))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"spotrun_trainer.launcher" in args and wanted.encode() in args and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def start_launcher(sm_root: Path, log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The launcher as its own process; `env` adds to this environment (as the job's `Environment` would).
    Its temporary files (the launcher's, torchrun's) go under `<sm_root>/tmp`: a launcher killed outright leaves
    them in the job's directory, not in the machine's temporary directory."""
    env = {**os.environ, **(env or {})}
    env.setdefault("OMP_NUM_THREADS", "1")
    scratch = Path(sm_root) / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(scratch)
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "spotrun_trainer.launcher", "train", "--sm-root", str(sm_root)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def loss_records(output_dir: Path) -> list[tuple[int, float]]:
    """Every (step, loss) line in the order written: a step run twice (after a hard kill) appears twice.

    Each line carries the loss readable (`loss`) and exact (`loss_hex`, float.hex); the exact one is used. A line
    torn by SIGKILL is skipped."""
    path = Path(output_dir) / LOSS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            exact = rec.get("loss_hex", rec["loss"])
            out.append((int(rec["step"]), float.fromhex(exact) if isinstance(exact, str) else float(exact)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return out


def loss_history(output_dir: Path) -> dict[int, float]:
    """step -> loss (exact floats); a step run twice (after a SIGKILL) keeps its last value."""
    return dict(loss_records(output_dir))


def val_history(output_dir: Path) -> dict[int, float]:
    """step -> validation loss (exact floats, from `val_loss_hex`), step 0 the base model's; a step evaluated
    twice (after a SIGKILL) keeps its last value. Torn lines are skipped."""
    path = Path(output_dir) / LOSS_FILE
    out: dict[int, float] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
            out[int(rec["step"])] = float.fromhex(rec["val_loss_hex"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
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
