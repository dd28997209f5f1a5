"""Container entry point: read SageMaker's files, start torchrun, forward SIGTERM, map outcomes to exit codes.

SageMaker starts the container as `<entrypoint> train`. This process is PID 1 (exec-form ENTRYPOINT), so it
receives SageMaker's SIGTERM itself (the training toolkit and shell entrypoints do not forward it).

What it reads (root defaults to /opt/ml; `--sm-root` or SPOTRUN_SM_ROOT point elsewhere for local runs):
    input/config/resourceconfig.json      current_host, hosts (sorted), network_interface_name
    input/config/hyperparameters.json     every value a string; nested trainer fields as `section.field`
    input/config/checkpointconfig.json    LocalPath of the S3-mirrored checkpoint dir (present when configured)
    input/data/<channel>/                 `train` (token shards), optional `validation` (token shards; else the
                                          train channel's `validation/` split, when prepare wrote one) and
                                          optional `model` (HF model directory)
What it writes: model/ (the exported model, by the trainer), output/failure on a real failure.

Exit codes: 0 when training completed, or when a stop signal arrived and every local worker saved and stopped;
2 for a configuration error, found here before torchrun starts (the config's own and cross-field rules,
check_inputs, check_network); 1 when the image cannot import what the trainer needs (output/failure names the
underlying error); 3 when training stopped although this host got no stop signal (another host's stop stops
every host at the same step, with a committed checkpoint: the job did not complete, and exiting 0 would make
SageMaker report it Completed); otherwise torchrun's code (128 + N when torchrun died of signal N), with
output/failure explaining it.

Multi-host networking: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME both name resourceconfig.json's
network_interface_name (unless the job's environment sets them). Without GLOO_SOCKET_IFNAME gloo binds the
address the hostname resolves to, and where /etc/hosts does not list the hostname that is 127.0.0.1: every rank
then advertises loopback to its peers and `connectFullMesh` fails across hosts. Where the named interface does
not exist on this host, the launcher uses the interface its route to the master host (hosts[0]) leaves by, and
logs it: the SageMaker Python SDK's local mode names `ethwe` (SageMaker's own platform names an interface its
instances have) while its containers have only Docker's `eth0` (check_network).
"""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from spotrun.seams import VALIDATION_CHANNEL, DatasetIndex, StopNotice
from spotrun.settings.checks import ConfigError, short_repr
from spotrun.settings.tree import TrainConfig
from spotrun.settings.wire import job_config, parse, to_json

from .data import VALIDATION_DIR, DataError, read_index
from .outcome import OUTCOME_DIR_ENV, Outcome, read_outcomes

log = logging.getLogger("spotrun_trainer.launcher")

MASTER_PORT = 7777  # the SageMaker training toolkit's choice
DEFAULT_SHUTDOWN_TIMEOUT_S = StopNotice.LAUNCHER_SHUTDOWN_S  # > the ~90 s save budget, < the 120 s notice
LAUNCHER_KEYS = ("nproc_per_node", "shutdown_timeout", "master_port")
RDMA_INSTANCE_PREFIXES = ("ml.p4d", "ml.p4de", "ml.p5")
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")  # both bound to network_interface_name
PEER_STOPPED_EXIT = 3
# DescribeTrainingJob's FailureReason holds at most 1,024 characters (botocore's service model, shape
# FailureReason): the failure file is cut to fit, so the reason SageMaker shows is ours and readable.
FAILURE_REASON_MAX = 1024
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
            raise ConfigError(f"resourceconfig.json: current_host={short_repr(current)} must be one of "
                              f"hosts={short_repr(hosts)}")
        hp = _read_json(cfg_dir / "hyperparameters.json", required=False)
        bad = [k for k, v in hp.items() if not isinstance(v, str)]
        if bad:
            raise ConfigError(f"hyperparameters.json: {bad[0]}={short_repr(hp[bad[0]])} is invalid: SageMaker "
                              "passes strings")
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
        raise ConfigError(f"{key}={short_repr(raw)} is invalid: expected an integer") from None
    if value < minimum:
        raise ConfigError(f"{key}={short_repr(raw)} is invalid: expected an integer >= {minimum}")
    return value


def plan_launch(sm: SageMakerEnv, *, gpu_count: int, efa_devices: list[str], ofi_nccl_found: bool,
                config_path: Path, outcome_dir: Path, python: str = sys.executable,
                job_env: Mapping[str, str] | None = None) -> LaunchPlan:
    """The exact torchrun command and environment for this host (pure: no I/O, no env reads). `job_env`: the
    container's environment (the job's `Environment`); a socket interface it names is left as it is."""
    job_env = job_env or {}
    hp = dict(sm.hyperparameters)
    nnodes = len(sm.hosts)
    node_rank = sm.hosts.index(sm.current_host)
    nproc = gpu_count if gpu_count > 0 else _int_hp(hp, "nproc_per_node", 1, 1)
    shutdown_timeout = _int_hp(hp, "shutdown_timeout", DEFAULT_SHUTDOWN_TIMEOUT_S, 1)
    port = _int_hp(hp, "master_port", MASTER_PORT, 1)
    trainer_hp = {k: v for k, v in hp.items() if k not in LAUNCHER_KEYS}

    overrides: dict = {"output_dir": str(sm.root / "model"), "sharding.nodes": str(nnodes)}
    data_channel = next((sm.channels[c] for c in ("train", "data") if c in sm.channels), None)
    if data_channel is None and "data.path" not in trainer_hp:
        raise ConfigError(f"no `train` data channel under {sm.root / 'input' / 'data'} and no data.path "
                          f"hyperparameter: found channels {sorted(sm.channels)}")
    if data_channel is not None:
        overrides["data.path"] = str(data_channel)
    if VALIDATION_CHANNEL in sm.channels:
        overrides["data.validation_path"] = str(sm.channels[VALIDATION_CHANNEL])
    elif data_channel is not None and (data_channel / VALIDATION_DIR / DatasetIndex.FILE).is_file():
        overrides["data.validation_path"] = str(data_channel / VALIDATION_DIR)  # prepare's validation_fraction
    if "model" in sm.channels:
        overrides["model.path"] = str(sm.channels["model"])
    if sm.checkpoint_local_path:
        overrides["checkpoint.dir"] = sm.checkpoint_local_path
    if parse(trainer_hp).tracking.mlflow_uri:  # what the tracker logs as the run's parameters
        overrides.update({"tracking.instance_type": sm.instance_type, "tracking.instance_count": str(nnodes),
                          "tracking.params": dict(hp)})
    config = job_config(trainer_hp, **overrides)
    save_budget = config.checkpoint.notice_seconds - StopNotice.FINISH_S
    if not save_budget < shutdown_timeout <= config.checkpoint.notice_seconds:
        raise ConfigError(f"shutdown_timeout={shutdown_timeout} is invalid: expected more than the emergency-save "
                          f"budget ({save_budget:.0f} s) and at most the stop notice "
                          f"({config.checkpoint.notice_seconds:.0f} s)")

    # Single host: loopback needs no name resolution (algo-1 resolves only inside SageMaker).
    master_addr = sm.hosts[0] if nnodes > 1 else "127.0.0.1"
    env = {OUTCOME_DIR_ENV: str(outcome_dir), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown_timeout)}
    warnings: list[str] = []
    if nnodes > 1:
        env.update({var: sm.network_interface_name for var in SOCKET_IFNAME_VARS if var not in job_env})
        if gpu_count > 0:
            # The transport NCCL picked, once per communicator: "NET/OFI Selected Provider is efa" or "NET/Socket"
            # (a silent fallback to TCP is the usual cause of "2 nodes no faster than 1").
            env["NCCL_DEBUG"] = "INFO"
            env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
        spans = config.sharding.mode == "full" or config.sharding.group_nodes > 1
        if spans and not efa_devices:
            warnings.append(f"sharding.mode={config.sharding.mode} with shard groups spanning nodes but no EFA "
                            "devices: every layer's all-gather and reduce-scatter crosses nodes over TCP sockets; "
                            "use an EFA instance type, or sharding.mode=hybrid with sharding.group_nodes=1")
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


def check_inputs(config: TrainConfig, *, world_size: int) -> None:
    """Configuration errors that would otherwise surface in every worker after a full start-up (importing torch,
    joining the process group): the model can be built as a causal LM, the dataset exists and holds one step.
    Raises ConfigError naming the field; reads the model's config.json and the dataset's index only."""
    _check_model(config)

    try:
        index = read_index(Path(config.data.path))
    except (DataError, OSError) as exc:
        raise ConfigError(f"data.path={short_repr(config.data.path)} is invalid: {exc}") from None
    seq_len = config.data.seq_len
    if config.data.validation_path:
        try:
            held_out = read_index(Path(config.data.validation_path))
        except (DataError, OSError) as exc:
            raise ConfigError(f"data.validation_path={short_repr(config.data.validation_path)} is invalid: "
                              f"{exc}") from None
        if not any(int(s["tokens"]) >= seq_len for s in held_out[DatasetIndex.SHARDS]):
            raise ConfigError(f"data.validation_path={short_repr(config.data.validation_path)} is invalid: it holds no "
                              f"sample of data.seq_len={seq_len} tokens")
    samples = sum(int(s["tokens"]) // seq_len for s in index[DatasetIndex.SHARDS])
    needed = config.training.micro_batch * world_size
    if samples < needed:
        raise ConfigError(f"data.seq_len={seq_len} is invalid for this dataset: it holds {samples} samples of "
                          f"{seq_len} tokens and one step needs micro_batch x processes = {needed}")


def check_network(plan: LaunchPlan, sm: SageMakerEnv, *, interfaces: list[str] | None,
                  route_interface: Callable[[str], str | None] = lambda host: None) -> LaunchPlan:
    """The plan with NCCL and gloo bound to an interface this host has (`interfaces`: /sys/class/net; None when
    unknown). The one resourceconfig.json names when it exists; otherwise the one `route_interface(hosts[0])`
    says the route to the master host leaves by (SageMaker local mode's `ethwe`), logged; a ConfigError when
    there is none."""
    bound = [var for var in SOCKET_IFNAME_VARS if var in plan.env]
    named = sm.network_interface_name
    if interfaces is None or not bound or named in interfaces:
        return plan
    routed = route_interface(sm.hosts[0])
    if routed is None or routed not in interfaces:
        raise ConfigError(f"network_interface_name={short_repr(named)} in resourceconfig.json is invalid: no such "
                          f"network interface on this host (found {', '.join(sorted(interfaces))}) and no route to the "
                          f"master host {sm.hosts[0]} to take the interface from; set "
                          f"{' and '.join(SOCKET_IFNAME_VARS)} in the job's environment to choose one")
    log.warning("network_interface_name=%r in resourceconfig.json does not exist on this host (found %s): %s bound "
                "to %s, the interface the route to the master host %s leaves by", named, sorted(interfaces),
                " and ".join(bound), routed, sm.hosts[0])
    return replace(plan, env={**plan.env, **{var: routed for var in bound}})


def interface_routing_to(host: str) -> str | None:
    """The network interface holding the source address of this host's route to `host`, or None when `host` does
    not resolve or no interface holds that address. Connecting a UDP socket picks the route and sends nothing."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, MASTER_PORT, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            source = probe.getsockname()[0]
    except OSError:
        return None
    return next((name for name, addresses in psutil.net_if_addrs().items()
                 if any(a.address.split("%")[0] == source for a in addresses)), None)


def _check_model(config: TrainConfig) -> None:
    # transformers takes ~5 s to import: the launcher loads it only to check a model before torchrun
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model = config.model
    if model.path:
        field_name, path = "model.path", Path(model.path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ConfigError(f"model.path={short_repr(model.path)} is invalid: expected a Hugging Face model "
                              f"directory with config.json (the `model` channel); {config_file} not found")
        try:
            raw = json.loads(config_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"model.path={short_repr(model.path)} is invalid: {config_file} unreadable "
                              f"({exc})") from None
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        field_name = "model_type in model.path/config.json"
    else:
        raw = dict(model.config)
        model_type = raw.pop("model_type", None)
        field_name = "model.config.model_type"
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING_NAMES), n=3)
        hint = f" (close matches: {', '.join(close)})" if close else " (e.g. llama, qwen2, mistral, gpt2)"
        raise ConfigError(f"{field_name}={short_repr(model_type)} is invalid: expected a model type known to "
                          f"transformers{hint}")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(f"{field_name}={short_repr(model_type)} is invalid: transformers has no causal LM for it "
                          "(AutoModelForCausalLM); expected a decoder model type such as llama, qwen2, gpt2")
    if model.activation_checkpointing:
        model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
        if not getattr(model_class, "supports_gradient_checkpointing", False):
            raise ConfigError(f"model.activation_checkpointing=true is invalid for {model_type}: "
                              f"{model_class.__name__} does not support it; expected false")
    try:
        if model.path:
            AutoConfig.from_pretrained(model.path)
        else:
            AutoConfig.for_model(model_type, **raw)
    except ImportError:
        raise  # the image is broken, not the configuration: main() reports the underlying error
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; each is a configuration error here
        raise ConfigError(f"{'model.path' if model.path else 'model.config'} is invalid: transformers could not "
                          f"build a {model_type} config from it ({_one_line(str(exc), 300)})") from None


def import_failure(exc: ImportError) -> str:
    """The failure file's text for an image whose Python environment cannot import what the trainer needs.
    transformers wraps the real error ("Could not import module 'LlamaConfig'...") as its cause: name that one."""
    root: BaseException = exc
    seen = {id(exc)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        root = nxt
        seen.add(id(nxt))
    wrapper = "" if root is exc else f" (raised as {type(exc).__name__}: {exc})"
    return _one_line(f"broken image: the trainer's imports fail: {type(root).__name__}: {root}{wrapper}",
                     FAILURE_REASON_MAX)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decide_exit(returncode: int, *, signalled: bool, outcomes: list[Outcome], nproc: int) -> tuple[int, str, str]:
    """(exit code, failure message or "", warning or ""). A stop signal ends the job cleanly unless a worker
    reported an error: torchrun exits 1 even after every worker saved and stopped, and workers still importing
    when the signal came die without reporting (their last checkpoint is intact: nothing is lost).

    A stop this host was not sent (a peer host's, carried by the per-step agreement) is not a success: SageMaker
    reads exit 0 as Completed, and this host has neither the export nor a reason to show. It exits
    PEER_STOPPED_EXIT with the failure file naming the stop and the checkpoint a restart resumes from."""
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        return exit_status(returncode) or 1, failed[0].message or "a worker failed", ""
    stopped = [o for o in outcomes if o.status == "stopped"]
    if stopped and not signalled:
        who = ("a worker on this host was sent a stop signal directly (not through this launcher)"
               if any(o.signalled for o in stopped) else "another host of this job was sent a stop signal")
        return PEER_STOPPED_EXIT, (f"training did not complete: {who}, and a stop on any host stops every host at "
                                   f"the same step: {stopped[0].message}"), ""
    if returncode == 0:
        return 0, "", ""
    completed = sum(1 for o in outcomes if o.status == "completed")
    if completed == nproc and not signalled:
        # NOTE: every worker finished its part (the export included) and said so; a worker can still die after
        # that, in the interpreter's teardown, when gloo's threads outlive it (SIGABRT, "terminate called without
        # an active exception": pytorch/pytorch#190489, #179291). SageMaker would read the exit code as a failed
        # job and a retry would pay for work that is done.
        return 0, "", (f"every local worker completed and reported; torchrun then exited with code {returncode} "
                       "(a worker died in the interpreter's teardown, after its work): the run is complete")
    if signalled:
        # A worker that had finished (a stop during the export lets it complete) reported as much as one that
        # stopped: either way its part of the run is safe.
        reported = sum(1 for o in outcomes if o.status in ("stopped", "completed"))
        if reported == nproc:
            return 0, "", ""
        return 0, "", (f"stopped by signal; {nproc - reported} of {nproc} local workers exited before reporting "
                       "(still starting, or killed at the shutdown timeout): the newest complete checkpoint stands")
    return exit_status(returncode), f"torchrun exited with code {returncode} without a worker error report", ""


def exit_status(returncode: int) -> int:
    """An exit status for torchrun's return code: a death by signal N (Popen's -N) as a shell reports it, 128 + N.
    NOTE: passed on as it is, -6 would become 250 and -15 241 (the status is a byte), naming no signal."""
    return 128 - returncode if returncode < 0 else returncode


class StopSignal:
    """SIGTERM/SIGINT, caught from the launcher's first instruction and forwarded as SIGTERM once torchrun runs.

    NOTE: as PID 1 in the container, a signal without a handler is simply ignored by the kernel: an early stop
    would be lost and SageMaker would SIGKILL the job 120 s later. So the handler goes in before anything else.
    The stop goes to torchrun's workers, not to torchrun: the workers save and exit 0, and torchrun then exits 0
    as after any successful run. A signal to torchrun itself makes its agent raise SignalException, which it
    prints as a traceback and turns into exit 1 although nothing failed."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.child: subprocess.Popen | None = None
        self._forwarded = False
        self.forwarded_at: float | None = None

    def install(self) -> "StopSignal":
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        if self.received is None:
            self.received = signum
        self.forward()

    def forward(self) -> None:
        """Send the stop once: a second signal during the workers' emergency save would cut it short."""
        if self.received is not None and self.child is not None and not self._forwarded:
            self._forwarded = True
            self.forwarded_at = time.monotonic()
            workers = _children(self.child.pid)
            if not workers:  # torchrun has not started them yet: it stops itself and starts none
                self.child.send_signal(signal.SIGTERM)
            for pid in workers:
                _signal(pid, signal.SIGTERM)

    def kill_overdue(self, timeout_s: float) -> None:
        """torchrun's own rule, kept now that the stop bypasses it: workers still running `timeout_s` after the
        stop are killed (their newest complete checkpoint stands)."""
        if self.forwarded_at is not None and self.child is not None \
                and time.monotonic() - self.forwarded_at > timeout_s:
            for pid in _children(self.child.pid):
                _signal(pid, signal.SIGKILL)
            self.forwarded_at = None


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (torchrun's workers), from /proc."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(Path(stat).parent.name))
    return found


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def run(plan: LaunchPlan, *, failure_file: Path, outcome_dir: Path, stop: StopSignal) -> int:
    for w in plan.warnings:
        log.warning(w)
    if stop.received is not None:
        log.info("stop signal before training started: exiting without starting torchrun")
        return 0
    log.info("launch: %s", " ".join(plan.command))
    stop.child = subprocess.Popen(plan.command, env={**os.environ, **plan.env})
    stop.forward()  # a stop that arrived while torchrun was being started
    shutdown_timeout = float(plan.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])
    while True:
        try:
            rc = stop.child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            stop.kill_overdue(shutdown_timeout)
    _reap_orphans()
    code, message, warning = decide_exit(rc, signalled=stop.received is not None,
                                         outcomes=read_outcomes(outcome_dir), nproc=plan.nproc_per_node)
    if warning:
        log.warning(warning)
    if message:
        write_failure(failure_file, message)
        log.error("training failed: %s", message)
    return code


def write_failure(failure_file: Path, message: str) -> None:
    """SageMaker's failure file: the reason DescribeTrainingJob shows, cut to the API's limit."""
    if len(message) > FAILURE_REASON_MAX:
        message = message[: FAILURE_REASON_MAX - 3] + "..."
    failure_file.parent.mkdir(parents=True, exist_ok=True)
    failure_file.write_text(message + "\n")


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
    # The trainer's config and the workers' outcomes live for this launch only: removed however it ends (but by
    # SIGKILL, which `spotrun local` meets by pointing TMPDIR into the job's directory).
    with tempfile.TemporaryDirectory(prefix="spotrun-") as work:
        return _launch(root, Path(work), stop)


def _launch(root: Path, work: Path, stop: StopSignal) -> int:
    failure_file = root / "output" / "failure"
    try:
        sm = SageMakerEnv.read(root)
        gpu_count = _gpu_count()
        plan = plan_launch(sm, gpu_count=gpu_count, efa_devices=sorted(glob.glob("/dev/infiniband/uverbs*")),
                           ofi_nccl_found=any(glob.glob(g) for g in OFI_NCCL_GLOBS),
                           config_path=work / "train_config.json", outcome_dir=work / "outcome",
                           job_env=os.environ)
        plan = check_network(plan, sm, interfaces=_interfaces(), route_interface=interface_routing_to)
        check_inputs(plan.config, world_size=plan.nnodes * plan.nproc_per_node)
    except ConfigError as exc:
        write_failure(failure_file, f"invalid configuration: {exc}")
        log.error("invalid configuration: %s", exc)
        return 2
    except ImportError as exc:
        write_failure(failure_file, import_failure(exc))
        log.exception("the trainer's imports fail in this image")
        return 1
    (work / "train_config.json").write_text(to_json(plan.config))
    return run(plan, failure_file=failure_file, outcome_dir=work / "outcome", stop=stop)


def _interfaces() -> list[str] | None:
    try:
        return os.listdir("/sys/class/net")
    except OSError:
        return None  # cannot tell: let NCCL/gloo report it


def _gpu_count() -> int:
    try:
        import torch  # the launcher process runs without torch (its workers import it): only this count needs it

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch/CUDA means CPU
        return 0


if __name__ == "__main__":
    sys.exit(main())
