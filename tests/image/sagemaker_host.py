"""A SageMaker training host made of one container of the trainer image: `/opt/ml` laid out as SageMaker lays it
(a bind-mounted directory), the container started as SageMaker starts it (`docker run <image> train`), stopped
as SageMaker stops it (`docker stop -t 120`: SIGTERM, then 120 s before SIGKILL), and its results read back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from spotrun.local.harness import loss_records
from tests.trainer.hosts import CheckpointPrefix

from .images import docker

SM = "/opt/ml"
STOP_GRACE_S = 120  # StopTrainingJob / a spot notice: SIGTERM, then 120 s


def lay_out(root: Path, *, host: str, hosts: list[str], hyperparameters: dict, channels: dict[str, Path],
            prefix: CheckpointPrefix | None = None) -> Path:
    """SageMaker's files for one host under `root` (mounted at /opt/ml): input/config/{resourceconfig,
    hyperparameters (every value a string), checkpointconfig}.json, input/data/<channel>/ (copied: a symlink would
    not resolve inside the container), checkpoints/ (the job's checkpoint `prefix`, copied down as SageMaker does
    at a start, `prefix.upload` after the hosts exit; empty without one), model/, output/."""
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": host, "current_instance_type": "ml.m5.xlarge", "current_group_name": "homogeneousCluster",
         "hosts": sorted(hosts), "network_interface_name": "eth0"}))
    (config / "hyperparameters.json").write_text(json.dumps(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in hyperparameters.items()}))
    (config / "checkpointconfig.json").write_text(json.dumps({"LocalPath": f"{SM}/checkpoints"}))
    for name, source in channels.items():
        shutil.copytree(source, root / "input" / "data" / name)
    for sub in ("model", "output"):
        (root / sub).mkdir()
    if prefix is None:
        (root / "checkpoints").mkdir()
    else:
        prefix.download(root / "checkpoints")
    return root


@dataclass
class Host:
    """One running (or finished) container: a SageMaker host named `host` on `network`."""

    name: str
    root: Path
    host: str

    @classmethod
    def start(cls, image: str, root: Path, *, host: str, name: str, network: str | None = None) -> "Host":
        net = ["--network", network, "--network-alias", host] if network else []
        docker("run", "--detach", "--name", name, "--hostname", host, *net, "--volume", f"{root}:{SM}",
               image, "train")
        return cls(name=name, root=root, host=host)

    def pid1(self) -> list[str]:
        """PID 1's command line inside the container."""
        return docker("exec", self.name, "cat", "/proc/1/cmdline").split("\0")[:-1]

    def wait_for_step(self, step: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = loss_records(self.root / "model")
            if records and records[-1][0] >= step:
                return
            if not self.running():
                raise AssertionError(f"{self.name} exited before step {step}:\n{self.logs()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name}: step {step} not reached in {timeout} s:\n{self.logs()[-3000:]}")

    def running(self) -> bool:
        return docker("inspect", "--format", "{{.State.Running}}", self.name).strip() == "true"

    def wait(self, timeout: float = 600) -> int:
        return int(docker("wait", self.name, timeout=timeout).strip())

    def logs(self) -> str:
        """The container's output, stdout and stderr interleaved as written."""
        return subprocess.run(["docker", "logs", self.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=60).stdout

    def remove(self) -> None:
        docker("rm", "--force", self.name, check=False)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model"


def stop(*hosts: Host) -> float:
    """`docker stop -t 120` every host at once (the CLI signals them in parallel), as SageMaker stops a job's
    instances; returns the seconds it took."""
    started = time.monotonic()
    docker("stop", "--time", str(STOP_GRACE_S), *(h.name for h in hosts), timeout=STOP_GRACE_S + 60)
    return time.monotonic() - started


def exit_code(host: Host) -> int:
    return int(docker("inspect", "--format", "{{.State.ExitCode}}", host.name).strip())
