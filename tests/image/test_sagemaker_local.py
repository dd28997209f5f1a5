"""The trainer image under SageMaker's own harness: the SageMaker Python SDK's local mode (tests/image/
sagemaker_sdk.py) runs the image built from the synthesized asset with the hyperparameters and channels of a real
plan, the demo's (examples/demo/run.json: validation split, eval.keep_best, export.from=best), planned by the
function `spotrun local` plans with, on one host and on two. The job completes offline, `model.tar.gz` loads with
transformers, and its weights are bitwise those of the same run in the project's own stand-in
(tests/image/sagemaker_host.py). Every container and network is gone afterwards.

The demo's run is kept and only its sources point at the suite's tiny assets (a few hundred documents, a tiny
Llama): the plan, and so every hyperparameter but the sources, is the demo's.
"""

from __future__ import annotations

import json
import os
import tarfile
import time

import pytest
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from spotrun.local.demo import DEMO_DIR
from spotrun.local.pipeline import LocalOptions, channels_of, hyperparameters, load_run, plan_local, prepare_if_raw
from spotrun.seams import EXPORT_METADATA
from training_constructs.training_pipeline import CHECKPOINT_LOCAL_PATH

from . import sagemaker_sdk
from .conftest import REPORT
from .images import docker
from .sagemaker_host import Host, lay_out

pytestmark = pytest.mark.slow

# Local mode has no CheckpointConfig: the trainer's own setting stands in for the LocalPath the state machine sends.
CHECKPOINT_DIR_HP = "checkpoint.dir"


@pytest.fixture(scope="session")
def sdk_ready(docker_ready) -> None:
    reason = sagemaker_sdk.unavailable()
    if reason is None:
        return
    if os.environ.get("SPOTRUN_REQUIRE_DOCKER") == "1":
        pytest.fail(f"SPOTRUN_REQUIRE_DOCKER=1 but SageMaker local mode cannot run: {reason}")
    pytest.skip(f"SageMaker local mode: {reason}")


@pytest.fixture(scope="module")
def demo_plan(tmp_path_factory, assets) -> tuple[dict[str, str], dict]:
    """The demo run's hyperparameters and channels, as `spotrun local` plans them (one process per host)."""
    root = tmp_path_factory.mktemp("demo-plan")
    raw = json.loads((DEMO_DIR / "run.json").read_text())
    raw["model"]["source"], raw["data"]["source"] = str(assets["model"]), str(assets["corpus"].parent)
    (root / "run.json").write_text(json.dumps(raw))
    raw, _ = load_run(root / "run.json")
    raw, _ = prepare_if_raw(raw, root / "prepared", emit=lambda line: None)
    planned = plan_local(raw)
    hyper = {**hyperparameters(planned, LocalOptions(out=root, nproc=1)), CHECKPOINT_DIR_HP: CHECKPOINT_LOCAL_PATH}
    return hyper, channels_of(planned)


def _stand_in(image: str, tmp_path, hosts: list[str], hyper: dict, channels: dict) -> tuple[list[Host], str | None]:
    """The same job in the project's stand-in, started detached (it runs while the SDK's job does)."""
    network = None
    if len(hosts) > 1:
        network = f"sdklocal-standin-{os.getpid()}-{len(hosts)}"
        docker("network", "create", "--internal", network)
    started = [Host.start(image, lay_out(tmp_path / "standin" / h, host=h, hosts=hosts, hyperparameters=hyper,
                                         channels=channels), host=h, name=f"sdklocal-standin-{os.getpid()}-{h}",
                          network=network) for h in hosts]
    return started, network


@pytest.mark.parametrize("count", [1, 2], ids=["1-host", "2-hosts"])
def test_sagemaker_local_mode_runs_the_demo_plan_bitwise_as_the_stand_in(trainer_image, sdk_ready, demo_plan,
                                                                          tmp_path, count):
    hyper, channels = demo_plan
    assert hyper["eval.keep_best"] == "true" and hyper["export.from"] == "best"  # the demo's, as planned
    assert set(channels) >= {"train", "model"}
    # NOTE: local mode names its network `sagemaker-local` in every job, and its hosts algo-1..N: two jobs at once
    # on one daemon would share it, and `algo-1` could resolve to the other job's container.
    assert not sagemaker_sdk.sdk_network(), "network sagemaker-local exists: another local-mode job is running"
    hosts = [f"algo-{i}" for i in range(1, count + 1)]
    standin, network = _stand_in(trainer_image.tag, tmp_path, hosts, hyper, channels)
    root = tmp_path / f"sdklocal-{count}h-{os.getpid()}"
    try:
        started = time.monotonic()
        job = sagemaker_sdk.run_job(trainer_image.tag, root, instance_count=count, hyperparameters=hyper,
                                    channels=channels)
        REPORT.setdefault("scenario_seconds", {})[f"sdk-local-{count}-host"] = time.monotonic() - started
        codes = sagemaker_sdk.exit_codes(job.project)
        assert [h.wait() for h in standin] == [0] * count, standin[0].logs()[-3000:]
    finally:
        sagemaker_sdk.remove(root)
        for host in standin:
            host.remove()
        if network:
            docker("network", "rm", network, check=False)

    assert codes == dict.fromkeys(hosts, 0), job.log[-4000:]
    assert job.attempts == []  # no name resolved, no socket but Docker's Unix socket: nothing left the machine
    assert sagemaker_sdk.leftovers(job.project) == []
    if count > 1:  # local mode names `ethwe`, which its containers lack: the launcher took the route to algo-1's
        assert "network_interface_name='ethwe' in resourceconfig.json does not exist on this host" in job.log
        assert "bound to eth0, the interface the route to the master host algo-1 leaves by" in job.log

    model = tmp_path / "model"
    with tarfile.open(job.model_tar) as archive:
        archive.extractall(model, filter="data")
    loaded = AutoModelForCausalLM.from_pretrained(model).state_dict()
    reference = load_file(standin[0].model / "model.safetensors")
    assert sorted(loaded) == sorted(reference)
    for key, tensor in reference.items():
        assert loaded[key].equal(tensor), key
    ours, theirs = (json.loads((d / EXPORT_METADATA).read_text()) for d in (model, standin[0].model))
    assert ours == theirs and ours["evaluation"]["weights"] == "best", ours
