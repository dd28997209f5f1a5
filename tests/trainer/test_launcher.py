"""The launcher: SageMaker's files to the exact torchrun command and environment, and outcomes to exit codes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from spotrun.local.harness import start_launcher, write_sagemaker_root
from spotrun.settings.checks import ConfigError
from spotrun.settings.sections import ShardingConfig
from spotrun.settings.wire import job_config
from spotrun_trainer.launcher import (
    PEER_STOPPED_EXIT,
    SageMakerEnv,
    check_inputs,
    check_network,
    decide_exit,
    interface_routing_to,
    plan_launch,
)
from spotrun_trainer.outcome import Outcome

HP = {"training.micro_batch": "4", "max_steps": "100", "training.lr": "1e-4", "checkpoint.interval_s": "900"}


def sm_root(tmp_path: Path, hosts: list[str], current: str, hp: dict | None = None, ckpt: bool = True) -> Path:
    cfg = tmp_path / "input" / "config"
    cfg.mkdir(parents=True)
    (cfg / "resourceconfig.json").write_text(json.dumps({
        "current_host": current, "hosts": hosts, "network_interface_name": "eth1",
        "current_instance_type": "ml.p4d.24xlarge"}))
    (cfg / "hyperparameters.json").write_text(json.dumps(HP if hp is None else hp))
    if ckpt:
        (cfg / "checkpointconfig.json").write_text(json.dumps({"LocalPath": "/opt/ml/checkpoints"}))
    for channel in ("train", "model"):
        (tmp_path / "input" / "data" / channel).mkdir(parents=True)
    return tmp_path


def plan(root: Path, *, gpus=8, efa=("/dev/infiniband/uverbs0",), ofi=True, job_env=None):
    return plan_launch(SageMakerEnv.read(root), gpu_count=gpus, efa_devices=list(efa), ofi_nccl_found=ofi,
                       config_path=Path("/tmp/w/cfg.json"), outcome_dir=Path("/tmp/w/outcome"), python="python",
                       job_env=job_env)


def expected_cmd(nnodes: int, rank: int, addr: str, nproc: int) -> list[str]:
    return ["python", "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node_rank", str(rank),
            "--master_addr", addr, "--master_port", "7777", "--nproc_per_node", str(nproc), "--max_restarts", "0",
            "--shutdown-timeout", "110", "-m", "spotrun_trainer.train", "--config", "/tmp/w/cfg.json"]


def test_one_host(tmp_path):
    p = plan(sm_root(tmp_path, ["algo-1"], "algo-1"))
    assert p.command == expected_cmd(1, 0, "127.0.0.1", 8)
    assert p.env == {"SPOTRUN_OUTCOME_DIR": "/tmp/w/outcome", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110",
                     "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}
    assert p.config.sharding.nodes == 1 and p.config.sharding.mode == "full"
    assert p.config.data.path == str(tmp_path / "input" / "data" / "train")
    assert p.config.model.path == str(tmp_path / "input" / "data" / "model")
    assert p.config.output_dir == str(tmp_path / "model")
    assert p.config.checkpoint.dir == "/opt/ml/checkpoints"
    assert (p.config.training.micro_batch, p.config.training.lr, p.config.checkpoint.interval_s) == (4, 1e-4, 900)


def test_two_hosts_second_node(tmp_path):
    p = plan(sm_root(tmp_path, ["algo-2", "algo-1"], "algo-2"))  # hosts are sorted: algo-1 is the master
    assert p.command == expected_cmd(2, 1, "algo-1", 8)
    assert p.env["NCCL_SOCKET_IFNAME"] == "eth1" and p.env["FI_PROVIDER"] == "efa"
    assert p.env["GLOO_SOCKET_IFNAME"] == "eth1"  # gloo (CPU collectives, the step agreement) on the same interface
    assert p.env["NCCL_DEBUG"] == "INFO" and p.env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"  # the transport NCCL picked
    assert p.config.sharding.nodes == 2 and p.warnings == []


def test_four_hosts_without_efa(tmp_path):
    hp = {**HP, "sharding.mode": "hybrid", "sharding.group_nodes": "1"}  # what the planner sends without EFA
    p = plan(sm_root(tmp_path, ["algo-1", "algo-2", "algo-3", "algo-4"], "algo-3", hp), efa=())
    assert p.command == expected_cmd(4, 2, "algo-1", 8)
    assert p.env == {"SPOTRUN_OUTCOME_DIR": "/tmp/w/outcome", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110",
                     "NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_DEBUG": "INFO",
                     "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert p.config.sharding == ShardingConfig(mode="hybrid", group_nodes=1, nodes=4)
    assert p.config.sharding.mesh_shape(32) == (4, 8) and p.warnings == []


def test_socket_interfaces_the_job_environment_sets_are_left_to_it(tmp_path):
    p = plan(sm_root(tmp_path, ["algo-1", "algo-2"], "algo-2"), job_env={"GLOO_SOCKET_IFNAME": "ens5"})
    assert p.env["NCCL_SOCKET_IFNAME"] == "eth1" and "GLOO_SOCKET_IFNAME" not in p.env  # the job's own value wins


def test_a_missing_network_interface_without_a_route_to_the_master_is_a_configuration_error(tmp_path):
    sm = SageMakerEnv.read(sm_root(tmp_path, ["algo-1", "algo-2"], "algo-2"))
    p = plan(tmp_path)
    assert check_network(p, sm, interfaces=["lo", "eth1"]) == p
    with pytest.raises(ConfigError, match=r"^network_interface_name=\"eth1\" in resourceconfig.json is invalid: no "
                                          r"such network interface on this host \(found eth0, lo\) and no "
                                          r"route to the master host algo-1"):
        check_network(p, sm, interfaces=["lo", "eth0"], route_interface=lambda host: None)
    with pytest.raises(ConfigError, match="no route to the master host algo-1"):  # a route by a vanished one
        check_network(p, sm, interfaces=["lo", "eth0"], route_interface=lambda host: "eth7")
    one_host = tmp_path / "one"
    p1 = plan(sm_root(one_host, ["algo-1"], "algo-1"))
    assert check_network(p1, SageMakerEnv.read(one_host), interfaces=["lo"]) == p1


def test_a_missing_network_interface_falls_back_to_the_one_routing_to_the_master(tmp_path, caplog):
    """SageMaker local mode (sagemaker-train) names `ethwe`; its containers have Docker's eth0."""
    sm = SageMakerEnv.read(sm_root(tmp_path, ["algo-1", "algo-2"], "algo-2"))
    asked = []
    p = check_network(plan(tmp_path), sm, interfaces=["lo", "eth0"],
                      route_interface=lambda host: asked.append(host) or "eth0")
    assert asked == ["algo-1"]
    assert p.env["NCCL_SOCKET_IFNAME"] == p.env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert p.command == plan(tmp_path).command
    assert "network_interface_name='eth1' in resourceconfig.json does not exist on this host" in caplog.text
    assert "bound to eth0, the interface the route to the master host algo-1 leaves by" in caplog.text
    # A variable the job's environment sets stays the job's: only the launcher's own binding falls back.
    own = check_network(plan(tmp_path, job_env={"GLOO_SOCKET_IFNAME": "ens5"}), sm, interfaces=["lo", "eth0"],
                        route_interface=lambda host: "eth0")
    assert own.env["NCCL_SOCKET_IFNAME"] == "eth0" and "GLOO_SOCKET_IFNAME" not in own.env


def test_the_interface_routing_to_a_host_is_the_kernels_choice():
    assert interface_routing_to("localhost") == "lo"  # the kernel routes loopback addresses through lo
    assert interface_routing_to("no-such-host.invalid") is None  # RFC 6761: never resolves


@pytest.mark.parametrize("hp, replicas_shard", [({"sharding.mode": "full"}, (1, 32)),
                                                ({"sharding.mode": "hybrid", "sharding.group_nodes": "2"}, (2, 16))])
def test_shard_groups_spanning_nodes_without_efa_warn_about_tcp(tmp_path, hp, replicas_shard):
    p = plan(sm_root(tmp_path, ["algo-1", "algo-2", "algo-3", "algo-4"], "algo-1", {**HP, **hp}), efa=())
    assert p.config.sharding.mesh_shape(32) == replicas_shard
    assert len(p.warnings) == 1 and "crosses nodes over TCP sockets" in p.warnings[0]


@pytest.mark.parametrize("hp, message", [
    ({"sharding.mode": "zero3"}, "sharding.mode=\"zero3\" is invalid: expected full or hybrid"),
    ({"sharding.mode": "hybrid", "sharding.group_nodes": "3"},
     "sharding.group_nodes=3 is invalid: expected a divisor of sharding.nodes=4"),
])
def test_bad_sharding_names_the_field(tmp_path, hp, message):
    with pytest.raises(ConfigError) as err:
        plan(sm_root(tmp_path, ["algo-1", "algo-2", "algo-3", "algo-4"], "algo-1", {**HP, **hp}))
    assert message in str(err.value)


def test_efa_without_the_ofi_nccl_plugin_warns_about_tcp_fallback(tmp_path):
    p = plan(sm_root(tmp_path, ["algo-1", "algo-2"], "algo-1"), ofi=False)
    assert len(p.warnings) == 1 and "fall back to TCP" in p.warnings[0]


def test_cpu_uses_the_configured_process_count(tmp_path):
    p = plan(sm_root(tmp_path, ["algo-1"], "algo-1", {**HP, "nproc_per_node": "3"}), gpus=0, efa=())
    assert "--nproc_per_node" in p.command and p.command[p.command.index("--nproc_per_node") + 1] == "3"


@pytest.mark.parametrize("hp, message", [
    ({"training.micro_batch": "four"}, "training.micro_batch=\"four\" is invalid: expected an integer"),
    ({"training.micro_batch": "0"}, "training.micro_batch=0 is invalid: expected an integer >= 1"),
    ({"training.lr": "fast"}, "training.lr=\"fast\" is invalid: expected a number"),
    ({"deterministic": "maybe"}, "deterministic=\"maybe\" is invalid: expected true or false"),
    ({"checkpoint.keep": "1"}, "checkpoint.keep=1 is invalid: expected an integer >= 2"),
    ({"bogus": "1"}, "unknown field bogus"),
    ({"optim.momentum": "1"}, "unknown field optim.momentum"),
    ({"nproc_per_node": "x"}, "nproc_per_node=\"x\" is invalid: expected an integer"),
    ({"shutdown_timeout": "30"}, "shutdown_timeout=30 is invalid: expected more than the emergency-save budget"),
    ({"model.config": "[1]"}, "model.config=[1] is invalid: expected a JSON object"),
    # non-finite values pass `lr > 0` (inf) and then train to NaN: refused at config time
    ({"training.lr": "inf"}, "training.lr=\"inf\" is invalid: expected a finite number"),
    ({"training.lr": "nan"}, "training.lr=\"nan\" is invalid: expected a finite number"),
    ({"optim.weight_decay": "-Infinity"}, "optim.weight_decay=-Infinity is invalid: expected a finite number"),
    ({"training.epochs": "1e400"}, "training.epochs=1e400 is invalid: expected a finite number"),
    ({"checkpoint.interval_s": "inf"}, "checkpoint.interval_s=\"inf\" is invalid: expected a finite number"),
    ({"model.config": '{"model_type": "llama", "rope_theta": NaN}'}, "model.config={\"model_type\": \"llama\""),
    ({"training.seed": "-3"}, "training.seed=-3 is invalid: expected an integer in [0, 4294967295]"),
    ({"training.seed": str(2**32)}, "training.seed=4294967296 is invalid: expected an integer in [0, 4294967295]"),
    ({"max_steps": str(2**63)}, "max_steps=9223372036854775808 is invalid: expected an integer in ["),
    ({"max_steps": "9" * 5000}, "max_steps=99999"),
    ({"bad\nkey" * 10_000: "1"}, "unknown field \"bad\\nkeybad"),
])
def test_bad_hyperparameters_name_the_field(tmp_path, hp, message):
    with pytest.raises(ConfigError) as err:
        plan(sm_root(tmp_path, ["algo-1"], "algo-1", hp), gpus=0)
    text = str(err.value)
    assert message in text
    assert "\n" not in text and len(text) < 500  # one short line, whatever was passed


@pytest.mark.parametrize("hp, message", [
    ({"eval.keep_best": "true"}, "eval.keep_best=true is invalid: expected false without checkpoints: the best "
     "weights are kept as a checkpoint (checkpoint.dir, the job's CheckpointConfig)"),
    ({"segment_seconds": "3600"}, "segment_seconds=3600.0 is invalid: expected 0 without checkpoints: the next "
     "segment resumes from the checkpoint"),
    ({"export.from": "best"}, "export.from=\"best\" is invalid: expected last, or best with "
     "eval.keep_best=true and validation data"),
])
def test_rules_across_fields_are_configuration_errors_before_torchrun(tmp_path, hp, message):
    with pytest.raises(ConfigError) as err:
        plan(sm_root(tmp_path, ["algo-1", "algo-2"], "algo-1", {**HP, **hp}, ckpt=False), gpus=0)
    assert str(err.value) == message or str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_current_host_must_be_listed(tmp_path):
    with pytest.raises(ConfigError, match=r'current_host="algo-9" must be one of hosts=\["algo-1"'):
        SageMakerEnv.read(sm_root(tmp_path, ["algo-1"], "algo-9"))


def test_non_string_hyperparameter_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="micro_batch=4 is invalid: SageMaker passes strings"):
        SageMakerEnv.read(sm_root(tmp_path, ["algo-1"], "algo-1", {"training.micro_batch": 4}))


def test_missing_resourceconfig_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="resourceconfig.json not found"):
        SageMakerEnv.read(tmp_path)


UNREPORTED = ("stopped by signal; 1 of 2 local workers exited before reporting (still starting, or killed at the "
              "shutdown timeout): the newest complete checkpoint stands")
TEARDOWN = ("every local worker completed and reported; torchrun then exited with code {} (a worker died in the "
            "interpreter's teardown, after its work): the run is complete")


STOPPED = "stopped at step 7; the newest intact checkpoint is step-00000007 (a restart resumes from it)"
PEER = ("training did not complete: another host of this job was sent a stop signal, and a stop on any host stops "
        f"every host at the same step: {STOPPED}")


@pytest.mark.parametrize("rc, signalled, outcomes, expected", [
    (0, False, [], (0, "", "")),
    (0, False, [{"status": "completed"}] * 2, (0, "", "")),
    (1, True, [{"status": "stopped"}, {"status": "stopped"}], (0, "", "")),
    (0, True, [{"status": "stopped", "message": STOPPED, "signalled": True}] * 2, (0, "", "")),
    (1, True, [{"status": "stopped"}], (0, "", UNREPORTED)),
    # a stop during the final export: the workers finish it and report completion; nothing is missing
    (1, True, [{"status": "completed"}, {"status": "completed"}], (0, "", "")),
    (1, True, [{"status": "completed"}, {"status": "stopped"}], (0, "", "")),
    (1, True, [{"status": "completed"}], (0, "", UNREPORTED)),
    # every worker completed, then one died in the interpreter's teardown: the run is done, not failed
    (-6, False, [{"status": "completed"}] * 2, (0, "", TEARDOWN.format(-6))),
    (1, False, [{"status": "completed"}] * 2, (0, "", TEARDOWN.format(1))),
    # one of two completed: the other's part is missing, so the exit code stands
    (1, False, [{"status": "completed"}], (1, "torchrun exited with code 1 without a worker error report", "")),
    (1, True, [{"status": "failed", "message": "boom"}], (1, "boom", "")),
    (1, False, [{"status": "failed", "message": "CUDA out of memory: turn on"}],
     (1, "CUDA out of memory: turn on", "")),
    (1, False, [{"status": "failed"}], (1, "a worker failed", "")),
    # torchrun killed by a signal (Popen's -N) exits as a shell reports it, 128 + N, never as a wrapped byte
    (-9, False, [], (137, "torchrun exited with code -9 without a worker error report", "")),
    (-6, False, [{"status": "failed", "message": "boom"}], (134, "boom", "")),
    (-15, True, [{"status": "failed", "message": "boom"}], (143, "boom", "")),
    # stopped without a signal to this host: a peer's stop; torchrun exits 0, yet the job did not complete
    (0, False, [{"status": "stopped", "message": STOPPED}] * 2, (PEER_STOPPED_EXIT, PEER, "")),
    (0, False, [{"status": "stopped", "message": STOPPED, "signalled": True}],
     (PEER_STOPPED_EXIT, PEER.replace("another host of this job was sent a stop signal", "a worker on this host was "
                                      "sent a stop signal directly (not through this launcher)"), "")),
])
def test_exit_code_mapping(rc, signalled, outcomes, expected):
    outcomes = [Outcome.from_dict(o) for o in outcomes]
    assert decide_exit(rc, signalled=signalled, outcomes=outcomes, nproc=2) == expected


def test_stop_signal_is_forwarded_once_even_if_it_arrived_before_torchrun_started():
    import signal as sig

    from spotrun_trainer.launcher import StopSignal

    class FakeChild:  # a torchrun that has not started its workers yet (no child processes)
        pid = -1

        def __init__(self):
            self.sent = []

        def send_signal(self, signum):
            self.sent.append(signum)

    stop = StopSignal()
    stop._handle(sig.SIGTERM, None)  # before torchrun exists: remembered
    child = FakeChild()
    stop.child = child
    stop.forward()  # right after Popen
    stop._handle(sig.SIGTERM, None)  # a second signal: not forwarded again
    assert stop.received == sig.SIGTERM and child.sent == [sig.SIGTERM]


AGENT = """
import signal, subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
def on_signal(*_):  # what torchrun does: SignalException, a traceback, exit 1
    print("Traceback: SignalException", flush=True)
    sys.exit(1)
signal.signal(signal.SIGTERM, on_signal)
sys.exit(worker.wait())
"""
WORKER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the trainer: save, then exit 0
print("ready", flush=True)
time.sleep(60)
sys.exit(3)
"""


def test_the_stop_goes_to_the_workers_so_the_agent_exits_cleanly_without_a_traceback():
    import signal as sig
    import subprocess
    import sys

    from spotrun_trainer.launcher import StopSignal, _children

    agent = subprocess.Popen([sys.executable, "-c", AGENT, WORKER], stdout=subprocess.PIPE, text=True)
    assert agent.stdout.readline().strip() == "ready"  # the worker runs, its handler installed
    assert len(_children(agent.pid)) == 1
    stop = StopSignal()
    stop.child = agent
    stop._handle(sig.SIGTERM, None)
    assert agent.wait(timeout=10) == 0
    assert "Traceback" not in agent.stdout.read()


def test_stop_before_launch_exits_cleanly_without_starting_torchrun(tmp_path):
    import signal as sig

    from spotrun_trainer.launcher import StopSignal, run

    p = plan(sm_root(tmp_path, ["algo-1"], "algo-1"), gpus=0, efa=())
    stop = StopSignal()
    stop._handle(sig.SIGTERM, None)
    assert run(p, failure_file=tmp_path / "failure", outcome_dir=tmp_path / "o", stop=stop) == 0
    assert stop.child is None and not (tmp_path / "failure").exists()


def inputs(assets, **hp):
    return job_config({"data.path": str(assets["data"]), "output_dir": "/unused",
                                             "model.path": str(assets["model"]), **hp})


def test_good_inputs_pass_the_launchers_checks(assets):
    check_inputs(inputs(assets), world_size=2)
    check_inputs(inputs(assets, **{"model.path": "", "model.config": json.dumps(
        {"model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 300})}), world_size=2)


@pytest.mark.parametrize("hp, message", [
    ({"model.path": "", "model.config": '{"model_type": "lama", "hidden_size": 64}'},
     "model.config.model_type=\"lama\" is invalid: expected a model type known to transformers (close matches: llama"),
    ({"model.path": "", "model.config": '{"model_type": 7}'},
     "model.config.model_type=7 is invalid: expected a model type known to transformers"),
    ({"model.path": "", "model.config": '{"model_type": "vit"}'},
     "model.config.model_type=\"vit\" is invalid: transformers has no causal LM for it"),
    ({"model.path": "", "model.config": '{"model_type": "llama", "hidden_size": "wide"}'},
     "model.config is invalid: transformers could not build a llama config from it (Validation error for field "
     "'hidden_size'"),
    ({"model.path": "/nonexistent/model"},
     "model.path=\"/nonexistent/model\" is invalid: expected a Hugging Face model directory with config.json"),
    ({"data.path": "/nonexistent/data"},
     "data.path=\"/nonexistent/data\" is invalid: /nonexistent/data/index.json not found"),
    ({"data.seq_len": "1000000"}, "data.seq_len=1000000 is invalid for this dataset: it holds 0 samples"),
    ({"model.path": "", "model.activation_checkpointing": "true", "model.config": '{"model_type": "ctrl"}'},
     "model.activation_checkpointing=true is invalid for ctrl: CTRLLMHeadModel does not support it"),
])
def test_configuration_errors_name_the_field_before_any_worker_starts(assets, hp, message):
    with pytest.raises(ConfigError) as err:
        check_inputs(inputs(assets, **hp), world_size=2)
    text = str(err.value)
    assert text.startswith(message.split("=")[0]) and message in text
    assert "\n" not in text and len(text) < 500  # transformers' own message for an unknown type is ~12 KB


def test_model_directory_with_an_unknown_model_type_is_refused(assets, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(assets["model"], model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, "model_type": "llama-9"}))
    with pytest.raises(ConfigError, match=r"^model_type in model.path/config.json=\"llama-9\" is invalid: expected a "
                                          r"model type known to transformers \(close matches: llama"):
        check_inputs(inputs(assets, **{"model.path": str(model)}), world_size=1)


def test_launcher_refuses_an_unknown_model_type_without_starting_torchrun(assets, tmp_path):
    root = write_sagemaker_root(tmp_path / "sm", channels={"train": assets["data"]}, checkpoint_dir=None,
                                hyperparameters={"nproc_per_node": 2, "model.config": {"model_type": "lama"}})
    proc = start_launcher(root, tmp_path / "launcher.log")
    assert proc.wait(timeout=300) == 2
    log = (tmp_path / "launcher.log").read_text()
    assert "launch:" not in log and "torch.distributed.run" not in log  # no worker start-up was paid for
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("invalid configuration: model.config.model_type=\"lama\" is invalid")
    assert failure.count("\n") == 1 and len(failure) < 300


def test_launcher_refuses_keep_best_without_checkpoints_in_one_line_without_starting_torchrun(assets, tmp_path):
    """SageMaker's own local mode has no CheckpointConfig: with the planner's eval.keep_best this failed in every
    worker after start-up (issue 27)."""
    root = write_sagemaker_root(tmp_path / "sm", channels={"train": assets["data"], "model": assets["model"]},
                                checkpoint_dir=None, hyperparameters={"nproc_per_node": 2, "eval.keep_best": True})
    proc = start_launcher(root, tmp_path / "launcher.log")
    assert proc.wait(timeout=300) == 2
    assert "torch.distributed.run" not in (tmp_path / "launcher.log").read_text()
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("invalid configuration: eval.keep_best=true is invalid: expected false without "
                              "checkpoints") and failure.count("\n") == 1


@pytest.mark.slow
def test_after_a_failure_in_every_worker_each_exits_1_without_an_abort_or_a_signal(job_factory):
    """A failure after the process group is up (LoRA targets the model lacks: found when PEFT wraps it): every
    rank writes its outcome and exits 1 itself; none aborts in the interpreter's teardown (SIGABRT, -6) or dies of
    torchrun's SIGTERM to the survivors in it (-15)."""
    job = job_factory("worker-failure", **{"training.method": "lora", "training.lora.target_modules": "nosuch_proj"})
    assert job.run() == 1, job.text()[-3000:]
    text = job.text()
    codes = re.findall(r"exitcode\s*: (-?\d+)", text)
    assert codes and set(codes) == {"1"}, text[-3000:]
    assert "terminate called" not in text and "Signal 15" not in text
    failure = job.failure.read_text()
    assert failure.startswith("ConfigError: lora.target_modules=\"nosuch_proj\" is invalid") and \
        failure.count("\n") == 1


@pytest.mark.slow
def test_a_worker_that_cannot_join_the_process_group_names_the_cause(job_factory):
    """The failure file carries the worker's own error, not torchrun's exit code: here gloo told to bind an
    interface this host lacks (the job's environment sets GLOO_SOCKET_IFNAME; the launcher leaves it)."""
    job = job_factory("no-interface")
    proc = start_launcher(job.root / "sm", job.log, env={"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert proc.wait(timeout=300) == 1, job.text()[-3000:]
    failure = job.failure.read_text()
    assert re.match(r"StartupError: rank [01] of 2 could not join the process group \(master 127\.0\.0\.1:\d+, "
                    r"GLOO_SOCKET_IFNAME='nosuch0'\): RuntimeError: .*Unable to find address for: nosuch0$",
                    failure.strip()), failure
    assert "without a worker error report" not in failure and failure.count("\n") == 1
