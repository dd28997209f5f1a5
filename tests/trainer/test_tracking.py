"""MLflow tracking (spotrun_trainer/tracking.py) against a real MLflow tracking server on loopback: what the trainer
logs equals its own loss_history.jsonl and metrics.json, across a SIGTERM and a SIGKILL restart, with each
(metric, step) logged once; a server that never answers does not stop training; no server named, no MLflow."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from spotrun.local.harness import free_port, kill_tree, loss_history, val_history, wait_for_step
from spotrun.seams import parse_metric_line
from spotrun.settings.checks import ConfigError
from spotrun.settings.sections import TrackingConfig
from spotrun.settings.wire import job_config
from spotrun_trainer import tracking
from spotrun_trainer.checkpoint import committed_checkpoints

from .conftest import BASE_HP

pytestmark = pytest.mark.slow

SERVER_START_S = 180


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free loopback port with a SQLite store; one for the session, stopped at its end."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "wb")
    # One worker and no job runner (MLflow's background jobs, unused here): the cheapest server that still serves
    # the whole tracking REST API.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--default-artifact-root", str(root / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_S
    try:
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not start: " + (root / "server.log").read_text()
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker: the group this fixture started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture
def client(mlflow_server):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=mlflow_server)


@pytest.fixture
def tracker_env(monkeypatch):
    """mlflow_client() sets MLflow's request timeout and retries for its process: undo it after the test."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")


def _only_run(client, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]  # one MLflow run for the whole training run
    return runs[0]


def _history(client, run_id: str, key: str) -> dict[int, float]:
    """step -> value of one metric, asserting that no step was logged twice."""
    entries = client.get_metric_history(run_id, key)
    steps = [m.step for m in entries]
    assert len(steps) == len(set(steps)), f"{key}: steps logged twice: {sorted(steps)}"
    return {m.step: m.value for m in entries}


def _metric_lines(text: str) -> dict[int, dict]:
    """step -> the fields of the trainer's metric line (the last start's, when a step was run twice)."""
    return {parsed["step"]: parsed for parsed in map(parse_metric_line, text.splitlines()) if parsed}


def test_tracked_run_across_a_sigterm_and_a_sigkill_restart_matches_the_trainers_history(job_factory, client,
                                                                                          mlflow_server):
    experiment = "tracked-resume"
    job = job_factory("tracked", **{"tracking.mlflow_uri": mlflow_server,
                                    "tracking.experiment": experiment})
    resource = job.root / "sm" / "input" / "config" / "resourceconfig.json"
    resource.write_text(json.dumps({**json.loads(resource.read_text()), "current_instance_type": "ml.g5.xlarge"}))

    proc = job.start()  # 1: SIGTERM (the ranks agree on a step, save it, exit 0)
    assert wait_for_step(proc, job.output, 6)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, job.text()[-3000:]
    sigterm_step = committed_checkpoints(job.ckpt)[0][0]

    proc = job.start()  # 2: SIGKILL of the whole tree once the server holds steps the newest checkpoint lacks
    assert wait_for_step(proc, job.output, sigterm_step + 6)
    run_id = _only_run(client, experiment).info.run_id  # (the first checkpoints may predate the server's answer)
    deadline = time.monotonic() + 60
    while max(_history(client, run_id, tracking.LOSS)) <= sigterm_step + 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_tree(proc)
    resumed_from = committed_checkpoints(job.ckpt)[0][0]

    assert job.run() == 0, job.text()[-3000:]  # 3: to the end
    text = job.text()
    assert f"start_step={sigterm_step}" in text and f"start_step={resumed_from}" in text

    run = _only_run(client, experiment)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    final_state = committed_checkpoints(job.ckpt)[0][1]["train_state"]["trainer"]
    assert final_state["tracking"][tracking.STATE_RUN_ID] == run_id  # what the next segment would reopen
    # Every step's loss, exactly as loss_history.jsonl has it (exact floats), each step once: the steps after the
    # kill's checkpoint that the killed job had logged were not logged again.
    assert _history(client, run_id, tracking.LOSS) == loss_history(job.output)
    assert _history(client, run_id, tracking.VAL_LOSS) == val_history(job.output)
    # The log steps' metrics, as the metric lines printed them (to their printed precision).
    lines = _metric_lines(text)
    log_steps = set(range(BASE_HP["log_every"], BASE_HP["max_steps"] + 1, BASE_HP["log_every"]))
    for key in tracking.STEP_METRICS:
        if key != "mfu":  # na on CPU (no known peak): not logged, never guessed
            assert set(_history(client, run_id, key)) == log_steps, key
    lr, grad_norm = _history(client, run_id, "lr"), _history(client, run_id, "grad_norm")
    for step in log_steps:
        assert lr[step] == pytest.approx(lines[step]["lr"], rel=1e-3)
        assert grad_norm[step] == pytest.approx(lines[step]["grad_norm"], abs=1e-4)
    tps, per_device = _history(client, run_id, "tokens_per_s"), _history(client, run_id, "tokens_per_s_per_device")
    assert all(per_device[s] == pytest.approx(tps[s] / 2) for s in log_steps)
    assert "mfu" not in run.data.metrics
    # The restarts, and metrics.json as summary.* at the last step.
    assert set(_history(client, run_id, tracking.RESUMED_FROM_STEP)) == {sigterm_step, resumed_from}
    summary = json.loads((job.output / "metrics.json").read_text())
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert _history(client, run_id, tracking.SUMMARY_PREFIX + key) == {BASE_HP["max_steps"]: value}, key
    assert run.data.tags[tracking.STARTS_TAG] == str(summary["starts"])  # 3, unless the kill came before a save
    for n, segment in enumerate(summary["segments"][:-1], 1):  # the earlier starts, as the last start restored them
        assert json.loads(run.data.tags[f"{tracking.START_TAG}{n}"]) == segment
    assert run.data.tags[tracking.STOP_TAG] == f"step={BASE_HP['max_steps']} reason=completed"
    # The job's hyperparameters as SageMaker passed them, the instance type and count, the method.
    hyperparameters = json.loads((job.root / "sm" / "input" / "config" / "hyperparameters.json").read_text())
    params = run.data.params
    assert {k: params[k] for k in hyperparameters} == hyperparameters
    assert (params["instance_type"], params["instance_count"], params["method"]) == ("ml.g5.xlarge", "1", "full")
    assert params["world_size"] == "2" and params["total_steps"] == str(BASE_HP["max_steps"])


def _tracker(uri: str, experiment: str, **cfg) -> tracking.MlflowTracker:
    return tracking.MlflowTracker(TrackingConfig(mlflow_uri=uri, experiment=experiment, **cfg),
                                  params={"method": "full"})


def test_a_restart_after_a_hard_kill_logs_each_step_once_and_the_run_it_had(client, mlflow_server, tracker_env):
    losses = {step: 1 / step for step in range(1, 13)}
    first = _tracker(mlflow_server, "hard-kill", params={"segment_seconds": "3600"})
    ids: dict = {}
    first.begin(ids, step=0, segments=[])
    first.losses((s, losses[s]) for s in range(1, 9))  # steps 1-8 reached the server, then the job died
    assert first.close(step=8, reason="killed", completed=False)
    # Its newest checkpoint was at step 4, saved before the server had given the run id: only the key is there.
    checkpointed = {tracking.STATE_KEY: ids[tracking.STATE_KEY]}

    second = _tracker(mlflow_server, "hard-kill", params={"segment_seconds": "1800"})
    second.begin(checkpointed, step=4, segments=[{"start_step": 0, "end_step": 4, "seconds": 9.5}])
    second.losses((s, losses[s]) for s in range(5, 13))  # 5-8 again (the same values), then 9-12
    assert second.close(step=12, reason="completed", completed=True)

    run = _only_run(client, "hard-kill")
    assert checkpointed[tracking.STATE_RUN_ID] == ids[tracking.STATE_RUN_ID] == run.info.run_id
    assert _history(client, run.info.run_id, tracking.LOSS) == losses
    assert second.sent == 4 + 1  # steps 9-12 and resumed_from_step: nothing the server had already
    assert _history(client, run.info.run_id, tracking.RESUMED_FROM_STEP) == {4: 4.0}
    assert run.data.params["segment_seconds"] == "3600"  # a parameter cannot change; the new value is a tag
    assert json.loads(run.data.tags[f"{tracking.CHANGED_PARAMS_TAG}4"]) == {"segment_seconds": "1800"}
    assert json.loads(run.data.tags[f"{tracking.START_TAG}1"]) == {"start_step": 0, "end_step": 4, "seconds": 9.5}
    assert run.info.status == "FINISHED"


def test_a_server_that_never_answers_costs_training_nothing_but_a_warning(caplog, tracker_env):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        tracker = _tracker(uri, "never", timeout_seconds=1.0, close_seconds=3.0)
        with caplog.at_level(logging.WARNING, logger="spotrun_trainer.tracking"):
            tracker.begin({}, step=0, segments=[])
            tracker.losses((s, 1.0) for s in range(1, 1001))
            tracker.step_metrics(1000, {"lr": 1e-3})
            assert tracker.close(step=1000, reason="completed", completed=True) is False
    assert tracker.sent == 0
    text = caplog.text
    assert f"the MLflow server {uri} failed" in text and "training is not affected" in text
    assert f"not sent to {uri} within 3 s" in text


def test_no_tracking_server_named_imports_no_mlflow_and_opens_no_socket():
    code = """
import sys
events = []
sys.addaudithook(lambda event, args: events.append((event, args)) if event.startswith("socket.") else None)
from spotrun_trainer import train  # the worker module: torch, transformers, the trainer
from spotrun.settings.sections import TrackingConfig
from spotrun.settings.wire import job_config
from spotrun_trainer.tracking import make_tracker
tracker = make_tracker(TrackingConfig(), rank=0, params={"method": "full"})
ids = {}
tracker.begin(ids, step=0, segments=[])
tracker.losses([(1, 2.0)])
tracker.step_metrics(1, {"lr": 1e-3})
tracker.evaluation(1, val_loss=1.0, val_ppl=2.7)
tracker.summary(1, {"final_loss": 2.0})
assert tracker.close(step=1, reason="completed", completed=True)
assert ids == {}, ids
assert not [m for m in sys.modules if m.split(".")[0] in ("mlflow", "sagemaker_mlflow")], "MLflow was imported"
assert not events, events
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_tracking_hyperparameters_parse_and_a_bad_uri_names_the_field():
    cfg = job_config({"data.path": "d", "output_dir": "o", "model.config": '{"model_type": "x"}',
                                            "tracking.mlflow_uri": "arn:aws:sagemaker:us-east-1:"
                                            "123456789012:mlflow-tracking-server/team",
                                            "tracking.experiment": "support-chat"})
    assert cfg.tracking.mlflow_uri.endswith(":mlflow-tracking-server/team")
    assert cfg.tracking.experiment == "support-chat"
    with pytest.raises(ConfigError, match=r"tracking\.mlflow_uri=\"ftp://x\" is invalid: expected an http"):
        job_config({"data.path": "d", "output_dir": "o", "model.config": '{"model_type": "x"}',
                                          "tracking.mlflow_uri": "ftp://x"})
    # Only rank 0 tracks; the other ranks' tracker does nothing (and never imports MLflow).
    assert type(tracking.make_tracker(TrackingConfig(mlflow_uri="http://127.0.0.1:1"), rank=1, params={})) \
        is tracking.NullTracker
