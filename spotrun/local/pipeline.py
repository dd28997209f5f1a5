"""`spotrun local RUN.json`: the run JSON through the pipeline's stages on this machine, without AWS.

    validate (the run contract) -> prepare the data when data.source is raw text (.txt/.jsonl) -> estimate
    (the planner: instance, limits, checkpoint cadence, cost) -> the container's launcher on a local
    SageMaker-shaped root (config files, channels, checkpoint dir, model dir) -> injected interruptions
    (SIGTERM as SageMaker sends it, or a hard kill of the process tree) with an automatic restart on the same
    checkpoint directory, like managed spot -> registration in a local model registry -> the report.

The estimate needs the token count, so raw text is tokenized (with the tokenizer in model.source) before it.
Relative paths in the run JSON are read relative to the run file. The hyperparameters are the ones the AWS
path passes (the planner's), plus what only a local run needs: process count, port, fixed threads and
deterministic kernels (so that an interrupted and an uninterrupted run can be compared bit for bit).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..contract import RunSpec, RunValidationError, parse_run
from ..gate import check_gate
from ..planner import Estimate, estimate, load_catalog
from ..report import build_local_report, write_report
from ..seams import EXPORT_METADATA, VALIDATION_CHANNEL, Hyperparameter
from ..sources import read_sources
from . import trainer_on_path
from .harness import free_port, kill_tree, loss_records, start_launcher, val_history, write_sagemaker_root
from .progress import Progress
from .registry import DEFAULT_GROUP, register

MAX_RESTARTS = 20
STOP_TIMEOUT_S = 180  # SageMaker allows 120 s after SIGTERM; a local save gets a little more


class LocalRunError(RuntimeError):
    """The local run could not finish; the message says at which stage and why (with the log's path)."""


@dataclass(frozen=True)
class InterruptAt:
    """One injected interruption: after the run reaches `step`, or `seconds` after the first start."""

    step: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> "InterruptAt":
        m = re.fullmatch(r"\s*(\d+)\s*", text) or re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*s\s*", text)
        if not m or float(m[1]) <= 0:
            raise ValueError(f"--interrupt-at={text!r} is invalid: expected a step (e.g. 12) or seconds after the "
                             "start (e.g. 30s), greater than 0")
        return cls(step=int(m[1])) if text.strip().isdigit() else cls(seconds=float(m[1]))

    def due(self, step: int, elapsed_s: float) -> bool:
        return step >= self.step if self.step is not None else elapsed_s >= self.seconds

    def __str__(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.seconds:g}s"


@dataclass(frozen=True)
class LocalOptions:
    out: Path
    """Where the job directory and the local registry go."""
    interrupts: tuple[InterruptAt, ...] = ()
    hard_kill: bool = False
    """Interrupt with SIGKILL of the whole process tree (an instance vanishing) instead of SIGTERM (a notice)."""
    nproc: int = 2
    """Worker processes (the local stand-in for the instance's GPUs)."""
    overrides: dict[str, str] = field(default_factory=dict)
    """Trainer hyperparameters set on top of the planner's (`--set checkpoint.interval_steps=10`)."""
    job_name: str | None = None
    """Job directory name under `out` (default: the run's name and the start time)."""
    progress: str = "auto"
    """bar (a terminal progress bar), lines (plain lines, for CI and logs), none, or auto (bar on a terminal)."""


@dataclass
class _Job:
    root: Path
    sm: Path
    checkpoints: Path
    log: Path

    @property
    def output(self) -> Path:
        return self.sm / "model"


def load_run(run_path: Path) -> tuple[dict, RunSpec]:
    """The run JSON with its local sources made absolute (relative to the run file), and its validated spec."""
    run_path = Path(run_path)
    try:
        raw = json.loads(run_path.read_text())
    except OSError as exc:
        raise RunValidationError("run", str(run_path), f"a readable run JSON file ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise RunValidationError("run", str(run_path), f"valid JSON ({exc.msg} at line {exc.lineno})") from None
    parse_run(raw)  # the contract first: its errors name the field
    if "source" not in raw["data"]:
        raise RunValidationError("data.source", None, "a local path of raw .txt/.jsonl text or prepared shards "
                                 "(`spotrun local` trains on real data; data.tokens alone only estimates)")
    if "parameters" in raw["model"]:
        raise RunValidationError("model.parameters", raw["model"]["parameters"], "model.source or model.config "
                                 "for a training run (a bare count only estimates)")
    for section, key in (("model", "source"), ("data", "source"), ("data", "validation")):
        source = raw[section].get(key)
        if source is None:
            continue
        if source.startswith("s3://"):
            raise RunValidationError(f"{section}.{key}", source, "a local path for `spotrun local` (runs with "
                                     "s3:// sources start on AWS with `spotrun start`)")
        path = (run_path.parent / source).resolve()
        if not path.exists():
            raise RunValidationError(f"{section}.{key}", source, f"an existing path (looked at {path})")
        raw[section][key] = str(path)
    return raw, parse_run(raw)


def _fingerprint(paths: list[Path]) -> str:
    """Names, sizes and modification times of every file under `paths`: what a prepared copy depends on."""
    digest = hashlib.sha256()
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            st = path.stat()
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def prepare_if_raw(raw: dict, cache: Path) -> tuple[dict, str]:
    """Tokenize data.source into shards when it is raw text (no index.json); returns the run and what was done
    ("" for prepared shards, "prepared", or "reused").

    Shards go to `cache/<fingerprint of the text and the tokenizer>/`: a second run on unchanged text reuses
    them (an interrupted prepare leaves no index.json, so it is redone)."""
    source = Path(raw["data"]["source"])
    if (source / "index.json").is_file():
        return raw, ""
    model_source = raw["model"].get("source")
    if not model_source or not (Path(model_source) / "tokenizer_config.json").is_file():
        raise RunValidationError("data.source", raw["data"]["source"], "prepared shards (a directory with "
                                 "index.json), or raw .txt/.jsonl text with a tokenizer in model.source")
    tokenizer_files = [p for p in Path(model_source).iterdir() if p.name.startswith(("tokenizer", "special_tokens"))]
    fraction = raw["data"].get("validation_fraction") or 0.0  # parse_run checks it after the prepare
    data_out = Path(cache) / (_fingerprint([source, *tokenizer_files]) + (f"-val{fraction!r}" if fraction else ""))
    done = "reused"
    if not (data_out / "index.json").is_file():
        done = "prepared"
        trainer_on_path()
        from spotrun_trainer.data import DataError, prepare

        shutil.rmtree(data_out, ignore_errors=True)
        try:
            prepare([source], model_source, data_out, shard_bytes=4 * 1024 * 1024,
                    validation_fraction=float(fraction) if isinstance(fraction, (int, float)) else 0.0)
        except DataError as exc:
            raise RunValidationError("data.source", raw["data"]["source"], f"text the trainer can read ({exc})") \
                from None
    return {**raw, "data": {**raw["data"], "source": str(data_out)}}, done


def hyperparameters(raw: dict, est: Estimate, options: LocalOptions) -> dict[str, str]:
    hyper = dict(est.hyperparameters)
    # No cost cap binds a local run: one job, no segments (its MaxRuntime is SageMaker's, not enforced here).
    hyper.pop(Hyperparameter.SEGMENT_SECONDS.value, None)
    if raw["model"].get("config") is not None:
        hyper[Hyperparameter.MODEL_CONFIG.value] = json.dumps(raw["model"]["config"], separators=(",", ":"))
    hyper.update({"nproc_per_node": str(options.nproc), "master_port": str(free_port()), "num_threads": "1",
                  "deterministic": "true", "log_every": "5"})
    hyper.update({k: str(v) for k, v in options.overrides.items()})
    return hyper


def run_local(run_path: Path, options: LocalOptions, *, emit: Callable[[str], None] = print) -> dict:
    """Run the pipeline; returns the report (also written as report.json/.txt and loss.png in the job dir)."""
    raw, run = load_run(run_path)
    out = Path(options.out).resolve()
    job_name = options.job_name or f"{run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    root = out / job_name
    if root.exists():
        raise LocalRunError(f"job directory {root} exists: choose another --job-name or remove it")
    job = _Job(root=root, sm=root / "sm", checkpoints=root / "checkpoints", log=root / "launcher.log")
    root.mkdir(parents=True)

    raw, prepared = prepare_if_raw(raw, out / "prepared")
    if prepared:
        emit(f"[local] raw text {prepared}: shards in {raw['data']['source']}")
    run = parse_run(raw)
    sources = read_sources(run)
    model_config, tokens = sources.model_config, sources.tokens
    catalog = load_catalog()
    est = estimate(run, catalog=catalog, model_config=model_config, data_tokens=tokens,  # EstimateRefused stops here
                   validation_tokens=sources.validation_tokens)
    emit(f"[local] estimate: {est.instance_count} x {est.instance_type}, {est.wall_seconds / 3600:.2f} h, "
         f"spot ${est.cost_usd['spot']:.2f} / on-demand ${est.cost_usd['on_demand']:.2f} (cap ${run.max_usd:.2f})")
    (root / "run.json").write_text(json.dumps(raw, indent=2))
    (root / "estimate.json").write_text(json.dumps(est.to_json(), indent=2))

    channels = {"train": Path(raw["data"]["source"])}
    if run.data.validation is not None:
        channels[VALIDATION_CHANNEL] = Path(run.data.validation)
    if raw["model"].get("source"):
        channels["model"] = Path(raw["model"]["source"])
    write_sagemaker_root(job.sm, hyperparameters=hyperparameters(raw, est, options), channels=channels,
                         checkpoint_dir=job.checkpoints)
    emit(f"[local] job {root} (launcher log {job.log})")

    history = _train(job, options, emit)
    metrics_path = job.output / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    records = loss_records(job.output)
    family = est.instance_type.split(".")[1]
    discount = run.compute.spot_discount if run.compute.spot_discount is not None else \
        catalog["families"][family]["spot_discount"]
    usd_per_hour = catalog["instances"][est.instance_type]["on_demand_usd_per_hour"] * est.instance_count
    evaluation = json.loads((job.output / EXPORT_METADATA).read_text()).get("evaluation")
    report = build_local_report(run=run, estimate=est, job_name=job_name, metrics=metrics, losses=records,
                                history=history, usd_per_hour=usd_per_hour, spot_discount=discount,
                                evaluation=evaluation)
    report["model_data_url"] = str(job.output)
    if run.gate is not None:  # the same rule as the state machine's (spotrun/gate.py)
        gate = check_gate(run.gate, base=report["base_val_loss"], final=report["final_val_loss"])
        report["gate"] = {"passed": gate.passed, "cause": gate.cause}
        emit(f"[local] {gate.cause}")
    if report.get("gate", {}).get("passed", True):
        entry = register(out / "registry", run.model_package_group or DEFAULT_GROUP, model_dir=job.output,
                         description=f"spotrun run {run.name} ({job_name})", approval_status=run.approval_status,
                         report=report)
        report["model_data_url"] = str(entry / "model")
        report["model_package"] = str(entry)
    else:
        report["status"] = "GateFailed"  # not registered; the model stays in the job's directory
    paths = write_report(report, records, root, val=val_history(job.output))
    report["files"] = {k: str(v) for k, v in paths.items()}
    (root / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _train(job: _Job, options: LocalOptions, emit: Callable[[str], None]) -> dict:
    """Start the launcher, interrupt it as asked, restart it on the same checkpoints until the run completes.

    Returns the timeline: starts (launcher process lifetimes), interruptions (when, how, the step reached, the
    checkpoint it resumed from, seconds lost until training passed that step again)."""
    pending = list(options.interrupts)
    progress = Progress(job.log, mode=options.progress, emit=emit)
    t0 = time.monotonic()
    starts: list[dict] = []
    interruptions: list[dict] = []
    while True:
        if len(starts) > MAX_RESTARTS:
            raise LocalRunError(f"more than {MAX_RESTARTS} restarts; see {job.log}")
        proc = start_launcher(job.sm, job.log)
        start = {"started_s": round(time.monotonic() - t0, 3)}
        starts.append(start)
        interrupted = None
        try:
            while proc.poll() is None:
                step = max((s for s, _ in loss_records(job.output)), default=0)
                progress.update(step, interruptions=len(interruptions))
                if interruptions and "resumed_s" not in interruptions[-1] and step > interruptions[-1]["step"]:
                    last = interruptions[-1]
                    last["resumed_s"] = round(time.monotonic() - t0, 3)
                    last["lost_s"] = round(last["resumed_s"] - last["at_s"], 3)
                if pending and pending[0].due(step, time.monotonic() - t0):
                    interrupted = _interrupt(proc, job, pending.pop(0), step, options.hard_kill, t0)
                    break
                time.sleep(0.2)
        except BaseException:  # Ctrl-C or an error here: leave no training processes behind
            kill_tree(proc)
            progress.close()
            raise
        rc = proc.wait()
        start["ended_s"] = round(time.monotonic() - t0, 3)
        start["exit_code"] = rc
        if interrupted is not None:
            interruptions.append(interrupted)
            progress.note(f"interruption {len(interruptions)} ({interrupted['kind']}) at step {interrupted['step']}:"
                          f" exit {rc}, newest checkpoint step {interrupted['checkpoint_step']}; restarting on the "
                          "same checkpoint directory")
            if (job.output / "metrics.json").is_file() and rc == 0:
                break  # the run had finished when the interruption came
            continue
        if rc == 0 and (job.output / "metrics.json").is_file():
            break
        failure = job.sm / "output" / "failure"
        reason = failure.read_text().strip() if failure.is_file() else f"exit code {rc}"
        raise LocalRunError(f"training failed: {reason}; see {job.log}")
    step = max((s for s, _ in loss_records(job.output)), default=0)
    progress.update(step, interruptions=len(interruptions))
    progress.close()
    for left in pending:
        emit(f"[local] interruption at {left} not injected: the run finished first")
    return {"starts": starts, "interruptions": interruptions, "wall_s": round(time.monotonic() - t0, 3),
            "not_injected": [str(p) for p in pending]}


def _interrupt(proc: subprocess.Popen, job: _Job, at: InterruptAt, step: int, hard: bool, t0: float) -> dict:
    trainer_on_path()
    from spotrun_trainer.checkpoint import committed_checkpoints

    at_s = time.monotonic() - t0
    if hard:
        kill_tree(proc)
    else:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
    reached = max((s for s, _ in loss_records(job.output)), default=step)
    newest = committed_checkpoints(job.checkpoints)
    return {"trigger": str(at), "kind": "hard-kill" if hard else "sigterm", "at_s": round(at_s, 3),
            "step": reached, "stop_s": round(time.monotonic() - t0 - at_s, 3),
            "checkpoint_step": newest[0][0] if newest else 0}
