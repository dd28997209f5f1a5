"""The SageMaker Python SDK's own local mode running the trainer image: sagemaker-train's `ModelTrainer` with
`Mode.LOCAL_CONTAINER` and `Compute(instance_type="local_cpu", instance_count=N)`, which lays out each host's
`/opt/ml`, writes a compose file (one service per host `algo-1`..`algo-N` on the network `sagemaker-local`) and runs
it with `docker-compose up --abort-on-container-exit`, then packs every host's `/opt/ml/model` into `model.tar.gz`.

Offline, and proved so: the job runs in a child process (`python -m tests.image.sagemaker_sdk SPEC`) started
under `unshare --net` (a network namespace with nothing but a loopback that is down: the Docker daemon is reached
through its Unix socket, no packet can leave), with dummy AWS credentials and a SageMaker user config that opts
out of telemetry (`SAGEMAKER_USER_CONFIG_OVERRIDE`). An audit hook in the child records every name the SDK
resolves and every non-Unix socket it connects (`socket.getaddrinfo`, `socket.connect`): an SDK that tried to
reach STS, S3 or its telemetry endpoint shows there even where it swallows the failure.

What local mode does not do: CheckpointConfig (v3 ignores it) nor a separate `/opt/ml/model` per host (every
host mounts the one directory). The trainer's checkpoint directory is given as the `checkpoint.dir`
hyperparameter instead, at the LocalPath the state machine's CheckpointConfig names; each container's
`/opt/ml/checkpoints` is then its own (not mounted), as on SageMaker during a job.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .images import REPO, docker

SDK_NETWORK = "sagemaker-local"  # the network name local mode writes into every compose file
SDK_CONFIG = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}
OFFLINE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}


@dataclass(frozen=True)
class SdkJob:
    """A finished local-mode job: its container root, the model archive, the SDK's output (the containers' logs
    included) and what the SDK tried to reach beyond Unix sockets."""

    root: Path
    project: str
    model_tar: Path
    log: str
    attempts: list[str]
    seconds: float


def unavailable() -> str | None:
    """Why local mode cannot run here (None: it can), beyond what the other image tests need."""
    if shutil.which("docker-compose") is None:
        return "no docker-compose on PATH (Debian's docker-compose: .ci/dockerd.sh installs it)"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux): the SDK runs in a network namespace of its own"
    try:
        import sagemaker.train.model_trainer  # noqa: F401 - only whether it imports: the child process uses it
    except ImportError as exc:
        return f"sagemaker-train does not import ({exc}): `make venv` installs requirements-dev-nodeps.txt"
    return None


def project_of(root: Path) -> str:
    """The compose project of a job whose container root is `root` (its containers are `<project>_algo-N_1`)."""
    return "".join(c for c in root.name.lower() if c.isalnum() or c in "-_")


def run_job(image: str, root: Path, *, instance_count: int, hyperparameters: dict[str, str],
            channels: dict[str, Path], timeout: float = 900) -> SdkJob:
    """Run the image as a local-mode training job in a child process without a network; raises with the SDK's
    output when the job fails. The caller removes the containers and the network (`remove`)."""
    root.mkdir(parents=True)
    spec, answer = root.parent / f"{root.name}.spec.json", root.parent / f"{root.name}.result.json"
    config = root.parent / f"{root.name}.sagemaker-config.json"
    config.write_text(json.dumps(SDK_CONFIG))  # YAML is a superset of JSON: the SDK's loader reads it
    spec.write_text(json.dumps({"image": image, "root": str(root), "instance_count": instance_count,
                                "hyperparameters": hyperparameters,
                                "channels": {k: str(v) for k, v in channels.items()}}))
    env = {**os.environ, **OFFLINE_ENV, "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
           "COMPOSE_PROJECT_NAME": project_of(root)}
    started = time.monotonic()
    proc = subprocess.run(["unshare", "--net", "--", sys.executable, "-m", "tests.image.sagemaker_sdk", str(spec),
                           str(answer)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    seconds = time.monotonic() - started
    if proc.returncode != 0 or not answer.is_file():
        raise AssertionError(f"the local-mode job failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}")
    result = json.loads(answer.read_text())
    return SdkJob(root=root, project=project_of(root), model_tar=Path(result["model_data"].removeprefix("file://")),
                  log=proc.stdout, attempts=result["attempts"], seconds=seconds)


def exit_codes(project: str) -> dict[str, int]:
    """Each host container's exit code (by compose service name, `algo-N`)."""
    found = {}
    for line in docker("ps", "--all", "--filter", f"label=com.docker.compose.project={project}", "--format",
                       '{{.Label "com.docker.compose.service"}} {{.ID}}').splitlines():
        service, cid = line.split()
        found[service] = int(docker("inspect", "--format", "{{.State.ExitCode}}", cid).strip())
    return found


def remove(root: Path) -> None:
    """`docker-compose down` the job's compose file: its containers and the network."""
    compose = root / "docker-compose.yaml"
    if compose.is_file():
        subprocess.run(["docker-compose", "--file", str(compose), "--project-name", project_of(root), "down",
                        "--remove-orphans", "--timeout", "5"], capture_output=True, timeout=120)


def sdk_network() -> list[str]:
    """The local-mode network's id, when it is on the daemon (every local-mode job on it shares its name)."""
    return docker("network", "ls", "--quiet", "--filter", f"name=^{SDK_NETWORK}$").split()


def leftovers(project: str) -> list[str]:
    """Containers of the job and the local-mode network still on the daemon."""
    containers = docker("ps", "--all", "--quiet", "--filter", f"label=com.docker.compose.project={project}").split()
    return [f"container {c}" for c in containers] + [f"network {n}" for n in sdk_network()]


# ---- the child process: the SDK itself ---------------------------------------------------------------------------


def _watch(attempts: list[str]):
    def hook(event: str, args: tuple) -> None:
        if event == "socket.getaddrinfo":
            attempts.append(f"resolve {args[0]}:{args[1]}")
        elif event == "socket.connect" and args[0].family != socket.AF_UNIX:
            attempts.append(f"connect {args[1]}")
    return hook


def _child(spec_path: Path, answer: Path) -> None:
    attempts: list[str] = []
    sys.addaudithook(_watch(attempts))
    spec = json.loads(spec_path.read_text())
    result = {"model_data": "", "attempts": attempts}
    try:
        # Imported after the audit hook is in: whatever the SDK does when imported is watched too.
        from sagemaker.train.configs import Compute, InputData
        from sagemaker.train.model_trainer import Mode, ModelTrainer

        trainer = ModelTrainer(training_image=spec["image"], training_mode=Mode.LOCAL_CONTAINER,
                               compute=Compute(instance_type="local_cpu", instance_count=spec["instance_count"]),
                               hyperparameters=spec["hyperparameters"], local_container_root=spec["root"],
                               base_job_name="spotrun-sdklocal")
        trainer.train(input_data_config=[InputData(channel_name=name, data_source=path)
                                         for name, path in spec["channels"].items()], wait=True)
        result["model_data"] = str(Path(spec["root"]) / "compressed_artifacts" / "model.tar.gz")
    finally:
        answer.write_text(json.dumps(result))


if __name__ == "__main__":
    _child(Path(sys.argv[1]), Path(sys.argv[2]))
