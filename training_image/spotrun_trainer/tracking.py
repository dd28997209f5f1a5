"""Experiment tracking with MLflow: what rank 0 logs to the run's tracking server, and how a resumed job, or the
next segment's, continues the same MLflow run without logging a step twice.

Used only when the run names a server (`tracking.mlflow_uri`: an http(s) URL, or a SageMaker AI MLflow tracking
server ARN, which the `sagemaker-mlflow` plugin turns into signed requests to the managed server). Without one,
`make_tracker` returns a `NullTracker`: MLflow is never imported and no socket is opened.

What is logged (all by rank 0; names are this module's constants):
- parameters: the job's hyperparameters as SageMaker passed them (the plan's), `instance_type`, `instance_count`,
  `method`, `world_size`, `parameters`, `trainable_parameters`, `total_steps`; a later start whose hyperparameters
  differ (a segment's `segment_seconds`) records the new values in a tag (MLflow parameters cannot change);
- metrics with their step: `loss` for every step (the exact float of loss_history.jsonl), at log steps `lr`,
  `grad_norm`, `tokens_per_s`, `tokens_per_s_per_device`, `mfu` (when the device's peak is known), `mem_gb`
  (peak memory), at evaluations `val_loss` and `val_ppl` (step 0: the base model), at the end `summary.<key>` for
  every number of metrics.json;
- interruptions: `resumed_from_step` at the step each restart resumed from, the tags `spotrun.starts` (starts so
  far), `spotrun.start.<n>` (the n-th earlier start's steps and training seconds, as of its last checkpoint) and
  `spotrun.stop` (the step and reason of the latest stop); the run ends FINISHED at completion and stays RUNNING
  across stops (the next start continues it).

**One MLflow run per training run.** The checkpoint's train state (`TrainState.tracking`) keeps a key made at the
first start and the MLflow run id once the server gave it; a resumed job or the next segment reopens that run (by
id, or by the key tag when the id was not yet known at the checkpoint).

**Never twice.** MLflow keeps every value logged for a (metric, step) as history, so a re-logged step would show
twice. Here each (metric, step) holds exactly one value: before sending anything, a (re)opened run reads the
steps each metric already has on the server, and only the others are sent; after any failed request the run is
reopened the same way (the server may have stored part of a batch). So after a restart from step k, steps <= k are
not logged again, and steps after k that the interrupted job had already logged (their work lost with a hard kill)
keep that one value: the re-run computes the same value (bitwise on CPU, the resume guarantee), and the step is
not sent a second time. Steps the interrupted job never got to the server are sent by the re-run.

**Never in training's way.** The training loop only appends to an in-memory queue; one daemon thread talks to the
server with a bounded timeout per request (`tracking.timeout_seconds`, MLflow's own retries off), retries with a
backoff, and warns in the log (the first failure, then every tenth). At the end the job waits at most
`tracking.close_seconds` (a third of it after a stop signal, whose notice belongs to the checkpoint) for the queue
to drain, then exits regardless. At most `MAX_QUEUED` records wait while the server is unreachable.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from spotrun.settings.sections import TrackingConfig

from .tracker_base import (  # noqa: F401 (LOSS, VAL_PPL, STEP_METRICS: tracking's names, read by tests)
    LOSS,
    RESUMED_FROM_STEP,
    STEP_METRICS,
    SUMMARY_PREFIX,
    VAL_LOSS,
    VAL_PPL,
    NullTracker,
    Trackers,
)

log = logging.getLogger("spotrun_trainer.tracking")

# Tags: the run's key from the checkpoint (finds the run when its id was not saved yet), starts, the latest stop,
# and the hyperparameters that changed at a later start (prefix + the step it started from).
KEY_TAG, STARTS_TAG, STOP_TAG = "spotrun.key", "spotrun.starts", "spotrun.stop"
START_TAG = "spotrun.start."  # + n: the n-th earlier start's steps and seconds (as of its last checkpoint)
CHANGED_PARAMS_TAG = "spotrun.params_from_step."
# TrainState.tracking's keys (saved in the checkpoint manifest's train state).
STATE_KEY, STATE_RUN_ID = "key", "run_id"

MAX_QUEUED = 100_000
# LogBatch accepts at most 1,000 metrics, 100 params and 100 tags per request (MLflow REST API reference).
METRICS_PER_REQUEST, PARAMS_PER_REQUEST = 1000, 100
PARAM_VALUE_MAX = 6000  # MLflow's limit on a parameter value; longer ones are cut (never an error)
TAG_VALUE_MAX = 8000
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
# The characters MLflow accepts in metric, parameter and tag names (its validation error names them).
NAME = re.compile(r"[A-Za-z0-9_\-. :/]{1,250}")
STOP_CLOSE_SHARE = 1 / 3


def make_tracker(cfg: TrackingConfig, *, rank: int, params: Mapping[str, Any]) -> NullTracker:
    """The tracker of this rank: on rank 0, MLflow when a server is named and W&B when a project is (both behind
    `Trackers`), else one that does nothing. `params`: what the trainer adds to the logged parameters (method,
    world size, parameter counts, total steps)."""
    if rank != 0:
        return NullTracker()
    trackers: list[NullTracker] = []
    if cfg.mlflow_uri:
        trackers.append(MlflowTracker(cfg, params=params))
    if cfg.wandb_project:
        from .wandb_tracking import WandbTracker  # NOTE: imported here: a run without W&B never loads wandb

        trackers.append(WandbTracker(cfg, params=params))
    return trackers[0] if len(trackers) == 1 else Trackers(trackers) if trackers else NullTracker()


def mlflow_client(cfg: TrackingConfig):
    """An MlflowClient for the server, with a bounded timeout per request and MLflow's retries off (this module
    retries on its own thread). MLflow reads these two settings from the environment at each request."""
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, math.ceil(cfg.timeout_seconds)))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    import mlflow  # NOTE: imported here only: a run without tracking never loads MLflow

    # NOTE: the sagemaker-mlflow plugin signs requests and adds the server's routing header from the process's
    # tracking URI (mlflow.get_tracking_uri()), not the client's: set it (rank 0 logs nothing else to MLflow).
    mlflow.set_tracking_uri(cfg.mlflow_uri)
    if not cfg.mlflow_uri.startswith("arn:"):
        # The plugin's header provider is active for every URI and fails to parse a URL as an ARN, warning on
        # every request; its headers only matter for ARNs.
        logging.getLogger("mlflow.tracking.request_header.registry").setLevel(logging.ERROR)
    return mlflow.MlflowClient(tracking_uri=cfg.mlflow_uri)


class MlflowTracker(NullTracker):
    """Rank 0's tracker: the training thread queues records, one daemon thread sends them (see the module doc)."""

    def __init__(self, cfg: TrackingConfig, *, params: Mapping[str, Any],
                 client_factory: Callable[[TrackingConfig], Any] = mlflow_client):
        self.cfg, self._client_factory = cfg, client_factory
        self.params = {**{str(k): str(v) for k, v in cfg.params.items()},
                       **({"instance_type": cfg.instance_type} if cfg.instance_type else {}),
                       "instance_count": str(cfg.instance_count),
                       **{str(k): str(v) for k, v in params.items()}}
        self._queue: queue.Queue = queue.Queue(MAX_QUEUED)
        self._closing = threading.Event()
        self._give_up_at = math.inf
        self._thread: threading.Thread | None = None
        self._ids: dict = {}
        self._start_step = 0
        self.dropped = 0
        self.failures = 0
        self.sent = 0

    # ---- the training thread's side: never blocks, never raises --------------------------------------------

    def begin(self, ids: dict, *, step: int, segments: list[dict]) -> None:
        ids.setdefault(STATE_KEY, uuid.uuid4().hex)
        self._ids, self._start_step = ids, step
        earlier = {f"{START_TAG}{n}": json.dumps(seg, sort_keys=True) for n, seg in enumerate(segments, 1)}
        self._put(("tags", {STARTS_TAG: str(len(segments) + 1), **earlier}))
        if step > 0:
            self._metrics(step, {RESUMED_FROM_STEP: float(step)})
        self._thread = threading.Thread(target=self._run, name="spotrun-mlflow", daemon=True)
        self._thread.start()

    def losses(self, flushed: Iterable[tuple[int, float]]) -> None:
        now = _now_ms()
        for step, loss in flushed:
            self._put(("metrics", step, {LOSS: loss}, now))

    def step_metrics(self, step: int, values: Mapping[str, float | None]) -> None:
        self._metrics(step, {k: v for k, v in values.items() if v is not None})

    def evaluation(self, step: int, *, val_loss: float, val_ppl: float) -> None:
        self._metrics(step, {VAL_LOSS: val_loss, VAL_PPL: val_ppl})

    def summary(self, step: int, summary: Mapping[str, Any]) -> None:
        self._metrics(step, {SUMMARY_PREFIX + k: float(v) for k, v in summary.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool)})

    def close(self, *, step: int, reason: str, completed: bool, signalled: bool = False) -> bool:
        if self._thread is None:
            return True
        self._put(("tags", {STOP_TAG: f"step={step} reason={reason}"}))
        if completed:
            self._put(("end", "FINISHED"))
        wait = self.cfg.close_seconds * (STOP_CLOSE_SHARE if signalled else 1.0)
        self._give_up_at = time.monotonic() + wait
        self._closing.set()
        self._thread.join(wait)
        done = not self._thread.is_alive()
        if not done:
            log.warning("tracking: %d record(s) not sent to %s within %.0f s at the end of the job (training is "
                        "not affected)", self._queue.qsize(), self.cfg.mlflow_uri, wait)
        return done and not self.dropped

    def _metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._put(("metrics", step, dict(values), _now_ms()))

    def _put(self, record: tuple) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("tracking: %d records are waiting for %s; newer ones are dropped until it answers",
                            MAX_QUEUED, self.cfg.mlflow_uri)

    # ---- the sender thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        pending: list[tuple] = []
        run: _OpenRun | None = None
        while time.monotonic() < self._give_up_at:
            pending.extend(self._drain(block=not pending))
            if not pending:
                if self._closing.is_set() and self._queue.empty():
                    return
                continue
            try:
                if run is None:
                    run = _OpenRun.open(self._client_factory(self.cfg), self.cfg, self._ids, self.params,
                                        start_step=self._start_step)
                self.sent += run.send(pending)
                pending = []
                self.failures = 0
            except Exception as exc:  # NOTE: whatever the server or the client does, training goes on
                run = None  # reopen: re-read what the server holds before sending again
                self.failures += 1
                refused = _refused(exc)
                if self.failures % 10 == 1 or refused:
                    log.warning("tracking: the MLflow server %s failed (%s: %s); %d record(s) %s (training is not "
                                "affected)", self.cfg.mlflow_uri, type(exc).__name__, " ".join(str(exc).split())[:300],
                                len(pending), "dropped: the server refuses them" if refused else "kept, retrying")
                if refused:  # a client error (bad value, access denied) does not pass on a retry
                    self.dropped += len(pending)
                    pending = []
                delay = RETRY_SECONDS[min(self.failures, len(RETRY_SECONDS)) - 1]
                self._closing.wait(min(delay, max(0.0, self._give_up_at - time.monotonic())))

    def _drain(self, *, block: bool) -> list[tuple]:
        out = []
        try:
            out.append(self._queue.get(timeout=0.2) if block else self._queue.get_nowait())
            while len(out) < METRICS_PER_REQUEST:
                out.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return out


class _OpenRun:
    """The MLflow run of this training run, opened on the server, with the steps each metric already holds."""

    def __init__(self, client, run_id: str, present: dict[str, set[int]]):
        self.client, self.run_id, self.present = client, run_id, present

    @classmethod
    def open(cls, client, cfg: TrackingConfig, ids: dict, params: Mapping[str, str], *, start_step: int):
        run_id = ids.get(STATE_RUN_ID)
        if run_id is None:
            experiment = client.get_experiment_by_name(cfg.experiment)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(cfg.experiment)
            found = client.search_runs([experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{ids[STATE_KEY]}'",
                                       max_results=1)
            run = found[0] if found else client.create_run(experiment_id, run_name=cfg.run_name or None,
                                                           tags={KEY_TAG: ids[STATE_KEY]})
            run_id = run.info.run_id
            ids[STATE_RUN_ID] = run_id  # the next checkpoint's train state carries it
        run = client.get_run(run_id)
        if run.info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        present = {key: {m.step for m in client.get_metric_history(run_id, key)} for key in run.data.metrics}
        opened = cls(client, run_id, present)
        opened._log_params(dict(run.data.params), params, start_step)
        return opened

    def _log_params(self, logged: dict[str, str], params: Mapping[str, str], start_step: int) -> None:
        from mlflow.entities import Param, RunTag  # MLflow loads only with tracking on (see start)

        values = {k: v[:PARAM_VALUE_MAX] for k, v in params.items() if NAME.fullmatch(k)}
        new = [Param(k, v) for k, v in values.items() if k not in logged]
        changed = {k: v for k, v in values.items() if k in logged and logged[k] != v}
        try:
            for i in range(0, len(new), PARAMS_PER_REQUEST):
                self.client.log_batch(self.run_id, params=new[i:i + PARAMS_PER_REQUEST])
            if changed:
                text = json.dumps(changed, sort_keys=True)[:TAG_VALUE_MAX]
                self.client.log_batch(self.run_id, tags=[RunTag(f"{CHANGED_PARAMS_TAG}{start_step}", text)])
        except Exception as exc:
            if not _refused(exc):
                raise
            log.warning("tracking: the server refused the run's parameters (%s); the metrics are logged without "
                        "them", " ".join(str(exc).split())[:300])

    def send(self, records: list[tuple]) -> int:
        """Log `records` (metrics not already on the server, tags, the end); returns the metric values sent."""
        from mlflow.entities import Metric, RunTag  # MLflow loads only with tracking on (see start)

        metrics, seen, tags, end = [], set(), {}, None
        for record in records:
            if record[0] == "metrics":
                _, step, values, ts = record
                for key, value in values.items():
                    if (key, step) in seen or step in self.present.get(key, ()):
                        continue
                    seen.add((key, step))
                    metrics.append(Metric(key, float(value), ts, step))
            elif record[0] == "tags":
                tags.update(record[1])
            else:
                end = record[1]
        for i in range(0, len(metrics), METRICS_PER_REQUEST):
            chunk = metrics[i:i + METRICS_PER_REQUEST]
            self.client.log_batch(self.run_id, metrics=chunk)
            for m in chunk:
                self.present.setdefault(m.key, set()).add(m.step)
        if tags:
            self.client.log_batch(self.run_id, tags=[RunTag(k, v[:TAG_VALUE_MAX]) for k, v in tags.items()])
        if end:
            self.client.set_terminated(self.run_id, status=end)
        return len(metrics)


def _refused(exc: Exception) -> bool:
    """The server answered with a client error other than throttling (MlflowException's HTTP status): the same
    request fails again."""
    status = getattr(exc, "get_http_status_code", lambda: 500)()
    return 400 <= status < 500 and status != 429


def _now_ms() -> int:
    return int(time.time() * 1000)
