"""Container entry point: read SageMaker's files, start torchrun, forward SIGTERM, map outcomes to exit codes.

SageMaker starts the container as `<entrypoint> train`. This process is PID 1 (exec-form ENTRYPOINT), so it
receives SageMaker's SIGTERM itself (the training toolkit and shell entrypoints do not forward it).

What it reads (root defaults to /opt/ml; `--sm-root` or SPOTRUN_SM_ROOT point elsewhere for local runs):
    input/config/resourceconfig.json      current_host, hosts (sorted), network_interface_name
    input/config/hyperparameters.json     every value a string; nested trainer fields as `section.field`
    input/config/checkpointconfig.json    LocalPath of the S3-mirrored checkpoint dir (present when configured)
    input/data/<channel>/                 `train` (token shards) and optional `model` (HF model directory)
What it writes: model/ (the exported model, by the trainer), output/failure on a real failure.

Exit codes: 0 when training completed, or when a stop signal arrived and every local worker saved and stopped
(torchrun itself exits 1 then: not a failure); otherwise torchrun's code, with output/failure explaining it.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from spotrun.seams import StopNotice

from .config import ConfigError, TrainConfig

log = logging.getLogger("spotrun_trainer.launcher")

MASTER_PORT = 7777  # the SageMaker training toolkit's choice
DEFAULT_SHUTDOWN_TIMEOUT_S = StopNotice.LAUNCHER_SHUTDOWN_S  # > the ~90 s save budget, < the 120 s notice
LAUNCHER_KEYS = ("nproc_per_node", "shutdown_timeout", "master_port")
RDMA_INSTANCE_PREFIXES = ("ml.p4d", "ml.p4de", "ml.p5")
OFI_NCCL_GLOBS = ("/opt/amazon/ofi-nccl/lib*/libnccl-net*.so", "/opt/aws-ofi-nccl/lib*/libnccl-net*.so",
                  "/usr/local/lib/libnccl-net*.so")


@dataclass(frozen=True)
class SageMakerEnv:
    """What SageMaker told this container, read once at the entry point."""

    root: Path
    current_host: str
    hosts: list[str]
    network_interface_name: str
    instance_type: str
    hyperparameters: dict[str, str]
    checkpoint_local_path: str
    channels: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path) -> "SageMakerEnv":
        root = Path(root)
        cfg_dir = root / "input" / "config"
        resource = _read_json(cfg_dir / "resourceconfig.json", required=True)
        hosts = resource.get("hosts")
        current = resource.get("current_host")
        if not isinstance(hosts, list) or not hosts or current not in hosts:
            raise ConfigError(f"resourceconfig.json: current_host={current!r} must be one of hosts={hosts!r}")
        hp = _read_json(cfg_dir / "hyperparameters.json", required=False)
        bad = [k for k, v in hp.items() if not isinstance(v, str)]
        if bad:
            raise ConfigError(f"hyperparameters.json: {bad[0]}={hp[bad[0]]!r} is invalid: SageMaker passes strings")
        ckpt = _read_json(cfg_dir / "checkpointconfig.json", required=False)
        data_dir = root / "input" / "data"
        channels = {p.name: p for p in sorted(data_dir.iterdir()) if p.is_dir()} if data_dir.is_dir() else {}
        return cls(root=root, current_host=current, hosts=sorted(hosts),
                   network_interface_name=resource.get("network_interface_name", "eth0"),
                   instance_type=resource.get("current_instance_type", ""), hyperparameters=hp,
                   checkpoint_local_path=ckpt.get("LocalPath", ""), channels=channels)


def _read_json(path: Path, *, required: bool) -> dict:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} not found: is this running inside a SageMaker training container?")
        return {}
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return value


@dataclass(frozen=True)
class LaunchPlan:
    command: list[str]
    env: dict[str, str]
    config: TrainConfig
    nnodes: int
    node_rank: int
    nproc_per_node: int
    warnings: list[str]


def _int_hp(hp: dict[str, str], key: str, default: int, minimum: int) -> int:
    raw = hp.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is invalid: expected an integer") from None
    if value < minimum:
        raise ConfigError(f"{key}={raw!r} is invalid: expected an integer >= {minimum}")
    return value


def plan_launch(sm: SageMakerEnv, *, gpu_count: int, efa_devices: list[str], ofi_nccl_found: bool,
                config_path: Path, outcome_dir: Path, python: str = sys.executable) -> LaunchPlan:
    """The exact torchrun command and environment for this host (pure: no I/O, no env reads)."""
    hp = dict(sm.hyperparameters)
    nnodes = len(sm.hosts)
    node_rank = sm.hosts.index(sm.current_host)
    nproc = gpu_count if gpu_count > 0 else _int_hp(hp, "nproc_per_node", 1, 1)
    shutdown_timeout = _int_hp(hp, "shutdown_timeout", DEFAULT_SHUTDOWN_TIMEOUT_S, 1)
    port = _int_hp(hp, "master_port", MASTER_PORT, 1)
    trainer_hp = {k: v for k, v in hp.items() if k not in LAUNCHER_KEYS}

    overrides: dict = {"output_dir": str(sm.root / "model"), "replicate_degree": str(nnodes)}
    data_channel = next((sm.channels[c] for c in ("train", "data") if c in sm.channels), None)
    if data_channel is None and "data.path" not in trainer_hp:
        raise ConfigError(f"no `train` data channel under {sm.root / 'input' / 'data'} and no data.path "
                          f"hyperparameter: found channels {sorted(sm.channels)}")
    if data_channel is not None:
        overrides["data.path"] = str(data_channel)
    if "model" in sm.channels:
        overrides["model.path"] = str(sm.channels["model"])
    if sm.checkpoint_local_path:
        overrides["checkpoint.dir"] = sm.checkpoint_local_path
    config = TrainConfig.from_hyperparameters(trainer_hp, **overrides)
    save_budget = config.checkpoint.notice_seconds - StopNotice.FINISH_S
    if not save_budget < shutdown_timeout <= config.checkpoint.notice_seconds:
        raise ConfigError(f"shutdown_timeout={shutdown_timeout} is invalid: expected more than the emergency-save "
                          f"budget ({save_budget:.0f} s) and at most the stop notice "
                          f"({config.checkpoint.notice_seconds:.0f} s)")

    # Single host: loopback needs no name resolution (algo-1 resolves only inside SageMaker).
    master_addr = sm.hosts[0] if nnodes > 1 else "127.0.0.1"
    env = {"SPOTRUN_OUTCOME_DIR": str(outcome_dir), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown_timeout)}
    warnings: list[str] = []
    if nnodes > 1:
        env["NCCL_SOCKET_IFNAME"] = sm.network_interface_name
    if efa_devices:
        env["FI_PROVIDER"] = "efa"
        if sm.instance_type.startswith(RDMA_INSTANCE_PREFIXES):
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        if nnodes > 1 and not ofi_nccl_found:
            warnings.append("EFA devices exist but the aws-ofi-nccl plugin was not found: NCCL will fall back to "
                            "TCP sockets (the usual cause of '2 nodes no faster than 1'); use the SageMaker PyTorch "
                            "base image or install aws-ofi-nccl")
    command = [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node_rank", str(node_rank),
               "--master_addr", master_addr, "--master_port", str(port), "--nproc_per_node", str(nproc),
               "--max_restarts", "0", "--shutdown-timeout", str(shutdown_timeout),
               "-m", "spotrun_trainer.train", "--config", str(config_path)]
    return LaunchPlan(command=command, env=env, config=config, nnodes=nnodes, node_rank=node_rank,
                      nproc_per_node=nproc, warnings=warnings)


def read_outcomes(outcome_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(outcome_dir).glob("rank*.json"))]


def decide_exit(returncode: int, *, signalled: bool, outcomes: list[dict], nproc: int) -> tuple[int, str, str]:
    """(exit code, failure message or "", warning or ""). A stop signal ends the job cleanly unless a worker
    reported an error: torchrun exits 1 even after every worker saved and stopped, and workers still importing
    when the signal came die without reporting (their last checkpoint is intact: nothing is lost)."""
    if returncode == 0:
        return 0, "", ""
    failed = [o for o in outcomes if o.get("status") == "failed"]
    if failed:
        return returncode or 1, failed[0].get("message") or "a worker failed", ""
    if signalled:
        stopped = sum(1 for o in outcomes if o.get("status") == "stopped")
        if stopped == nproc:
            return 0, "", ""
        return 0, "", (f"stopped by signal; {nproc - stopped} of {nproc} local workers exited before reporting "
                       "(still starting, or killed at the shutdown timeout): the newest complete checkpoint stands")
    return (returncode if returncode > 0 else 1), f"torchrun exited with code {returncode} without a worker error " \
        "report", ""


class StopSignal:
    """SIGTERM/SIGINT, caught from the launcher's first instruction and forwarded to torchrun once it runs.

    NOTE: as PID 1 in the container, a signal without a handler is simply ignored by the kernel: an early stop
    would be lost and SageMaker would SIGKILL the job 120 s later. So the handler goes in before anything else."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.child: subprocess.Popen | None = None
        self._forwarded = False

    def install(self) -> "StopSignal":
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        if self.received is None:
            self.received = signum
        self.forward()

    def forward(self) -> None:
        """Send the stop to torchrun once: a second signal during its graceful shutdown would cut the wait for
        the workers' emergency save short."""
        if self.received is not None and self.child is not None and not self._forwarded:
            self._forwarded = True
            self.child.send_signal(self.received)  # torchrun forwards it to every worker within milliseconds


def run(plan: LaunchPlan, *, failure_file: Path, outcome_dir: Path, stop: StopSignal) -> int:
    for w in plan.warnings:
        log.warning(w)
    if stop.received is not None:
        log.info("stop signal before training started: exiting without starting torchrun")
        return 0
    log.info("launch: %s", " ".join(plan.command))
    stop.child = subprocess.Popen(plan.command, env={**os.environ, **plan.env})
    stop.forward()  # a stop that arrived while torchrun was being started
    rc = stop.child.wait()
    _reap_orphans()
    code, message, warning = decide_exit(rc, signalled=stop.received is not None,
                                         outcomes=read_outcomes(outcome_dir), nproc=plan.nproc_per_node)
    if warning:
        log.warning(warning)
    if message:
        failure_file.parent.mkdir(parents=True, exist_ok=True)
        failure_file.write_text(message + "\n")
        log.error("training failed: %s", message)
    return code


def _reap_orphans() -> None:
    """As PID 1, orphaned processes (workers of a killed torchrun) are re-parented here: collect them."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="spotrun container entry point (SageMaker runs it with `train`)")
    parser.add_argument("mode", nargs="?", default="train", choices=["train"], help="SageMaker passes `train`")
    parser.add_argument("--sm-root", default=os.environ.get("SPOTRUN_SM_ROOT", "/opt/ml"),
                        help="root of SageMaker's files (default /opt/ml; env SPOTRUN_SM_ROOT)")
    stop = StopSignal().install()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = Path(args.sm_root)
    failure_file = root / "output" / "failure"
    try:
        sm = SageMakerEnv.read(root)
        work = Path(tempfile.mkdtemp(prefix="spotrun-"))
        gpu_count = _gpu_count()
        plan = plan_launch(sm, gpu_count=gpu_count, efa_devices=sorted(glob.glob("/dev/infiniband/uverbs*")),
                           ofi_nccl_found=any(glob.glob(g) for g in OFI_NCCL_GLOBS),
                           config_path=work / "train_config.json", outcome_dir=work / "outcome")
    except ConfigError as exc:
        failure_file.parent.mkdir(parents=True, exist_ok=True)
        failure_file.write_text(f"invalid configuration: {exc}\n")
        log.error("invalid configuration: %s", exc)
        return 2
    (work / "train_config.json").write_text(plan.config.to_json())
    return run(plan, failure_file=failure_file, outcome_dir=work / "outcome", stop=stop)


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch/CUDA means CPU
        return 0


if __name__ == "__main__":
    sys.exit(main())
