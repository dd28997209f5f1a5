"""The trainer image, built from the synthesized asset, run as SageMaker runs it: one host, then two hosts
(`algo-1`, `algo-2`) on an internal Docker network. Each is stopped mid-run with `docker stop -t 120`, restarted
on a fresh `/opt/ml` holding only the checkpoints (for two hosts, the union of both hosts' directories: SageMaker
copies its one S3 prefix to every host), and must end with per-step losses and exported weights bitwise equal to
an uninterrupted run of the same image. Each host's checkpoint directory is synced with the job's one prefix
as SageMaker syncs it (tests/trainer/hosts.py: CheckpointPrefix): only its own writes during a job, its
deletions applied to the prefix, the whole prefix at the next start.
"""

from __future__ import annotations

import os
import time

import pytest
from safetensors.torch import load_file

from spotrun.local.harness import loss_records
from tests.trainer.conftest import BASE_HP
from tests.trainer.hosts import CheckpointPrefix

from .conftest import REPORT
from .images import docker
from .sagemaker_host import Host, exit_code, lay_out, stop

pytestmark = pytest.mark.slow

MAX_STEPS = 64  # tiny steps (tens of ms): room for `docker stop` to land well before the end
STOP_AFTER = 8  # a step that is no checkpoint interval's: the stop's own save is what the restart resumes from
HP = {**BASE_HP, "max_steps": MAX_STEPS, "checkpoint.interval_steps": 16, "log_every": 8}


def _scenario(name: str, image: str, tmp_path, assets, hosts: list[str], nproc: int, networks: bool):
    """Run the job uninterrupted, then stopped + restarted; return (reference hosts, restarted hosts, stopped).

    NOTE: with `networks`, every run gets an internal network of its own. The reference and the first run go at
    once and both name their hosts algo-1/algo-2: on one network Docker's DNS would answer `algo-1` with either
    run's container, and a host could join the other run's rendezvous."""
    hp = {**HP, "nproc_per_node": nproc}
    channels = {"train": assets["data"], "model": assets["model"]}
    tag = f"{name}-{os.getpid()}"

    def start(run: str, prefix: CheckpointPrefix):
        network = None
        if networks:
            network = f"spotrun-test-{tag}-{run}"
            docker("network", "create", "--internal", network)
            created.append(network)
        return [Host.start(image, lay_out(tmp_path / run / h, host=h, hosts=hosts, hyperparameters=hp,
                                          channels=channels, prefix=prefix),
                           host=h, name=f"{tag}-{run}-{h}", network=network) for h in hosts]

    created: list[str] = []
    try:
        return _run_scenario(name, start, hosts, tmp_path)
    finally:
        for network in created:
            docker("network", "rm", network, check=False)


def _run_scenario(name: str, start, hosts: list[str], tmp_path):
    started = time.monotonic()
    reference = start("reference", CheckpointPrefix(tmp_path / "reference-prefix"))
    prefix = CheckpointPrefix(tmp_path / "prefix")  # the interrupted job's, across its two starts
    first = start("first", prefix)
    try:
        for host in reference + first:
            assert host.pid1()[:3] == ["python", "-m", "spotrun_trainer.launcher"], host.pid1()
        first[0].wait_for_step(STOP_AFTER)
        stop_seconds = stop(*first)
        for host in first:
            assert exit_code(host) == 0, host.logs()[-3000:]  # a clean save-and-stop is success
            assert not (host.root / "output" / "failure").exists()
        assert [h.wait() for h in reference] == [0] * len(hosts), reference[0].logs()[-3000:]
        prefix.upload([h.checkpoints for h in first])  # what each host wrote and deleted, as SageMaker syncs it
        second = start("second", prefix)
        try:
            assert [h.wait() for h in second] == [0] * len(hosts), second[0].logs()[-3000:]
            logs = second[0].logs()
        finally:
            for host in second:
                host.remove()
    finally:
        for host in reference + first:
            host.remove()
    REPORT.setdefault("scenario_seconds", {})[name] = time.monotonic() - started
    assert stop_seconds < 60, stop_seconds  # the stop's save took seconds, far inside the 120 s notice
    return reference, first, second, logs


def _assert_bitwise(reference: Host, first: Host, second: Host, logs: str) -> None:
    stopped = loss_records(first.model)
    resumed = loss_records(second.model)
    assert stopped and stopped[-1][0] < MAX_STEPS, "the stop came after the run had finished"
    REPORT.setdefault("stopped_at_step", []).append(stopped[-1][0])
    assert f"start_step={stopped[-1][0]}" in logs  # resumed from the stop's own save, not an older one
    assert [s for s, _ in stopped + resumed] == list(range(1, MAX_STEPS + 1))  # every step once, in order
    assert stopped + resumed == loss_records(reference.model)  # exact floats
    ours, ref = load_file(second.model / "model.safetensors"), load_file(reference.model / "model.safetensors")
    assert ours.keys() == ref.keys()
    for key in ref:
        assert ours[key].equal(ref[key]), key


def test_one_sagemaker_host_stopped_and_restarted_trains_bitwise_as_uninterrupted(trainer_image, tmp_path, assets):
    reference, first, second, logs = _scenario("one-host", trainer_image.tag, tmp_path, assets,
                                               hosts=["algo-1"], nproc=2, networks=False)
    _assert_bitwise(reference[0], first[0], second[0], logs)


def test_two_sagemaker_hosts_on_an_internal_network_stop_and_resume_bitwise(trainer_image, tmp_path, assets):
    reference, first, second, logs = _scenario("two-hosts", trainer_image.tag, tmp_path, assets,
                                               hosts=["algo-1", "algo-2"], nproc=1, networks=True)
    # Both hosts saved their shards on the stop: the restart needed the union of their directories.
    for host in first:
        assert any(host.checkpoints.rglob("*.distcp")), host.name
    _assert_bitwise(reference[0], first[0], second[0], logs)
