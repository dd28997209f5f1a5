"""Two hosts x two ranks, each host its own network namespace, hostname and PID 1 (tests/trainer/hosts.py), the
launcher reading /opt/ml as SageMaker lays it out.

One uninterrupted 4-rank run is the reference. A second run is stopped by SIGTERM to one host only (algo-2):
every host stops at the same step with a committed checkpoint; the signalled host exits 0 (SageMaker's stop),
the other exits 3 with a failure file saying why (a job that did not complete must not read as Completed).
Each host's checkpoint directory is synced with one prefix as SageMaker syncs it (hosts.CheckpointPrefix: only
its own writes during a job). Restarted on the prefix (copied to every host), its per-step losses and exported
weights are bitwise those of the reference. Restarted instead with each host seeing only its own files, both
hosts refuse with a failure file naming the missing files, and no checkpoint file is deleted.

The hosts' hostnames are not in /etc/hosts: gloo reaches the peer only because the launcher sets
GLOO_SOCKET_IFNAME to resourceconfig.json's network_interface_name (eth0).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from spotrun.local.harness import loss_history, wait_for_step
from spotrun_trainer.checkpoint import committed_checkpoints
from spotrun_trainer.launcher import PEER_STOPPED_EXIT

from .conftest import BASE_HP, assert_same_run
from .hosts import NAMES, SM_CHECKPOINTS, Cluster, Hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=unavailable())]

# 4 ranks x micro_batch 1; few steps: four processes share this machine's cores.
HP = {**BASE_HP, "training.micro_batch": 1, "max_steps": 12}
_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


def _cluster(hosts: Hosts, root: Path, assets: dict) -> Cluster:
    return Cluster(hosts, root, hyperparameters=HP, channels={"train": assets["data"], "model": assets["model"]})


def _wait(procs: list[subprocess.Popen], timeout: float = 400) -> list[int]:
    return [p.wait(timeout=timeout) for p in procs]


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hosts():
    made = Hosts()
    try:
        made.create()
    except RuntimeError as exc:
        made.close()
        pytest.skip(f"network namespaces cannot be made here: {exc}")
    yield made
    made.close()


@pytest.fixture(scope="module")
def reference(hosts, assets, tmp_path_factory) -> Cluster:
    job = _cluster(hosts, tmp_path_factory.mktemp("hosts-reference"), assets)
    assert job.run() == [0, 0], job.texts()
    return job


@pytest.fixture(scope="module")
def one_host_stopped(hosts, assets, tmp_path_factory) -> dict:
    job = _cluster(hosts, tmp_path_factory.mktemp("hosts-stopped"), assets)
    procs = job.start()
    assert wait_for_step(procs[0], job.output, 4), job.texts()
    hosts.stop(procs[1])  # algo-2 only
    rcs = job.finish(procs, timeout=300)
    saved = job.root / "saved-at-stop"
    shutil.copytree(job.prefix.root, saved)
    return {"job": job, "rcs": rcs, "saved": saved}


def test_four_ranks_on_two_hosts_train_with_gloo_on_the_named_interface(reference):
    text = reference.text(0)
    assert "world=4" in text and "run_completed step=12" in text, reference.texts()
    assert "--nnodes 2 --node_rank 1 --master_addr algo-1 --master_port 7777" in reference.text(1)
    assert not reference.failure(0).exists() and not reference.failure(1).exists()
    assert (reference.output / "model.safetensors").is_file()


def test_a_stop_on_one_host_stops_every_host_with_a_committed_checkpoint(one_host_stopped):
    job, rcs = one_host_stopped["job"], one_host_stopped["rcs"]
    assert rcs == [PEER_STOPPED_EXIT, 0], job.texts()
    stopped = [line for line in job.text(0).splitlines() if line.startswith("run_stopped")]
    assert len(stopped) == 1, job.texts()
    step = int(stopped[0].split()[1].split("=")[1])
    assert 4 <= step < 12 and "run_completed" not in job.text(0) + job.text(1)
    newest, manifest = committed_checkpoints(one_host_stopped["saved"])[0]
    assert newest == step and manifest["world_size"] == 4
    # The signalled host ends as SageMaker's stop (exit 0, no failure); the other says why it did not complete.
    assert not job.failure(1).exists()
    failure = job.failure(0).read_text()
    assert failure == (f"training did not complete: another host of this job was sent a stop signal, and a stop on "
                       f"any host stops every host at the same step: stopped at step {step}; the newest intact "
                       f"checkpoint is step-{step:08d} (a restart resumes from it)\n")
    assert not (job.output / "model.safetensors").exists()


def test_hosts_that_each_see_only_their_own_files_refuse_and_delete_nothing(one_host_stopped, hosts, tmp_path,
                                                                            assets):
    saved = one_host_stopped["saved"]
    own = [tmp_path / f"own-{name}" for name in NAMES]
    for directory in own:
        shutil.copytree(saved, directory)
    for path in saved.rglob("*.distcp"):  # shard files go to the host whose ranks wrote them
        rank = int(_RANK_FILE.match(path.name).group(1))
        for host, directory in enumerate(own):
            if rank // 2 != host:
                (directory / path.relative_to(saved)).unlink()
    for path in own[1].rglob("*"):  # rank 0's files (.metadata, manifest.json) are on algo-1 only
        if path.is_file() and not _RANK_FILE.match(path.name):
            path.unlink()
    before = [_snapshot(d) for d in own]

    job = _cluster(hosts, tmp_path / "split", assets)
    rcs = _wait(job.start(ckpt_dirs=own), timeout=300)
    assert rcs[0] != 0 and rcs[1] != 0, job.texts()
    for host in range(len(NAMES)):
        failure = job.failure(host).read_text()
        assert failure.startswith(f"CheckpointError: checkpoint directory {SM_CHECKPOINTS} differs between hosts: "
                                  f"host {hosts.hostnames[0]} (rank 0) lacks "), failure
        assert f"host {hosts.hostnames[1]} (rank 2) lacks " in failure
        assert "deleting nothing" in failure
    assert [_snapshot(d) for d in own] == before  # every file of every checkpoint is still there
    assert "run_start" not in job.text(0)


def test_restart_on_the_merged_directory_is_bitwise_the_uninterrupted_run(one_host_stopped, reference):
    job = one_host_stopped["job"]
    job.failure(0).unlink()  # a restarted SageMaker job runs on fresh instances
    step = committed_checkpoints(one_host_stopped["saved"])[0][0]
    assert job.run() == [0, 0], job.texts()
    assert f"start_step={step}" in job.text(0) and "run_completed step=12" in job.text(0)
    assert sorted(loss_history(job.output)) == list(range(1, 13))
    assert_same_run(job, reference)
    assert not job.failure(0).exists() and not job.failure(1).exists()
