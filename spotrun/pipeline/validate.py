"""One set of rules for every run, two front ends: the estimate Lambda and `spotrun validate` / `estimate`
(spotrun/cli/estimate.py, the CLI half).

The layers, in the order both apply them:

1. the contract (spotrun/contract/spec.py): the run file itself and SageMaker's limits on what it sets;
2. the target's rules (`check_target`): sources under the stack's bucket prefixes, its model package group, the
   methods the pipeline runs, weights to train (a bare parameter count only estimates);
3. the sources (spotrun/planner/sources.py): the model's config.json and the data's index.json;
4. the planner (spotrun/planner/estimate.py): fit, time limits, budget; then what the pipeline sends the trainer
   (its settings tree as hyperparameters, within CreateTrainingJob's limits: spotrun/planner/outputs.py
   `check_hyperparameters`).

The CLI knows the target when told the stage (`--stage`: the stack's outputs) or offline (`--bucket`, `--group`);
without one it says that layer 2 was not checked. Exit codes: spotrun/cli/exits.py. The estimate Lambda applies
layer 2 with the stage's own limits (`admit`: its maxima, allowed instance types, tracking servers and secrets).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..contract.hub_id import meant_hub_id
from ..contract.spec import ABSENT, ModelSpec, RunSpec, RunValidationError
from ..planner.catalog import regional_catalog, usd
from ..planner.sources import PLACEHOLDER_BUCKET
from ..seams import METHODS, PipelineSettings
from .hub import hub_prefix

DATASETS_PREFIX, MODELS_PREFIX = "datasets/", "models/"  # the training role reads only these (ArtifactStore)


THIS_MACHINE = ""  # Target.bucket of `spotrun local`: its sources are paths on this machine, not S3 URIs


@dataclass(frozen=True)
class Target:
    """The deployment a run is meant for: the stack's artifact bucket and model package group (bucket
    THIS_MACHINE: `spotrun local`, whose sources are local paths)."""

    bucket: str
    model_package_group: str

    def describe(self) -> str:
        return (f"the stage's rules (sources under s3://{self.bucket}/{DATASETS_PREFIX} and {MODELS_PREFIX}, "
                f"model package group {self.model_package_group}, methods {'/'.join(METHODS)}, weights "
                "to train)")


def _require_under(uri: str | None, target: Target, prefix: str, field_path: str) -> str:
    if target.bucket == THIS_MACHINE:  # spotrun.local.pipeline.load_run checked that the path exists
        if not uri or uri.startswith("s3://"):
            raise RunValidationError(field_path, uri, "a local path for `spotrun local` (runs with s3:// sources "
                                     "start on AWS with `spotrun start`)")
        return uri
    wanted = f"s3://{target.bucket}/{prefix}"
    if not uri or not uri.startswith(wanted):
        hint = ""
        if uri and uri.startswith(f"s3://{PLACEHOLDER_BUCKET}/"):
            hint = f"; replace the placeholder {PLACEHOLDER_BUCKET} with the stack's ArtifactBucket output"
        elif field_path == "model.source" and meant_hub_id(uri):
            hint = f", or a hub id: did you mean {meant_hub_id(uri)}?"
        raise RunValidationError(field_path, uri, f"an S3 URI under {wanted} (the training role reads only there)"
                                 + hint)
    return uri if uri.endswith("/") else uri + "/"


def hub_copy(model: ModelSpec, target: Target) -> str | None:
    """A hub id's copy in the stage (spotrun/pipeline/hub.py: what the preparation step fetches it into); any
    other source as it is. `spotrun local` fetches before it plans: a hub id reaching here locally is refused."""
    if model.hub is None:
        return model.source
    if target.bucket == THIS_MACHINE:
        raise RunValidationError("model.source", model.source, "a local model directory: `spotrun local` fetches a "
                                 "hub id into OUT/models/ before it plans (spotrun/local/pipeline.py)")
    return f"s3://{target.bucket}/{hub_prefix(model.hub)}"


def check_catalog(run: RunSpec, catalog: dict) -> None:
    """compute.instance_type is `auto` or a type of spotrun's catalog (the planner knows no other)."""
    wanted = run.compute.instance_type
    if wanted != "auto" and wanted not in catalog["instances"]:
        near = difflib.get_close_matches(wanted, list(catalog["instances"]), n=1, cutoff=0.85)
        meant = f" (did you mean {near[0]}?)" if near else ""  # a typo's answer first, before the whole list
        raise RunValidationError("compute.instance_type", wanted, f"auto or an instance type of spotrun's "
                                 f"catalog{meant}: " + ", ".join(sorted(catalog["instances"])))


def check_target(run: RunSpec, target: Target) -> tuple[str, str | None]:
    """The pipeline's rules for one deployment; returns (data URI, model URI or None) as channels take them."""
    if run.model.parameters is not None:
        raise RunValidationError("model.parameters", run.model.parameters, 'model.source (pretrained weights) or '
                                 'model.config with model.init="random": training needs weights (a bare count only '
                                 "estimates)")
    if run.model.init is None:
        raise RunValidationError("model.init", ABSENT, '"random" to train the inline model.config from random weights '
                                 "(an explicit choice), or a model.source holding pretrained weights to fine-tune")
    if run.training.method not in METHODS:
        raise RunValidationError("training.method", run.training.method, " or ".join(METHODS))
    if run.model_package_group not in (None, target.model_package_group):
        raise RunValidationError("registry.model_package_group", run.model_package_group,
                                 f"{target.model_package_group} (this stack's group) or nothing")
    data_uri = _require_under(run.data.source, target, DATASETS_PREFIX, "data.source")
    model_uri = _require_under(hub_copy(run.model, target), target, MODELS_PREFIX, "model.source") \
        if run.model.source else None
    return data_uri, model_uri


def validation_uri(run: RunSpec, target: Target) -> str | None:
    """data.validation as the `validation` channel takes it (under the datasets prefix), or None without it.
    A validation_fraction split travels inside the train channel (prepare's validation/ directory)."""
    if run.data.validation is None:
        return None
    return _require_under(run.data.validation, target, DATASETS_PREFIX, "data.validation")


def check_stage_limits(run: RunSpec, settings: PipelineSettings, running_executions: int | None) -> None:
    """The stage's maxima (stacks/config.py): the cap per run, instances per run, runs at once; and the tracking
    servers and W&B API key secrets a run may name."""
    where = f"stage {settings.stage or '?'}'s limit in stacks/config.py"
    if settings.max_usd_per_run and run.max_usd > settings.max_usd_per_run:
        raise RunValidationError("budget.max_usd", run.max_usd, f"at most {usd(settings.max_usd_per_run)} "
                                 f"(max_usd_per_run, {where})")
    count = run.compute.instance_count
    if settings.max_instances_per_run and count is not None and count > settings.max_instances_per_run:
        raise RunValidationError("compute.instance_count", count, f"at most {settings.max_instances_per_run} "
                                 f"(max_instances_per_run, {where})")
    uri = run.tracking.mlflow_uri
    if uri and uri not in settings.mlflow_tracking_servers:  # a job that tracks runs without network isolation
        listed = ", ".join(settings.mlflow_tracking_servers) or "none"
        raise RunValidationError("tracking.mlflow_uri", uri, f"one of the stage's tracking servers: {listed} "
                                 f"(mlflow_tracking_servers, {where})")
    secret = run.tracking.wandb_api_key_secret
    if secret and secret not in settings.wandb_api_key_secrets:  # the job's network opens, its role reads a secret
        listed = ", ".join(settings.wandb_api_key_secrets) or "none"
        raise RunValidationError("tracking.wandb_api_key_secret", secret, f"one of the stage's W&B API key secrets: "
                                 f"{listed} (wandb_api_key_secrets, {where})")
    if settings.max_concurrent_runs and running_executions is not None and \
            running_executions > settings.max_concurrent_runs:
        raise RunValidationError("run", f"{running_executions} running executions", f"at most "
                                 f"{settings.max_concurrent_runs} at once (max_concurrent_runs, {where}): start it "
                                 "when one has ended")


def deployment_catalog(catalog: dict, settings: PipelineSettings, run: RunSpec) -> dict:
    """The catalog as this deployment may use it: the region's prices, the stage's allowed instance types, and
    `auto` counts within the stage's instances per run."""
    regional = regional_catalog(catalog, settings.region)
    if settings.max_instances_per_run:
        regional["defaults"]["max_auto_instance_count"] = min(regional["defaults"]["max_auto_instance_count"],
                                                              settings.max_instances_per_run)
    allowed = settings.allowed_instance_types
    if allowed:
        wanted = run.compute.instance_type
        if wanted != "auto" and wanted not in allowed:
            raise RunValidationError("compute.instance_type", wanted,
                                     f"a type this stage allows: {', '.join(allowed)} (or auto)")
        regional["instances"] = {t: s for t, s in regional["instances"].items() if t in allowed}
    return regional


@dataclass(frozen=True)
class Admitted:
    """A run the stage admits: the catalog as the stage may use it and the channels' places (the data's, the
    model's or its hub copy's, the validation set's)."""

    catalog: dict
    data_uri: str
    model_uri: str | None
    validation_uri: str | None


def admit(run: RunSpec, settings: PipelineSettings, catalog: dict, running_executions: int | None) -> Admitted:
    """The stage's rules on a decoded run, before anything is read or made: its maxima, its instance types and
    every source's place (a hub id: its copy's)."""
    check_stage_limits(run, settings, running_executions)
    stage_catalog = deployment_catalog(catalog, settings, run)
    target = Target(settings.bucket, settings.model_package_group)
    data_uri, model_uri = check_target(run, target)
    return Admitted(stage_catalog, data_uri, model_uri, validation_uri(run, target))
