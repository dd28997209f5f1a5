"""Experiment tracking with Weights & Biases: the second tracker behind tracking.py's interface (`NullTracker`),
used on rank 0 when the run names a W&B project (`tracking.wandb_project`), alone or beside MLflow.

**The API key** is read at the job's start from the Secrets Manager secret the run names
(`tracking.wandb_api_key_secret`, with the job's role) and handed to W&B in its settings: it is never a
hyperparameter, an environment variable of the job or a logged value. The secret holds the key itself, or a JSON
object with an `api_key` (or `WANDB_API_KEY`) field.

**One W&B run per training run.** The run's id is made at the first start and kept in the checkpoint's train
state (`TrainState.tracking`, key `wandb_run_id`); a resumed job or the next segment reopens it
(`wandb.init(id=..., resume="allow")`). Each start logs the steps it trains, from its checkpoint on; W&B's server
keeps one value per step and drops a step below a resumed run's current one, so the steps a restart trains again
(bitwise the same values on CPU) are not stored twice. Offline (`WANDB_MODE=offline`) each start writes its own
run file with the same id, merged by `wandb sync`.

What is logged: the same names as MLflow's (tracking.py: `loss` every step, the step metrics at log steps,
`val_loss`/`val_ppl` at evaluations), the parameters as the run's config, and in the run's summary the numbers of
metrics.json (`summary.<key>`), `spotrun.starts`, `resumed_from_step` and `spotrun.stop`.

**Never in training's way**: every W&B call is caught and warned about once; training goes on.
`WANDB_MODE=offline` (W&B's own setting) keeps everything in the job's files, which the tests use.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import wandb

from spotrun.settings.sections import TrackingConfig

from .tracker_base import LOSS, RESUMED_FROM_STEP, SUMMARY_PREFIX, VAL_LOSS, VAL_PPL, NullTracker

log = logging.getLogger("spotrun_trainer.wandb_tracking")

STATE_WANDB_RUN_ID = "wandb_run_id"  # TrainState.tracking's key (beside MLflow's key and run id)
KEY_FIELDS = ("api_key", "WANDB_API_KEY")


def read_api_key(secret_id: str) -> str:
    """The W&B API key from the Secrets Manager secret `secret_id` (the key, or JSON with an api_key field)."""
    import boto3  # NOTE: imported here: only a run tracked by W&B reads a secret

    value = boto3.client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"].strip()
    if value.startswith("{"):
        fields = json.loads(value)
        value = next((fields[k] for k in KEY_FIELDS if isinstance(fields.get(k), str)), "")
    if not value:
        raise ValueError(f"secret {secret_id} holds no W&B API key (the key, or JSON with an api_key field)")
    return value


class WandbTracker(NullTracker):
    """Rank 0's W&B tracker (see the module doc); `key_reader` reads the API key from the named secret."""

    def __init__(self, cfg: TrackingConfig, *, params: Mapping[str, Any],
                 key_reader: Callable[[str], str] = read_api_key):
        self.cfg, self._key_reader = cfg, key_reader
        self.params = {**{str(k): str(v) for k, v in cfg.params.items()},
                       **({"instance_type": cfg.instance_type} if cfg.instance_type else {}),
                       "instance_count": str(cfg.instance_count), **{str(k): str(v) for k, v in params.items()}}
        self.run = None
        self.failures = 0

    def begin(self, ids: dict, *, step: int, segments: list[dict]) -> None:
        run_id = ids.setdefault(STATE_WANDB_RUN_ID, uuid.uuid4().hex[:16])
        try:
            key = self._key_reader(self.cfg.wandb_api_key_secret)
            self.run = wandb.init(project=self.cfg.wandb_project, entity=self.cfg.wandb_entity or None, id=run_id,
                                  resume="allow", name=self.cfg.run_name or None, config=self.params,
                                  settings=wandb.Settings(api_key=key, console="off", silent=True))
        except Exception as exc:  # NOTE: no secret, no network, a refused key: training goes on untracked
            self._failed("start", exc)
            return
        self.run.summary["spotrun.starts"] = len(segments) + 1
        if step > 0:  # a summary value: W&B would drop a metric at a step below the resumed run's current one
            self.run.summary[RESUMED_FROM_STEP] = step

    def losses(self, flushed: Iterable[tuple[int, float]]) -> None:
        for step, loss in flushed:
            self._log(step, {LOSS: loss})

    def step_metrics(self, step: int, values: Mapping[str, float | None]) -> None:
        self._log(step, {k: v for k, v in values.items() if v is not None})

    def evaluation(self, step: int, *, val_loss: float, val_ppl: float) -> None:
        self._log(step, {VAL_LOSS: val_loss, VAL_PPL: val_ppl})

    def summary(self, step: int, summary: Mapping[str, Any]) -> None:
        if self.run is None:
            return
        try:
            for key, value in summary.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.run.summary[SUMMARY_PREFIX + key] = float(value)
        except Exception as exc:
            self._failed("summary", exc)

    def close(self, *, step: int, reason: str, completed: bool, signalled: bool = False) -> bool:
        if self.run is None:
            return self.failures == 0
        try:
            self.run.summary["spotrun.stop"] = f"step={step} reason={reason}"
            # A stopped job leaves the run resumable (exit code 1 marks it failed in W&B until the next start).
            self.run.finish(exit_code=0 if completed else 1)
        except Exception as exc:
            self._failed("finish", exc)
        self.run = None
        return self.failures == 0

    def _log(self, step: int, values: Mapping[str, float]) -> None:
        if self.run is None or not values:
            return
        try:
            self.run.log(dict(values), step=step)
        except Exception as exc:
            self._failed("log", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 100 == 0:
            log.warning("tracking: W&B %s failed (%s: %s) (training is not affected)", what, type(exc).__name__,
                        " ".join(str(exc).split())[:300])
