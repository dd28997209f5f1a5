"""`spotrun local RUN.json`: the run JSON through the pipeline's stages on this machine, without AWS.

    validate (the run contract; a hub model.source fetched into OUT/models/ once, docs/models.md; the model
    directory, seq_len within the model's positions) -> prepare the data
    when data.source is raw text (spotrun.cli.datasets: content-addressed, so unchanged text and tokenizer are reused)
    -> estimate (the planner) -> one step of data for the planned batch -> the container's launcher on a local
    SageMaker-shaped root, interrupted as asked and restarted like managed spot (supervisor.py) -> registration
    in a local model registry -> the report (measured here vs priced at the planned instance's rates).

The run file is read by spotrun.contract.runfile.load_run_file (as every command reads it: relative paths in it are read
relative to the run file), and planned by the estimate Lambda's own function (`plan_local`: the pipeline's rules,
the sources, the planner, the hyperparameters' limits) with local settings: sources on this machine, no stage
limits. Every input problem is a Refusal before the job directory exists or any worker starts.
`spotrun local --resume JOB` (`resume_local`) continues a job stopped by Ctrl-C or by a failure on its own
checkpoints, hyperparameters, plan and clock. The hyperparameters are the plan's (those the AWS path sends),
without the segment length (no cap binds a local job), plus what only a local run needs: process count, port,
fixed threads and deterministic kernels (so that an interrupted and an uninterrupted run can be compared bit for
bit).
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..cli.datasets import PrepareError, input_files, prepare_dataset
from ..cli.models import ModelDirError, check_weights
from ..contract.hub_id import is_hub_id, parse_hub_id
from ..contract.json_text import JsonSyntaxError, loads
from ..contract.refusal import Refusal
from ..contract.runfile import SOURCE_FIELDS, load_run_file
from ..contract.spec import ABSENT, RunSpec, RunValidationError, parse_run
from ..pipeline.hub_fetch import HubFetchError, fetch_into
from ..pipeline.plan import plan
from ..pipeline.report import build_local_report
from ..pipeline.validate import THIS_MACHINE
from ..planner.catalog import usd
from ..planner.estimate import DEFAULT_PRICE_REGION, load_catalog
from ..planner.sources import check_seq_len
from ..seams import EXPORT_METADATA, SAMPLES_FILE, DatasetIndex, PipelineSettings, Plan, PlanStatus
from ..settings.checks import ConfigError
from ..settings.tree import TrainConfig
from ..settings.wire import flatten, parse
from .batch import LocalBatch, local_batch, with_batch
from .harness import free_port, loss_records, val_history, write_sagemaker_root
from .registry import DEFAULT_GROUP, register
from .report_files import write_report
from .supervisor import InterruptAt, Job, LocalConfigError, LocalRunError, LocalStopped, Supervisor

LOCAL_EXECUTION = "local"  # the execution name a local plan is made for (its job names and tags are not used)
PLAN_FILE = "plan.json"  # the job's plan, beside run.json: what --resume continues with
PREPARED_DIR = "prepared"  # the prepared-data cache: under --out (`spotrun local`), beside the run file (`estimate`)
LOCAL_OUT = Path("runs")  # `spotrun local`'s default --out (its job directories, registry and prepared/)

__all__ = ["InterruptAt", "LocalConfigError", "LocalOptions", "LocalRunError", "LocalStopped", "load_run",
           "resume_local", "run_local"]


@dataclass(frozen=True)
class LocalOptions:
    out: Path
    """Where the job directory and the local registry go."""
    interrupts: tuple[InterruptAt, ...] = ()
    """When to interrupt (any order: steps are taken in step order, seconds in time order)."""
    hard_kill: bool = False
    """Interrupt with SIGKILL of the whole process tree (an instance vanishing) instead of SIGTERM (a notice)."""
    nproc: int | None = None
    """Worker processes (the local stand-in for the instance's GPUs); None: 2, or 1 when the plan's samples per
    optimizer step are odd (they are shared among the workers: spotrun/local/batch.py)."""
    overrides: dict[str, str] = field(default_factory=dict)
    """Trainer hyperparameters set on top of the planner's (`--set checkpoint.interval_steps=10`)."""
    job_name: str | None = None
    """Job directory name under `out` (default: the run's name and the start time)."""
    progress: str = "auto"
    """bar (a terminal progress bar), lines (plain lines, for CI and logs), none, or auto (bar on a terminal)."""
    hub_endpoint: str | None = None
    """The hub a `hf://` model.source is fetched from (HF_ENDPOINT; None: huggingface_hub's default)."""


def load_run(run_path: Path, models: Path | None = None, *, hub_endpoint: str | None = None,
             emit: Callable[[str], None] = print) -> tuple[dict, RunSpec]:
    """The run JSON (spotrun.contract.runfile.load_run_file: strict, its local sources absolute, relative ones read from
    the run file's directory) and its validated spec, with what a local training run needs on top. A hub id in
    model.source is fetched into `models` (the local stand-in of the stage's models/; reused when complete) and the
    run trains on that copy, as the pipeline's preparation step does."""
    loaded = load_run_file(run_path)
    raw, run = loaded.raw, loaded.run
    if is_hub_id(run.model.source) and models is not None:
        raw = fetch_hub_model(raw, models, hub_endpoint, emit)
        run = parse_run(raw)
    if run.data.source is None:
        raise RunValidationError("data.source", ABSENT, "a local path of raw .txt/.jsonl text or prepared shards "
                                 "(`spotrun local` trains on real data; data.tokens alone only estimates)")
    if run.model.parameters is not None:
        raise RunValidationError("model.parameters", run.model.parameters, "model.source or model.config "
                                 "for a training run (a bare count only estimates)")
    for section, key in SOURCE_FIELDS:
        source, written = raw[section].get(key), loaded.written[section].get(key)
        if source is None:
            continue
        if source.startswith("s3://"):
            raise RunValidationError(f"{section}.{key}", source, "a local path for `spotrun local` (runs with "
                                     "s3:// sources start on AWS with `spotrun start`)")
        path = Path(source)
        if not path.exists():
            raise RunValidationError(f"{section}.{key}", written, f"an existing path (looked at {path})")
        if (section, key) == ("model", "source"):
            check_model_source_dir(path, written)
            check_model_weights(path, written)
    if run.model.source is not None:  # before any preparing: the model's positions bound seq_len
        try:
            config = loads((Path(run.model.source) / "config.json").read_text(encoding="utf-8"))
        except JsonSyntaxError as exc:
            raise RunValidationError("model.source", run.model.source, f"a valid JSON config.json (not JSON "
                                     f"{exc.where_what})", excerpt=exc.excerpt) from None
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: also text that is not UTF-8
            raise RunValidationError("model.source", run.model.source, "a readable config.json "
                                     f"({getattr(exc, 'strerror', None) or 'not UTF-8 JSON text'})") from None
        check_seq_len(run, config)
    return raw, run


def fetch_hub_model(raw: dict, models: Path, endpoint: str | None, emit: Callable[[str], None]) -> dict:
    """The run with its hub model.source replaced by the local copy (spotrun/pipeline/hub_fetch.py `fetch_into`)."""
    source = raw["model"]["source"]
    try:
        path, manifest, reused = fetch_into(models, parse_hub_id(source), endpoint=endpoint)
    except HubFetchError as exc:
        raise RunValidationError("model.source", source, f"a hub model that can be fetched ({exc})") from None
    emit(f"[local] {source}: {'reused' if reused else 'fetched'} commit {manifest['commit']} "
         f"({len(manifest['files'])} files) in {path}")
    return {**raw, "model": {**raw["model"], "source": str(path)}}


def check_model_source_dir(path: Path, source: str) -> None:
    """model.source must be a Hugging Face model directory: an empty one (or any without config.json) is named."""
    if not path.is_dir():
        raise RunValidationError("model.source", source, f"a Hugging Face model directory ({path} is not one)")
    if not (path / "config.json").is_file():
        found = sorted(p.name for p in path.iterdir())[:5]
        what = "it is empty" if not found else f"it holds {', '.join(found)}"
        raise RunValidationError("model.source", source, f"a Hugging Face model directory with config.json ({path}: "
                                 f"{what})")


def check_model_weights(path: Path, source: str) -> None:
    """A model directory to train from holds whole safetensors weights (spotrun.cli.models, as `upload-model`
    checks them): missing or truncated ones would fail only in the job, after its start. The estimate plans on
    config.json alone and does not ask for them."""
    try:
        check_weights(path)
    except ModelDirError as exc:
        raise RunValidationError("model.source", source, f"a model directory with whole safetensors weights "
                                 f"({exc})") from None


def prepared_beside(run_path: Path) -> Path:
    """Where `spotrun estimate` prepares a run's raw text (unless --prepared says): prepared/ beside the run file;
    `spotrun local` looks there too before it tokenizes anything."""
    return Path(run_path).parent / PREPARED_DIR


def local_prepared(run_path: Path) -> tuple[Path, ...]:
    """Where `spotrun local` with its default --out leaves a run's prepared shards: runs/prepared under the working
    directory, and under the run file's directory (run from there). `spotrun estimate` and `simulate` reuse a
    complete `<key>/` there, as `local` reuses the estimate's beside the run file, so neither tokenizes the same
    text twice."""
    found = []
    for base in (Path.cwd(), Path(run_path).resolve().parent):
        cache = (base / LOCAL_OUT / PREPARED_DIR).resolve()
        if cache not in found:
            found.append(cache)
    return tuple(found)


def prepare_if_raw(raw: dict, cache: Path, emit: Callable[[str], None] = print,
                   also: tuple[Path, ...] = ()) -> tuple[dict, str]:
    """Tokenize data.source into shards when it is raw text (no index.json); returns the run and what was done
    ("" for prepared shards, "prepared", or "reused").

    Shards go to `cache/<key>/` (spotrun.cli.datasets: the inputs' bytes, every tokenizer file of model.source,
    chat_template.jinja included, and the options): a second run on the same text and tokenizer reuses them, as it
    reuses a complete `<key>/` of the caches in `also` (the key, recorded in each dataset's marker, proves they
    hold these shards)."""
    source = Path(raw["data"]["source"])
    if (source / DatasetIndex.FILE).is_file():
        return raw, ""
    check_raw_text(raw["data"]["source"])  # an empty directory is data.source's fault, not the tokenizer's
    model_source = raw["model"].get("source")
    if not model_source:
        raise RunValidationError("data.source", raw["data"]["source"], "prepared shards (a directory with "
                                 "index.json), or raw text with a tokenizer in model.source")
    if is_hub_id(model_source):  # `spotrun local` fetched it before; the estimate never contacts the hub
        raise RunValidationError("model.source", model_source, "a local model directory with its tokenizer, to "
                                 "prepare the raw text in data.source: the estimate never fetches a hub id (`spotrun "
                                 "local --out OUT` fetches it into OUT/models/_hub/<org>/<name>/<revision>/: name "
                                 "that copy), or prepared shards in data.source")
    if not any((Path(model_source) / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        raise RunValidationError("model.source", raw["model"]["source"], "a model directory with its tokenizer "
                                 "(tokenizer.json or tokenizer_config.json), to prepare the raw text in data.source")
    try:
        fraction = raw["data"].get("validation_fraction") or 0.0  # parse_run checked it
        prepared = prepare_dataset([source], Path(model_source), cache=cache, also=also, shard_bytes=4 * 1024 * 1024,
                                   emit=emit, validation_fraction=float(fraction))
    except PrepareError as exc:
        raise RunValidationError("data.source", raw["data"]["source"], f"text the trainer can read ({exc})") \
            from None
    return {**raw, "data": {**raw["data"], "source": str(prepared.path)}}, "reused" if prepared.reused else "prepared"


def prepared_line(how: str, shards: Path, caches: tuple[Path, ...]) -> str:
    """What was done with raw text: its shards reused (found under their content key) or prepared now."""
    if how == "reused":
        return (f"raw text: reused the shards in {shards} (prepared before from the same inputs, tokenizer and "
                f"settings: content key {shards.name}); nothing tokenized")
    return (f"raw text: prepared into {shards} (content key {shards.name}: no shards of these inputs, tokenizer and "
            f"settings in {' or '.join(str(c) for c in dict.fromkeys(caches))})")


def check_raw_text(source: str) -> None:
    """A local data.source without index.json is raw text: it holds files the trainer tokenizes (its discovery,
    `spotrun_trainer.data.input_files`), or it is refused by name before the tokenizer in model.source is asked for."""
    try:
        input_files([Path(source)])
    except PrepareError as exc:
        raise RunValidationError("data.source", source, f"prepared shards (a directory with {DatasetIndex.FILE}) "
                                 f"or raw text files to prepare ({exc})") from None


def check_raw_split(run: RunSpec) -> None:
    """Raw text for a run that reads a validation loss is split when it is prepared: without a fraction it would
    be prepared without one, and refused by the sources only after the tokenizing."""
    needed_by = run.validation_needed_by
    if needed_by and not run.data.has_validation and not (Path(run.data.source) / DatasetIndex.FILE).is_file():
        raise RunValidationError(needed_by, "no validation data", f"data.validation_fraction (e.g. 0.1: that share "
                                 "of the documents of raw data.source is held out when it is prepared) or "
                                 f"data.validation: {needed_by} reads a validation loss")


def check_one_step(data_dir: Path, settings: TrainConfig, nproc: int) -> None:
    """The dataset holds at least one step of samples (the launcher checks it too, after its start-up);
    `settings`: the workers' (their micro-batch, spotrun/local/batch.py)."""
    index = json.loads((Path(data_dir) / DatasetIndex.FILE).read_text())
    seq_len, micro_batch = settings.data.seq_len, settings.training.micro_batch
    samples = sum(int(s["tokens"]) // seq_len for s in index["shards"])
    if samples < micro_batch * nproc:
        raise RunValidationError("data.source", str(data_dir), f"at least one step of samples: it holds {samples} "
                                 f"samples of seq_len={seq_len} tokens ({index['total_tokens']} tokens) and one step "
                                 f"needs micro_batch x processes = {micro_batch} x {nproc}; add data or lower "
                                 "data.seq_len")


def local_settings(run: RunSpec) -> PipelineSettings:
    """The deployment a local run is planned for: this machine (sources are local paths), the run's model package
    group or the local registry's default, the catalog's prices in its default region, no stage limits, and the
    run's own tracking server (no stage lists servers here: the user's loopback server is theirs to name)."""
    servers = (run.tracking.mlflow_uri,) if run.tracking.mlflow_uri else ()
    secrets = (run.tracking.wandb_api_key_secret,) if run.tracking.wandb_api_key_secret else ()
    return PipelineSettings(bucket=THIS_MACHINE, job_prefix="", model_package_group=run.model_package_group or
                            DEFAULT_GROUP, poll_seconds=60, project="spotrun", stage="local", cost_center="",
                            region=DEFAULT_PRICE_REGION, mlflow_tracking_servers=servers,
                            wandb_api_key_secrets=secrets)


def plan_local(raw: dict) -> Plan:
    """The plan of a local run: the estimate Lambda's own function (the contract, the pipeline's rules, the sources,
    the planner, the hyperparameters and their limits) with local settings; a Refusal when it refuses the run."""
    planned = plan(raw, LOCAL_EXECUTION, local_settings(parse_run(raw)))
    if planned["status"] != PlanStatus.OK.value:
        raise Refusal(planned["status"], planned["message"], field=planned.get("field"))
    return Plan.from_json(planned)


def hyperparameters(planned: Plan, options: LocalOptions, batch: LocalBatch | None = None) -> dict[str, str]:
    """The plan's hyperparameters (as the AWS path sends them) with the plan's samples per step shared among the
    workers (`batch`: spotrun/local/batch.py `local_batch`, made here when not given), plus what only a local run
    needs."""
    settings = parse(planned.hyperparameters)
    batch = batch or local_batch(planned, settings, options.nproc, options.overrides)
    # No cost cap binds a local run: one job, no segments (its MaxRuntime is SageMaker's, not enforced here).
    hyper = flatten(replace(with_batch(settings, batch), segment_seconds=0.0))
    hyper.update({"nproc_per_node": str(batch.nproc), "master_port": str(free_port()), "num_threads": "1",
                  "deterministic": "true", "log_every": "5"})
    hyper.update({k: str(v) for k, v in options.overrides.items()})
    return hyper


def channels_of(planned: Plan) -> dict[str, Path]:
    """The plan's input channels as local directories (a local plan's channel URIs are paths)."""
    return {c["ChannelName"]: Path(c["DataSource"]["S3DataSource"]["S3Uri"]) for c in planned.input_data_config}


def run_local(run_path: Path, options: LocalOptions, *, emit: Callable[[str], None] = print) -> dict:
    """Run the pipeline; returns the report (also written as report.json/.txt and loss.png in the job dir).

    Every input problem is found before the job directory exists or any worker starts (a Refusal)."""
    if importlib.util.find_spec("spotrun_trainer") is None:  # the workers run it: said before any job directory
        raise ModuleNotFoundError("No module named 'spotrun_trainer'", name="spotrun_trainer")
    out = Path(options.out).resolve()
    raw, run = load_run(run_path, out / "models", hub_endpoint=options.hub_endpoint, emit=emit)
    job_name = options.job_name or f"{run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    root = out / job_name
    if root.exists():  # invalid input (exit 2), found before anything is prepared or planned
        held = (f"{root} holds a job that completed: its report is {root / 'report.txt'}"
                if (root / "report.json").is_file() else
                f"{root} holds a job that did not finish: continue it with `spotrun local --resume {job_name} --out "
                f"{options.out}`")
        raise RunValidationError("--job-name", job_name, f"a name no job directory under --out has ({held}); or "
                                 "choose another --job-name")
    check_raw_split(run)
    caches = (out / PREPARED_DIR, prepared_beside(Path(run_path).resolve()))
    raw, prepared = prepare_if_raw(raw, caches[0], emit, also=caches[1:])
    if prepared:
        emit(f"[local] {prepared_line(prepared, Path(raw['data']['source']), caches)}")
    planned = plan_local(raw)  # InvalidRun / OverBudget stop here
    est = planned.estimate
    emit(f"[local] estimate: {planned.instance_count} x {planned.instance_type}, "
         f"{est.wall_seconds / 3600:.2f} h, spot {usd(est.cost_usd['spot'])} / on-demand "
         f"{usd(est.cost_usd['on_demand'])} (cap {usd(planned.max_usd)})")
    settings = parse(planned.hyperparameters)
    batch = local_batch(planned, settings, options.nproc, options.overrides)  # the plan's samples per step
    emit(f"[local] {batch.line()}")
    hyper = hyperparameters(planned, options, batch)
    check_one_step(Path(raw["data"]["source"]), with_batch(settings, batch), batch.nproc)
    job = Job(root=root, log=root / "launcher.log")
    check_interrupts(options.interrupts, checked_launch(job, hyper, channels_of(planned)), planned.max_runtime_seconds)
    root.mkdir(parents=True)
    (root / "run.json").write_text(json.dumps(raw, indent=2))
    (root / PLAN_FILE).write_text(json.dumps(planned.to_json(), indent=2))
    (root / "estimate.json").write_text(json.dumps(est.to_json(), indent=2))
    write_sagemaker_root(job.sm, hyperparameters=hyper, channels=channels_of(planned), checkpoint_dir=job.checkpoints)
    emit(f"[local] job {root} (launcher log {job.log})")
    return _train_and_finish(job, job_name, out, options, emit)


def resume_local(job_ref: str, options: LocalOptions, *, emit: Callable[[str], None] = print) -> dict:
    """Continue an interrupted or stopped job (its directory under options.out, or a path) on its checkpoints."""
    out = Path(options.out).resolve()
    root = Path(job_ref) if Path(job_ref).is_dir() and (Path(job_ref) / "run.json").is_file() else out / job_ref
    root = root.resolve()
    config = root / "sm" / "input" / "config" / "hyperparameters.json"
    if not (root / "run.json").is_file() or not config.is_file():
        raise RunValidationError("--resume", job_ref, f"a local job directory with run.json and sm/ (looked at {root})")
    if (root / "report.json").is_file():
        raise RunValidationError("--resume", job_ref, f"a job that did not finish ({root} completed: its report is "
                                 f"{root / 'report.txt'})")
    hyper = json.loads(config.read_text())
    hyper["master_port"] = str(free_port())  # the old one may be taken now
    job = Job(root=root, log=root / "launcher.log")
    data = job.sm / "input" / "data"
    planned_at = root / PLAN_FILE  # a job of an older spotrun: planned again
    planned = Plan.from_json(json.loads(planned_at.read_text())) if planned_at.is_file() else \
        plan_local(json.loads((root / "run.json").read_text()))
    check_interrupts(options.interrupts, checked_launch(job, hyper, {p.name: p.resolve() for p in data.iterdir()}),
                     planned.max_runtime_seconds)
    config.write_text(json.dumps(hyper))
    emit(f"[local] resuming job {root} (launcher log {root / 'launcher.log'})")
    return _train_and_finish(job, root.name, root.parent, options, emit)


def checked_launch(job: Job, hyper: dict[str, str], channels: dict[str, Path]) -> int:
    """What the container's launcher checks before it starts any worker (the hyperparameters, `--set` included,
    parsed by the trainer's own config; the model; one step of data), done here before the job directory is made:
    a typo is refused without leaving an empty job behind. Returns the run's steps (the trainer's total_steps for
    the job's processes on this machine's CPUs)."""
    # NOTE: imported here: the trainer is a separate package, needed only once a run is about to start.
    from spotrun_trainer.data import read_index, total_steps
    from spotrun_trainer.launcher import SageMakerEnv, check_inputs, plan_launch

    sm = SageMakerEnv(root=job.sm, current_host="algo-1", hosts=["algo-1"], network_interface_name="lo",
                      instance_type="", hyperparameters=hyper, checkpoint_local_path=str(job.checkpoints),
                      channels=channels)
    try:
        launch = plan_launch(sm, gpu_count=0, efa_devices=[], ofi_nccl_found=False,
                             config_path=job.root / "train_config.json", outcome_dir=job.root / "outcome")
        check_inputs(launch.config, world_size=launch.nproc_per_node)
    except ConfigError as exc:
        raise LocalConfigError(f"invalid configuration: {exc} (found before the job started: no job directory "
                               "was made)") from None
    cfg = launch.config
    return total_steps(read_index(Path(cfg.data.path)), seq_len=cfg.data.seq_len, epochs=cfg.training.epochs,
                       samples_per_step=cfg.training.micro_batch * launch.nproc_per_node * cfg.training.grad_accum,
                       max_steps=cfg.max_steps)


def check_interrupts(interrupts: tuple[InterruptAt, ...], steps: int, max_runtime_s: int) -> None:
    """An interruption the run never reaches is refused before the run starts, not reported as "not injected"
    after it: a step past its last (after which nothing is left to interrupt), or a time at or past the plan's
    MaxRuntime (`max_runtime_s`: SageMaker stops the job it stands in for by then)."""
    late = [t.step for t in interrupts if t.step is not None and t.step >= steps]
    if late:
        raise RunValidationError("--interrupt-at", max(late), f"a step from 1 to {steps - 1}: the run has {steps} "
                                 "steps (the planned data, batch and processes), or seconds after the start (e.g. "
                                 "30s)")
    after = [t for t in interrupts if t.seconds is not None and t.seconds >= max_runtime_s]
    if after:
        raise RunValidationError("--interrupt-at", str(max(after, key=lambda t: t.seconds)), f"seconds after the "
                                 f"start below {max_runtime_s}s, the plan's MaxRuntime (SageMaker stops the job "
                                 f"then), or a step from 1 to {steps - 1}")


def _train_and_finish(job: Job, job_name: str, out: Path, options: LocalOptions,
                      emit: Callable[[str], None]) -> dict:
    raw = json.loads((job.root / "run.json").read_text())
    run = parse_run(raw)
    planned_at = job.root / PLAN_FILE  # what the job was started with (a job of an older spotrun: planned again)
    planned = Plan.from_json(json.loads(planned_at.read_text())) if planned_at.is_file() else plan_local(raw)
    hint = f"spotrun local --resume {job.root}"
    history = Supervisor(job, triggers=options.interrupts, hard_kill=options.hard_kill, progress=options.progress,
                         emit=emit, resume_hint=hint).run()
    metrics = json.loads((job.output / "metrics.json").read_text())
    records = loss_records(job.output)
    family = planned.instance_type.split(".")[1]
    discount = run.compute.spot_discount if run.compute.spot_discount is not None else \
        load_catalog()["families"][family]["spot_discount"]
    evaluation = json.loads((job.output / EXPORT_METADATA).read_text()).get("evaluation")
    samples_at = job.output / SAMPLES_FILE  # the trainer writes it with validation data (spotrun_trainer/samples.py)
    samples = json.loads(samples_at.read_text()) if samples_at.is_file() else None
    # The gate is the state machine's rule (spotrun/pipeline/gate.py), applied by the one report builder.
    report = build_local_report(plan=planned, spot=run.compute.spot, job_name=job_name, metrics=metrics,
                                losses=records, history=history, spot_discount=discount, evaluation=evaluation,
                                samples=samples,
                                model_data_url=str(job.output))
    if run.gate is not None:
        emit(f"[local] {report['gate']['cause']}")
    if report["gate"]["passed"]:
        entry = register(out / "registry", run.model_package_group or DEFAULT_GROUP, model_dir=job.output,
                         description=f"spotrun run {run.name} ({job_name})", approval_status=run.approval_status,
                         report=report)
        report["model_data_url"] = str(entry / "model")
        report["model_package"] = str(entry)
    else:
        report["status"] = "GateFailed"  # not registered; the model stays in the job's directory
    paths = write_report(report, records, job.root, val=val_history(job.output))
    report["files"] = {k: str(v) for k, v in paths.items()}
    (job.root / "report.json").write_text(json.dumps(report, indent=2))
    return report
